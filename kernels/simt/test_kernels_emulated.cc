// The emulated flavour of the test kernels: the same source as the nvcc flavour, compiled
// by the host compiler against kernels/simt/simt.h.
#include "kernels/simt/test_kernels.cu"  // NOLINT(bugprone-suspicious-include)
