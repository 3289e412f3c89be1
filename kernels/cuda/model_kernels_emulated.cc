// The emulated flavour of the CUDA backend's kernels: the same source nvcc builds, compiled
// by the host compiler against the SIMT layer (kernels/simt/simt.h).
#include "kernels/cuda/model_kernels.cu"  // NOLINT(bugprone-suspicious-include)
