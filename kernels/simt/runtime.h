// The CUDA runtime calls kvproof's kernels and backends use, for both build flavours.
//
// Under nvcc this header is <cuda_runtime.h> and nothing else. For the host compiler it
// declares the same names (cudaMalloc, cudaMemcpy, streams, events, cudaGetLastError, ...)
// implemented by the SIMT emulation layer (library kvp_simt), so host code that allocates,
// copies and launches is written once. Only the subset below exists; a missing call is a
// compile error in the emulated flavour, never a silent no-op.
//
// Emulation semantics (where they differ from a GPU):
//   - Device memory is host heap memory of exactly the requested size (so ASan sees any
//     overrun); a "device pointer" can be dereferenced on the host, which a GPU would not
//     allow: host code must still copy through cudaMemcpy to stay portable.
//   - cudaMalloc fills the allocation with the 32-bit word 0x7FA07FA0 (bytes A0 7F A0 7F):
//     read as float it is a signalling NaN, read as half or bfloat16 each half is a NaN,
//     read as int32 it is 2141224864. An uninitialised read therefore shows in the results,
//     as compute-sanitizer's initcheck would report it on the GPU. cudaMallocHost memory is
//     not filled (it is host memory on the GPU too).
//   - Streams and events exist as handles; every call is synchronous (a launch returns when
//     the kernel has finished), so stream ordering holds trivially. Events record host time.
//   - Errors are not sticky: a failed launch sets the thread's last error (cudaGetLastError
//     returns and clears it) and kvp::simt::last_error_message() says what went wrong, naming
//     the kernel and block.
//   - Both flavours link into one program (kvproof has cpu, cuda-emu and cuda): this header
//     and <cuda_runtime.h> are never included in the same translation unit, and everything
//     declared here lives in an inline namespace (kvp_simt_emulated at global scope,
//     kvp::simt::emulated), so code still says cudaMalloc, dim3, cudaError_t unqualified,
//     but the emulated functions and types get mangled names of their own. The real
//     runtime's functions are extern "C" and its types (dim3, cudaError_t, ...) are global
//     C++ names: without the namespace the two flavours' inline functions and types would
//     be two definitions of one name (an ODR violation no linker reports).
#pragma once

#include "kernels/simt/config.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#else

#include <cstddef>
#include <string>

inline namespace kvp_simt_emulated {

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

struct kvp_simt_stream;
struct kvp_simt_event;
struct kvp_simt_graph;
struct kvp_simt_graph_exec;
using cudaStream_t = kvp_simt_stream*;
using cudaEvent_t = kvp_simt_event*;
using cudaGraph_t = kvp_simt_graph*;
using cudaGraphExec_t = kvp_simt_graph_exec*;

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

// Allocates `bytes` of device memory filled with the 0x7FA07FA0 pattern.
cudaError_t cudaMalloc(void** ptr, std::size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** ptr, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
// REQUIRES: ptr is null or came from cudaMalloc and was not freed.
cudaError_t cudaFree(void* ptr);
// Pinned host memory (plain host memory here).
cudaError_t cudaMallocHost(void** ptr, std::size_t bytes);
template <class T>
cudaError_t cudaMallocHost(T** ptr, std::size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFreeHost(void* ptr);

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, std::size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream = nullptr);

inline constexpr unsigned int cudaStreamDefault = 0x00;
inline constexpr unsigned int cudaStreamNonBlocking = 0x01;  // no implicit synchronisation with the legacy stream
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
// Milliseconds between two recorded events.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaDeviceSynchronize();

// Stream capture and graphs (CUDA 12's signatures). Between cudaStreamBeginCapture and
// cudaStreamEndCapture a launch, cudaMemcpyAsync or cudaMemsetAsync on the capturing stream
// is recorded, not run: a launch's arguments are converted and copied then (as CUDA copies a
// kernel node's parameters), a copy's pointers are kept (it reads and writes them at each
// replay). cudaGraphLaunch runs the recorded work in order. As on a GPU, a potentially
// unsafe call (cudaMalloc, cudaFree, cudaMemcpy, cudaMemset, the synchronise calls, or a
// launch or async copy on the legacy stream 0) is refused with
// cudaErrorStreamCaptureUnsupported while a capture in global mode (any thread's) or
// thread-local mode (this thread's) is active, and work on the legacy stream (stream 0
// launches and copies, cudaMemcpy, cudaMemset, cudaDeviceSynchronize) with
// cudaErrorStreamCaptureImplicit while any thread captures a blocking stream (one not created
// cudaStreamNonBlocking); each invalidates the capture: cudaStreamEndCapture then fails with
// cudaErrorStreamCaptureInvalidated, and kvp::simt::last_error_message() names the call.
// The legacy stream cannot capture.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

// The emulated "device" always exists: count 1.
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

}  // namespace kvp_simt_emulated

namespace kvp::simt {
inline namespace emulated {

// What the calling host thread's most recent launch reported ("kernel block_reduce_kernel,
// block (1,0,0): ..."); empty when it succeeded. cudaGetLastError does not clear it.
std::string last_error_message();

// Kernels the calling host thread has launched with a valid configuration (the engine's
// launches per step are counted with it: tests/cuda_backend_launches_test.cc).
uint64_t launches_on_this_thread();

// Host threads that run a launch's blocks in parallel (default: the hardware's thread
// count). Results do not depend on it unless the kernel itself races across blocks.
// REQUIRES: n >= 1. The KVP_SIMT_THREADS flavour ignores it: it runs 2 to 4 blocks at
// once whatever the host (see kSlots in threads.cc), so that TSan checks the same pairs of
// blocks on every machine.
void set_host_threads(int n);
int host_threads();

}  // namespace emulated
}  // namespace kvp::simt

#endif  // !__CUDACC__
