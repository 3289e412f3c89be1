/* A host-memory stand-in for the CUDA runtime calls kernel-check makes for a CUDA plug-in
 * (kernel_check/cuda_runtime.h), loaded through KVPROOF_CUDART in the tests: "device" memory is
 * host heap memory filled with the word 0x7FA07FA0 (a NaN as f32, f16 and bf16, as the SIMT
 * emulation fills cudaMalloc memory), copies are memmove, there is one stream. With the
 * host-computing plug-ins built declaring KVP_DEVICE_CUDA (planted.c, KVP_PLANTED_DEVICE), it
 * runs kernel-check's device path on a machine without a GPU.
 *
 * KVP_FAKE_CUDART_DEVICES=0 in the environment: cudaGetDeviceCount fails as the real runtime
 * does on a machine without a device (cudaErrorNoDevice). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

enum { kSuccess = 0, kMemoryAllocation = 2, kNoDevice = 100, kInvalidResourceHandle = 400 };

static int stream_token;

EXPORT int cudaGetDeviceCount(int* count) {
  const char* devices = getenv("KVP_FAKE_CUDART_DEVICES");
  if (devices != NULL && strcmp(devices, "0") == 0) {
    *count = 0;
    return kNoDevice;
  }
  *count = 1;
  return kSuccess;
}

EXPORT int cudaMalloc(void** ptr, size_t bytes) {
  const size_t words = (bytes + 3) / 4;
  uint32_t* p = (uint32_t*)malloc(words * 4);
  if (p == NULL) return kMemoryAllocation;
  for (size_t i = 0; i < words; ++i) p[i] = 0x7FA07FA0u;
  *ptr = p;
  return kSuccess;
}

EXPORT int cudaFree(void* ptr) {
  free(ptr);
  return kSuccess;
}

EXPORT int cudaMemcpy(void* dst, const void* src, size_t bytes, int kind) {
  (void)kind;
  memmove(dst, src, bytes);
  return kSuccess;
}

EXPORT int cudaStreamCreate(void** stream) {
  *stream = &stream_token;
  return kSuccess;
}

EXPORT int cudaStreamSynchronize(void* stream) { return stream == &stream_token ? kSuccess : kInvalidResourceHandle; }

EXPORT int cudaStreamDestroy(void* stream) { return stream == &stream_token ? kSuccess : kInvalidResourceHandle; }

EXPORT const char* cudaGetErrorString(int error) {
  switch (error) {
    case kSuccess: return "no error";
    case kMemoryAllocation: return "out of memory";
    case kNoDevice: return "no CUDA-capable device is detected";
    default: return "invalid resource handle";
  }
}
