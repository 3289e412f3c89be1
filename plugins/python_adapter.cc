// The Python adapter: an attention plug-in (ABI version 4) whose kernel is a Python function,
// for `kvproof kernel-check --plugin python:FILE.py:FUNCTION` (docs/plugins.md, "Python
// kernels"). kvproof loads this library, calls kvp_python_plugin_configure() with the file (or
// module) and the function, and then uses it as any plug-in: the grid, the properties, the
// forked worker, crash and timeout handling are kernel-check's, unchanged.
//
// Why an embedded interpreter in a plug-in rather than a Python worker process speaking a
// protocol: every check kernel-check makes on a C kernel (guard zones around `out`, inputs
// unchanged, NaN poison in the pool, batch invariance, repeatability, crash and timeout in the
// forked worker) then holds for a Python kernel with no second implementation, because the
// Python function reads and writes the very buffers a C kernel would: the arrays it receives
// are NumPy views of kvproof's memory, not copies.
//
// The module declares the plug-in in a dict KVPROOF_PLUGIN:
//   {"name": str, "device": "host" | "cuda",
//    "kv_dtypes": ["f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"],   (a non-empty subset)
//    "kv_layouts": ["kvproof", "flashinfer-nhd", "flashinfer-hnd", "vllm"],
//    "supports": optional callable(shape) -> bool,
//    "sliding_window": optional bool (default False: no windowed call; True: every window),
//    "softcap": optional bool (default False: no soft-capped call; True: every cap)}
// and FUNCTION(args) computes args.out in place; an exception is the case's run-error, with
// its traceback. `args` (a types.SimpleNamespace): the shape's fields (kv_dtype and kv_layout
// as the names above), scale, window (ABI version 3: 0, or the sliding window), softcap (version 4: 0.0, or
// the cap c: scores x become c * tanh(x / c) after the scale), and arrays: query and out float32
// [T][H][D]; query_start, token_seq, positions, context_lens int32; block_tables int32 [S][max_blocks_per_seq]; k_cache
// and v_cache in the layout's shape (float32, float16, uint16 holding bf16 bits, or uint8 holding fp8 codes); kv_cache,
// the combined array of a FlashInfer layout (None otherwise); k_scale and v_scale float32 [num_kv_heads] for fp8 (None
// otherwise). Host kernels get NumPy arrays; device kernels get objects with __cuda_array_interface__ (torch, CuPy,
// Numba, JAX and Triton read them) on the stream in args.stream (an integer).
#include <Python.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvproof/attention_plugin.h"

namespace {

kvp_attention_plugin g_descriptor{};
std::string g_name;
PyObject* g_function = nullptr;   // owned
PyObject* g_supports = nullptr;   // owned, or null
PyObject* g_numpy = nullptr;      // owned
PyObject* g_namespace = nullptr;  // types.SimpleNamespace, owned

const char* const kDtypeNames[] = {"f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"};
const char* const kLayoutNames[] = {"kvproof", "flashinfer-nhd", "flashinfer-hnd", "vllm"};
const char* const kNumpyDtypes[] = {"float32", "float16", "uint16", "uint8", "uint8"};
const int64_t kElementBytes[] = {4, 2, 2, 1, 1};

void set_error(char* err, size_t err_len, const std::string& what) {
  if (err == nullptr || err_len == 0) return;
  std::snprintf(err, err_len, "%s", what.c_str());
}

// The pending Python exception as text, with its traceback (and cleared).
std::string exception_text() {
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  std::string text = "Python exception";
  PyObject* module = PyImport_ImportModule("traceback");
  if (module != nullptr && type != nullptr) {
    PyObject* lines = PyObject_CallMethod(module, "format_exception", "OOO", type, value != nullptr ? value : Py_None,
                                          trace != nullptr ? trace : Py_None);
    if (lines != nullptr) {
      PyObject* empty = PyUnicode_FromString("");
      PyObject* joined = empty != nullptr ? PyUnicode_Join(empty, lines) : nullptr;
      if (joined != nullptr) {
        if (const char* utf8 = PyUnicode_AsUTF8(joined)) text = utf8;
        Py_DECREF(joined);
      }
      Py_XDECREF(empty);
      Py_DECREF(lines);
    }
  }
  Py_XDECREF(module);
  if (text == "Python exception" && value != nullptr) {
    if (PyObject* str = PyObject_Str(value)) {
      if (const char* utf8 = PyUnicode_AsUTF8(str)) text = std::string("Python exception: ") + utf8;
      Py_DECREF(str);
    }
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  PyErr_Clear();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

// The index of `name` in `names`, or -1.
template <std::size_t N>
int index_of(const char* const (&names)[N], const std::string& name) {
  for (std::size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<int>(i);
  return -1;
}

// A bitmask from a list of names; an error names the key and the bad entry.
bool mask_from_list(PyObject* list, const char* key, const char* const* names, std::size_t count, uint32_t& mask,
                    std::string& why) {
  mask = 0;
  if (list == nullptr || !PyList_Check(list) || PyList_Size(list) == 0) {
    why = std::string("KVPROOF_PLUGIN[\"") + key + "\"]: not a non-empty list";
    return false;
  }
  for (Py_ssize_t i = 0; i < PyList_Size(list); ++i) {
    PyObject* item = PyList_GetItem(list, i);
    const char* s = PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : nullptr;
    bool found = false;
    for (std::size_t k = 0; s != nullptr && k < count; ++k)
      if (std::strcmp(s, names[k]) == 0) {
        mask |= 1u << k;
        found = true;
      }
    if (!found) {
      std::string known;
      for (std::size_t k = 0; k < count; ++k) known += std::string(k ? ", " : "") + names[k];
      why = std::string("KVPROOF_PLUGIN[\"") + key + "\"][" + std::to_string(i) + "]: not one of " + known;
      return false;
    }
  }
  return true;
}

// The module: a path ending in .py is loaded from that file; anything else is imported by name.
PyObject* import_kernel_module(const std::string& where) {
  if (where.size() > 3 && where.compare(where.size() - 3, 3, ".py") == 0) {
    PyObject* util = PyImport_ImportModule("importlib.util");
    if (util == nullptr) return nullptr;
    std::string stem = where.substr(where.find_last_of('/') == std::string::npos ? 0 : where.find_last_of('/') + 1);
    stem = stem.substr(0, stem.size() - 3);
    PyObject* spec = PyObject_CallMethod(util, "spec_from_file_location", "ss", stem.c_str(), where.c_str());
    PyObject* module = nullptr;
    if (spec != nullptr && spec != Py_None) {
      module = PyObject_CallMethod(util, "module_from_spec", "O", spec);
      if (module != nullptr) {
        PyObject* loader = PyObject_GetAttrString(spec, "loader");
        PyObject* done = loader != nullptr ? PyObject_CallMethod(loader, "exec_module", "O", module) : nullptr;
        Py_XDECREF(loader);
        if (done == nullptr) Py_CLEAR(module);
        Py_XDECREF(done);
      }
    } else if (spec == Py_None) {
      PyErr_SetString(PyExc_ImportError, ("cannot load " + where).c_str());
    }
    Py_XDECREF(spec);
    Py_DECREF(util);
    return module;
  }
  return PyImport_ImportModule(where.c_str());
}

PyObject* shape_dict(const kvp_attention_shape& s) {
  PyObject* d = PyDict_New();
  auto put = [d](const char* key, PyObject* value) {
    PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
  };
  put("num_heads", PyLong_FromLong(s.num_heads));
  put("num_kv_heads", PyLong_FromLong(s.num_kv_heads));
  put("head_dim", PyLong_FromLong(s.head_dim));
  put("block_size", PyLong_FromLong(s.block_size));
  put("kv_dtype", PyUnicode_FromString(s.kv_dtype >= 0 && s.kv_dtype < 5 ? kDtypeNames[s.kv_dtype] : "?"));
  put("kv_layout", PyUnicode_FromString(s.kv_layout >= 0 && s.kv_layout < 4 ? kLayoutNames[s.kv_layout] : "?"));
  put("num_seqs", PyLong_FromLong(s.num_seqs));
  put("num_tokens", PyLong_FromLong(s.num_tokens));
  put("max_context_len", PyLong_FromLong(s.max_context_len));
  put("max_blocks_per_seq", PyLong_FromLong(s.max_blocks_per_seq));
  put("num_blocks", PyLong_FromLongLong(s.num_blocks));
  return d;
}

// A device array: an object with __cuda_array_interface__ (version 3) over `ptr`.
PyObject* cuda_array(const void* ptr, const std::vector<int64_t>& shape, const char* typestr, bool read_only,
                     void* stream) {
  PyObject* dims = PyTuple_New(static_cast<Py_ssize_t>(shape.size()));
  for (std::size_t i = 0; i < shape.size(); ++i)
    PyTuple_SetItem(dims, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(shape[i]));
  PyObject* iface =
      Py_BuildValue("{s:N,s:s,s:(KO),s:i,s:O,s:K}", "shape", dims, "typestr", typestr, "data",
                    static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ptr)), read_only ? Py_True : Py_False,
                    "version", 3, "strides", Py_None, "stream",
                    static_cast<unsigned long long>(
                        reinterpret_cast<uintptr_t>(stream) == 0 ? 1 : reinterpret_cast<uintptr_t>(stream)));
  if (iface == nullptr) return nullptr;
  PyObject* kwargs = Py_BuildValue("{s:N}", "__cuda_array_interface__", iface);
  PyObject* empty = PyTuple_New(0);
  PyObject* obj = kwargs != nullptr ? PyObject_Call(g_namespace, empty, kwargs) : nullptr;
  Py_XDECREF(empty);
  Py_XDECREF(kwargs);
  return obj;
}

// A NumPy array over `ptr` (no copy), of `dtype` and `shape`.
PyObject* host_array(const void* ptr, const std::vector<int64_t>& shape, const char* dtype, int64_t element_bytes) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  PyObject* view = PyMemoryView_FromMemory(static_cast<char*>(const_cast<void*>(ptr)),
                                           static_cast<Py_ssize_t>(n * element_bytes), PyBUF_WRITE);
  if (view == nullptr) return nullptr;
  PyObject* flat = PyObject_CallMethod(g_numpy, "frombuffer", "Os", view, dtype);
  Py_DECREF(view);
  if (flat == nullptr) return nullptr;
  PyObject* dims = PyTuple_New(static_cast<Py_ssize_t>(shape.size()));
  for (std::size_t i = 0; i < shape.size(); ++i)
    PyTuple_SetItem(dims, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(shape[i]));
  PyObject* shaped = PyObject_CallMethod(flat, "reshape", "O", dims);
  Py_DECREF(dims);
  Py_DECREF(flat);
  return shaped;
}

const char* cuda_typestr(const char* numpy_dtype) {
  if (std::strcmp(numpy_dtype, "float32") == 0) return "<f4";
  if (std::strcmp(numpy_dtype, "float16") == 0) return "<f2";
  if (std::strcmp(numpy_dtype, "uint16") == 0) return "<u2";
  if (std::strcmp(numpy_dtype, "int32") == 0) return "<i4";
  return "|u1";
}

int supports(const kvp_attention_shape* shape) {
  if (g_supports == nullptr) return 1;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* d = shape_dict(*shape);
  PyObject* empty = PyTuple_New(0);
  PyObject* ns = PyObject_Call(g_namespace, empty, d);
  PyObject* result = ns != nullptr ? PyObject_CallFunctionObjArgs(g_supports, ns, nullptr) : nullptr;
  int yes = 0;
  if (result == nullptr) {
    std::fprintf(stderr, "python plug-in %s: supports() raised:\n%s\n", g_name.c_str(), exception_text().c_str());
  } else {
    yes = PyObject_IsTrue(result) == 1;
  }
  Py_XDECREF(result);
  Py_XDECREF(ns);
  Py_XDECREF(empty);
  Py_XDECREF(d);
  PyGILState_Release(gil);
  return yes;
}

// A kernel declaring "sliding_window": True takes every window of the shapes supports() takes.
int supports_window(const kvp_attention_shape* shape, int32_t window) { return window > 0 && supports(shape); }
// A kernel declaring "softcap": True takes every cap of the shapes supports() takes.
int supports_softcap(const kvp_attention_shape* shape, float softcap) { return softcap > 0.0f && supports(shape); }

int run(const kvp_attention_args* a, char* err, size_t err_len) {
  PyGILState_STATE gil = PyGILState_Ensure();
  const kvp_attention_shape& s = a->shape;
  const bool device = g_descriptor.device == KVP_DEVICE_CUDA;
  const int dt = s.kv_dtype;
  const char* kv_numpy = kNumpyDtypes[dt];
  const int64_t T = s.num_tokens, H = s.num_heads, D = s.head_dim, S = s.num_seqs, G = s.num_kv_heads;
  const int64_t nb = s.num_blocks, bs = s.block_size, mb = s.max_blocks_per_seq;
  auto array = [&](const void* p, std::vector<int64_t> shape, const char* dtype, int64_t bytes, bool read_only) {
    return device ? cuda_array(p, shape, cuda_typestr(dtype), read_only, a->stream)
                  : host_array(p, shape, dtype, bytes);
  };
  PyObject* kw = shape_dict(s);
  bool ok = kw != nullptr;
  auto put = [&](const char* key, PyObject* value) {
    if (value == nullptr) {
      ok = false;
      return;
    }
    PyDict_SetItemString(kw, key, value);
    Py_DECREF(value);
  };
  put("scale", PyFloat_FromDouble(a->scale));
  put("window", PyLong_FromLong(a->window));
  put("softcap", PyFloat_FromDouble(a->softcap));
  put("stream", PyLong_FromUnsignedLongLong(reinterpret_cast<uintptr_t>(a->stream)));
  put("query", array(a->query, {T, H, D}, "float32", 4, true));
  put("out", array(a->out, {T, H, D}, "float32", 4, false));
  put("query_start", array(a->query_start, {S + 1}, "int32", 4, true));
  put("token_seq", array(a->token_seq, {T}, "int32", 4, true));
  put("positions", array(a->positions, {T}, "int32", 4, true));
  put("context_lens", array(a->context_lens, {S}, "int32", 4, true));
  put("block_tables", array(a->block_tables, {S, mb}, "int32", 4, true));
  const int64_t eb = kElementBytes[dt];
  switch (s.kv_layout) {
    case KVP_LAYOUT_KVPROOF:
      put("k_cache", array(a->k_cache, {nb, bs, G, D}, kv_numpy, eb, true));
      put("v_cache", array(a->v_cache, {nb, bs, G, D}, kv_numpy, eb, true));
      Py_INCREF(Py_None);
      put("kv_cache", Py_None);
      break;
    case KVP_LAYOUT_FLASHINFER_NHD:
    case KVP_LAYOUT_FLASHINFER_HND: {
      const bool nhd = s.kv_layout == KVP_LAYOUT_FLASHINFER_NHD;
      const std::vector<int64_t> half = nhd ? std::vector<int64_t>{bs, G, D} : std::vector<int64_t>{G, bs, D};
      std::vector<int64_t> whole{nb, 2};
      whole.insert(whole.end(), half.begin(), half.end());
      PyObject* kv = array(a->k_cache, whole, kv_numpy, eb, true);
      if (kv != nullptr && !device) {
        PyObject* index0 = Py_BuildValue("(N,i)", PySlice_New(nullptr, nullptr, nullptr), 0);
        PyObject* index1 = Py_BuildValue("(N,i)", PySlice_New(nullptr, nullptr, nullptr), 1);
        put("k_cache", index0 != nullptr ? PyObject_GetItem(kv, index0) : nullptr);
        put("v_cache", index1 != nullptr ? PyObject_GetItem(kv, index1) : nullptr);
        Py_XDECREF(index0);
        Py_XDECREF(index1);
      } else {
        // Device: the combined array only (a consumer slices it).
        Py_INCREF(Py_None);
        put("k_cache", Py_None);
        Py_INCREF(Py_None);
        put("v_cache", Py_None);
      }
      put("kv_cache", kv);
      break;
    }
    default: {  // vLLM
      const int64_t x = 16 / eb;
      put("k_cache", array(a->k_cache, {nb, G, D / x, bs, x}, kv_numpy, eb, true));
      put("v_cache", array(a->v_cache, {nb, G, D, bs}, kv_numpy, eb, true));
      Py_INCREF(Py_None);
      put("kv_cache", Py_None);
    }
  }
  if (a->k_scale != nullptr) {
    put("k_scale", array(a->k_scale, {G}, "float32", 4, true));
    put("v_scale", array(a->v_scale, {G}, "float32", 4, true));
  } else {
    Py_INCREF(Py_None);
    put("k_scale", Py_None);
    Py_INCREF(Py_None);
    put("v_scale", Py_None);
  }
  int status = 0;
  if (!ok) {
    set_error(err, err_len, "python plug-in " + g_name + ": could not build the arguments: " + exception_text());
    status = 1;
  } else {
    PyObject* empty = PyTuple_New(0);
    PyObject* ns = PyObject_Call(g_namespace, empty, kw);
    PyObject* result = ns != nullptr ? PyObject_CallFunctionObjArgs(g_function, ns, nullptr) : nullptr;
    if (result == nullptr) {
      set_error(err, err_len, exception_text());
      status = 1;
    }
    Py_XDECREF(result);
    Py_XDECREF(ns);
    Py_XDECREF(empty);
  }
  Py_XDECREF(kw);
  PyGILState_Release(gil);
  return status;
}

}  // namespace

// Loads the kernel: `where` is a file ending in .py or a module name on sys.path, `function`
// the callable in it. 0 on success; otherwise nonzero with the reason (a Python error with its
// traceback) in err. Called once, before kvp_attention_plugin_v4().
extern "C" __attribute__((visibility("default"))) int kvp_python_plugin_configure(const char* where,
                                                                                  const char* function, char* err,
                                                                                  size_t err_len) {
  if (Py_IsInitialized()) {
    set_error(err, err_len, "the Python adapter is configured once per process");
    return 1;
  }
  // NumPy's BLAS threads would not survive the worker's fork: one thread each.
  for (const char* var : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}) setenv(var, "1", 0);
  // Extension modules (NumPy's) resolve the interpreter's symbols globally; this library was
  // loaded RTLD_LOCAL, so make libpython global.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&Py_Initialize), &info) != 0 && info.dli_fname != nullptr)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  // The interpreter this library was built against, with its own standard library: the
  // program name is this process's executable, so that CPython finds no "python3" on PATH (a
  // pyenv or venv one would bring its prefix) and falls back to its built-in prefix.
  // PYTHONPATH and the user's site-packages still apply. KVPROOF_PYTHON names a python
  // executable to stand for instead: its virtual environment's packages are then the ones
  // imported (a venv of the same Python version as the adapter's).
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0;  // a kernel's SIGINT and faults stay the process's
  char exe[4096];
  const char* stand_in = std::getenv("KVPROOF_PYTHON");
  const ssize_t exe_len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (stand_in != nullptr && stand_in[0] != '\0') {
    PyConfig_SetBytesString(&config, &config.program_name, stand_in);
  } else if (exe_len > 0) {
    exe[exe_len] = '\0';
    PyConfig_SetBytesString(&config, &config.program_name, exe);
  }
  const PyStatus init = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(init)) {
    set_error(err, err_len,
              std::string("cannot start the Python interpreter: ") +
                  (init.err_msg != nullptr ? init.err_msg : "Py_InitializeFromConfig failed"));
    return 1;
  }
  std::string why;
  PyObject* module = nullptr;
  PyObject* spec = nullptr;
  g_numpy = PyImport_ImportModule("numpy");
  PyObject* types = PyImport_ImportModule("types");
  if (g_numpy == nullptr || types == nullptr) {
    why = "cannot import numpy (Debian: apt install python3-numpy): " + exception_text();
  } else {
    g_namespace = PyObject_GetAttrString(types, "SimpleNamespace");
    // A file's directory goes first on sys.path, as `python FILE.py` does.
    std::string w = where;
    if (const auto slash = w.find_last_of('/');
        slash != std::string::npos && w.size() > 3 && w.compare(w.size() - 3, 3, ".py") == 0) {
      PyObject* path = PySys_GetObject("path");
      PyObject* dir = PyUnicode_FromString(w.substr(0, slash).c_str());
      if (path != nullptr && dir != nullptr) PyList_Insert(path, 0, dir);
      Py_XDECREF(dir);
    }
    module = import_kernel_module(w);
    if (module == nullptr) {
      why = "cannot import " + w + ":\n" + exception_text();
    } else {
      g_function = PyObject_GetAttrString(module, function);
      spec = PyObject_GetAttrString(module, "KVPROOF_PLUGIN");
      if (g_function == nullptr || !PyCallable_Check(g_function)) {
        PyErr_Clear();
        why = w + ": no function " + function;
      } else if (spec == nullptr || !PyDict_Check(spec)) {
        PyErr_Clear();
        why = w + ": no dict KVPROOF_PLUGIN (name, device, kv_dtypes, kv_layouts; docs/plugins.md)";
      }
    }
  }
  if (why.empty()) {
    PyObject* name = PyDict_GetItemString(spec, "name");
    PyObject* device = PyDict_GetItemString(spec, "device");
    const char* device_name = device != nullptr && PyUnicode_Check(device) ? PyUnicode_AsUTF8(device) : nullptr;
    if (name == nullptr || !PyUnicode_Check(name) || PyUnicode_GetLength(name) == 0) {
      why = "KVPROOF_PLUGIN[\"name\"]: not a non-empty string";
    } else if (device_name == nullptr ||
               (std::strcmp(device_name, "host") != 0 && std::strcmp(device_name, "cuda") != 0)) {
      why = "KVPROOF_PLUGIN[\"device\"]: not \"host\" or \"cuda\"";
    } else {
      g_name = PyUnicode_AsUTF8(name);
      g_descriptor.abi_version = KVP_ATTENTION_PLUGIN_ABI_VERSION;
      g_descriptor.name = g_name.c_str();
      g_descriptor.device = std::strcmp(device_name, "cuda") == 0 ? KVP_DEVICE_CUDA : KVP_DEVICE_HOST;
      if (mask_from_list(PyDict_GetItemString(spec, "kv_dtypes"), "kv_dtypes", kDtypeNames, 5, g_descriptor.kv_dtypes,
                         why) &&
          mask_from_list(PyDict_GetItemString(spec, "kv_layouts"), "kv_layouts", kLayoutNames, 4,
                         g_descriptor.kv_layouts, why)) {
        if (PyObject* s = PyDict_GetItemString(spec, "supports"); s != nullptr && s != Py_None) {
          if (!PyCallable_Check(s)) {
            why = "KVPROOF_PLUGIN[\"supports\"]: not callable";
          } else {
            Py_INCREF(s);
            g_supports = s;
          }
        }
        g_descriptor.supports = g_supports != nullptr ? supports : nullptr;
        g_descriptor.run = run;
        if (PyObject* w = PyDict_GetItemString(spec, "sliding_window"); w != nullptr && w != Py_None) {
          if (!PyBool_Check(w)) {
            why = "KVPROOF_PLUGIN[\"sliding_window\"]: not True or False";
          } else if (w == Py_True) {
            g_descriptor.supports_window = supports_window;
          }
        }
        if (PyObject* c = PyDict_GetItemString(spec, "softcap"); c != nullptr && c != Py_None) {
          if (!PyBool_Check(c)) {
            why = "KVPROOF_PLUGIN[\"softcap\"]: not True or False";
          } else if (c == Py_True) {
            g_descriptor.supports_softcap = supports_softcap;
          }
        }
      }
    }
  }
  Py_XDECREF(spec);
  Py_XDECREF(module);
  Py_XDECREF(types);
  // Released: kernel-check's worker forks this process, and run() takes it again.
  PyEval_SaveThread();
  if (!why.empty()) {
    set_error(err, err_len, why);
    g_descriptor = kvp_attention_plugin{};
    return 1;
  }
  return 0;
}

extern "C" __attribute__((visibility("default"))) const kvp_attention_plugin* kvp_attention_plugin_v4(void) {
  return g_descriptor.run != nullptr ? &g_descriptor : nullptr;
}
