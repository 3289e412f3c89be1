#include "kernel_check/attention_plugin_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace kvp::verify {
namespace {

// The dtypes each ABI version names (index: the version).
constexpr uint32_t kV1Dtypes = KVP_DTYPE_BIT(KVP_KV_F32) | KVP_DTYPE_BIT(KVP_KV_F16) | KVP_DTYPE_BIT(KVP_KV_BF16);
constexpr uint32_t kV2Dtypes = kV1Dtypes | KVP_DTYPE_BIT(KVP_KV_FP8_E4M3) | KVP_DTYPE_BIT(KVP_KV_FP8_E5M2);
constexpr uint32_t kKnownLayouts = KVP_LAYOUT_BIT(KVP_LAYOUT_KVPROOF) | KVP_LAYOUT_BIT(KVP_LAYOUT_FLASHINFER_NHD) |
                                   KVP_LAYOUT_BIT(KVP_LAYOUT_FLASHINFER_HND) | KVP_LAYOUT_BIT(KVP_LAYOUT_VLLM);

// Why the descriptor, returned by the entry point of ABI version `entry_version`, is unusable,
// or empty.
std::string descriptor_problem(const kvp_attention_plugin& d, uint32_t entry_version) {
  if (d.abi_version != entry_version)
    return "built for attention-plugin ABI version " + std::to_string(d.abi_version) + ", but exports the version " +
           std::to_string(entry_version) + " entry point; this kvproof speaks versions 1 to " +
           std::to_string(KVP_ATTENTION_PLUGIN_ABI_VERSION);
  if (d.name == nullptr || d.name[0] == '\0') return "bad descriptor: no name";
  if (d.run == nullptr) return "bad descriptor: run is NULL";
  if (d.device != KVP_DEVICE_HOST && d.device != KVP_DEVICE_CUDA)
    return "bad descriptor: unknown device " + std::to_string(d.device);
  if (d.kv_dtypes == 0) return "bad descriptor: declares no KV dtype";
  if ((d.kv_dtypes & ~(entry_version == 1 ? kV1Dtypes : kV2Dtypes)) != 0)
    return "bad descriptor: unknown KV dtype bits in kv_dtypes for ABI version " + std::to_string(entry_version);
  if (d.kv_layouts == 0) return "bad descriptor: declares no KV layout";
  if ((d.kv_layouts & ~kKnownLayouts) != 0) return "bad descriptor: unknown layout bits in kv_layouts";
  return "";
}

}  // namespace

AttentionPlugin::~AttentionPlugin() {
  if (handle_ != nullptr) dlclose(handle_);
}

std::string python_adapter_path() {
  if (const char* env = std::getenv("KVPROOF_PYTHON_ADAPTER"); env != nullptr && env[0] != '\0') return env;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "kvp_python_adapter.so";
  std::string dir(exe, static_cast<std::size_t>(n));
  dir = dir.substr(0, dir.find_last_of('/'));
  return dir.substr(0, dir.find_last_of('/')) + "/plugins/kvp_python_adapter.so";
}

Result<std::unique_ptr<AttentionPlugin>> AttentionPlugin::load(const std::string& path) {
  auto error = [&path](const std::string& why) { return Status::error("attention plug-in " + path + ": " + why); };
  const bool python = path.rfind("python:", 0) == 0;
  std::string library = path, where, function = "paged_attention";
  if (python) {
    where = path.substr(7);
    const auto colon = where.find_last_of(':');
    if (colon != std::string::npos && where.find('/', colon) == std::string::npos) {
      function = where.substr(colon + 1);
      where = where.substr(0, colon);
    }
    if (where.empty() || function.empty()) return error("want python:FILE.py:FUNCTION or python:MODULE:FUNCTION");
    library = python_adapter_path();
  }
  struct stat info {};
  if (python && where.size() > 3 && where.compare(where.size() - 3, 3, ".py") == 0 && stat(where.c_str(), &info) != 0)
    return error(where + ": no such file");
  if (stat(library.c_str(), &info) != 0)
    return error(python ? "the Python adapter " + library +
                              " is not there (built where CPython's python3-embed is: Debian python3-dev; "
                              "KVPROOF_PYTHON_ADAPTER names another)"
                        : std::string("no such file"));
  // dlopen searches the library path for a bare name; a plug-in is named by its path.
  const std::string open_path = library.find('/') == std::string::npos ? "./" + library : library;
  void* handle = dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return error(std::string("cannot load: ") + (why != nullptr ? why : "dlopen failed"));
  }
  dlerror();
  if (python) {
    using Configure = int (*)(const char*, const char*, char*, size_t);
    void* symbol = dlsym(handle, "kvp_python_plugin_configure");
    if (symbol == nullptr) {
      dlclose(handle);
      return error(library + ": no kvp_python_plugin_configure (not kvproof's Python adapter)");
    }
    Configure configure;
    std::memcpy(&configure, &symbol, sizeof configure);
    std::string why(8192, '\0');
    if (configure(where.c_str(), function.c_str(), why.data(), why.size()) != 0) {
      // The interpreter stays loaded (CPython cannot be unloaded safely).
      return error(why.c_str());
    }
  }
  // The newest entry point first, then those of libraries built for earlier versions.
  uint32_t entry_version = 0;
  const char* entry_name = nullptr;
  void* symbol = nullptr;
  const std::pair<uint32_t, const char*> entries[] = {{KVP_ATTENTION_PLUGIN_ABI_VERSION, KVP_ATTENTION_PLUGIN_ENTRY},
                                                      {3, KVP_ATTENTION_PLUGIN_ENTRY_V3},
                                                      {2, KVP_ATTENTION_PLUGIN_ENTRY_V2},
                                                      {1, KVP_ATTENTION_PLUGIN_ENTRY_V1}};
  for (const auto& [version, name] : entries) {
    symbol = dlsym(handle, name);
    if (symbol != nullptr) {
      entry_version = version;
      entry_name = name;
      break;
    }
  }
  if (symbol == nullptr) {
    dlclose(handle);
    return error(std::string("no entry point ") + KVP_ATTENTION_PLUGIN_ENTRY + " (nor " +
                 KVP_ATTENTION_PLUGIN_ENTRY_V3 + ", " + KVP_ATTENTION_PLUGIN_ENTRY_V2 + " or " +
                 KVP_ATTENTION_PLUGIN_ENTRY_V1 + "; export it with extern \"C\" and default visibility)");
  }
  kvp_attention_plugin_entry_fn entry;
  static_assert(sizeof entry == sizeof symbol);
  std::memcpy(&entry, &symbol, sizeof entry);
  const kvp_attention_plugin* descriptor = entry();
  if (descriptor == nullptr) {
    dlclose(handle);
    return error(std::string(entry_name) + " returned NULL");
  }
  if (std::string problem = descriptor_problem(*descriptor, entry_version); !problem.empty()) {
    dlclose(handle);
    return error(problem);
  }
  return std::unique_ptr<AttentionPlugin>(new AttentionPlugin(path, handle, descriptor));
}

}  // namespace kvp::verify
