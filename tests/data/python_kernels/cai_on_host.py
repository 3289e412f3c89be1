"""A "device" Python kernel for kernel-check's device path without a GPU: declared "cuda", run
with KVPROOF_CUDART pointing at plugins/fake_cudart.c (whose "device" memory is host memory), it
reads each array through its __cuda_array_interface__ (version 3) as a consumer library would,
checks the interface (typestr, shape, strides, read-only flags, stream), wraps the pointer as
a NumPy array and runs the NumPy kernel (plugins/python/numpy_paged_decode.py) on them. Used by
ctest kernel_check.python; on a real GPU the pointers are device memory and this kernel must
not run (reading them from the host would fault)."""
import ctypes
import importlib.util
import os
import types

import numpy as np

_spec = importlib.util.spec_from_file_location(
    "numpy_paged_decode",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "plugins", "python", "numpy_paged_decode.py"))
_kernel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kernel)

KVPROOF_PLUGIN = dict(_kernel.KVPROOF_PLUGIN, name="cai-on-host", device="cuda")

_TYPES = {"<f4": np.float32, "<f2": np.float16, "<u2": np.uint16, "<i4": np.int32, "|u1": np.uint8}


def _as_numpy(obj, name, read_only):
    cai = obj.__cuda_array_interface__
    assert cai["version"] == 3, f"{name}: version {cai['version']}"
    assert cai["strides"] is None, f"{name}: strides {cai['strides']}"
    ptr, ro = cai["data"]
    assert ro == read_only, f"{name}: read-only flag {ro}, want {read_only}"
    assert isinstance(cai["stream"], int) and cai["stream"] != 0, f"{name}: stream {cai['stream']}"
    dtype = np.dtype(_TYPES[cai["typestr"]])
    n = int(np.prod(cai["shape"]))
    buf = (ctypes.c_char * (n * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(buf, dtype=dtype).reshape(cai["shape"])


def paged_attention(args):
    a = dict(vars(args))
    for name in ("query", "query_start", "token_seq", "positions", "context_lens", "block_tables", "out"):
        a[name] = _as_numpy(a[name], name, read_only=name != "out")
    if args.kv_layout in ("flashinfer-nhd", "flashinfer-hnd"):
        assert args.k_cache is None and args.v_cache is None, "device FlashInfer layouts: kv_cache only"
        kv = _as_numpy(args.kv_cache, "kv_cache", True)
        a["k_cache"], a["v_cache"] = kv[:, 0], kv[:, 1]
    else:
        a["k_cache"] = _as_numpy(args.k_cache, "k_cache", True)
        a["v_cache"] = _as_numpy(args.v_cache, "v_cache", True)
    if args.k_scale is not None:
        a["k_scale"] = _as_numpy(args.k_scale, "k_scale", True)
        a["v_scale"] = _as_numpy(args.v_scale, "v_scale", True)
    _kernel.paged_attention(types.SimpleNamespace(**a))
