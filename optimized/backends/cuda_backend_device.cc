// The device flavour of the CUDA backend ("cuda"): cuda_backend.cc against the nvcc-built
// kernels (kvp::cuda_kernels::dev), in the same library as the emulated flavour. Built when
// KVPROOF_HAS_CUDA.
#define KVP_CUDA_DEVICE_FLAVOUR 1
#include "optimized/backends/cuda_backend.cc"  // NOLINT(bugprone-suspicious-include)
