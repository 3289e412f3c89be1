// KVP_HOST_DEVICE marks functions compiled for both the host and CUDA devices.
#pragma once

#if defined(__CUDACC__)
#define KVP_HOST_DEVICE __host__ __device__
#else
#define KVP_HOST_DEVICE
#endif
