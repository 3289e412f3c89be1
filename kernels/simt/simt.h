// SIMT emulation layer: the CUDA execution model for the host compiler, so one .cu source
// builds both as a real CUDA kernel (nvcc) and as an emulated one that runs on any CPU
// (g++/clang), under ASan and TSan too. See kernels/simt/README.md.
//
// Writing a kernel that builds in both flavours:
//   - Use __global__ / __device__ / __forceinline__ as usual; for the host compiler they
//     mean nothing (__forceinline__ means inline).
//   - Static shared memory: KVP_SHARED(float, partial, 256); then partial[i] as usual.
//     (Under nvcc it is `__shared__ float partial[256]`; emulated it is a `float* const`
//     to the block's own exactly-sized buffer: sizeof(partial) differs, indexing does not.
//     Only one-dimensional arrays.) A plain `__shared__` declaration does not compile in
//     the emulation on purpose: a function-local static would be one buffer for all the
//     blocks that run in parallel.
//   - Dynamic shared memory: KVP_DYNAMIC_SHARED(float, buf); sized by the launch.
//   - Launch: KVP_LAUNCH(kernel, grid, block, shmem_bytes, stream)(args...); then
//     cudaGetLastError(). Under nvcc this is kernel<<<grid, block, shmem, stream>>>(args...).
//   - Kernel bodies contain no #ifdef on the flavour.
//
// What the emulation checks, and how (each has a planted-bug test in tests/simt_test.cc):
//   - Out-of-bounds global or shared memory access: device allocations, the dynamic shared
//     buffer and every KVP_SHARED array are separate, exactly-sized heap blocks, so ASan
//     (asan preset) reports an overrun with the kernel's frame in the stack; the layer also
//     prints "kvp::simt: fault in kernel K, block (..), thread (..)" when ASan dies.
//   - Missing __syncthreads between one thread's shared-memory write and another's read:
//     under TSan (tsan preset) every CUDA thread is an OS thread and barriers are real
//     barriers, so TSan reports the data race. We chose this over tracking a writer and
//     barrier epoch per shared-memory location because it needs no change to how kernels
//     touch shared memory (raw pointers stay raw pointers, as under nvcc) and TSan's
//     happens-before analysis also covers global memory and atomics. In the fiber flavour
//     it is not reported, but usually shows in the results: fibers run each thread to its
//     next barrier in thread order, so a read of another thread's not-yet-written shared
//     memory returns the uninitialised (NaN) pattern.
//   - Two blocks of one launch touching the same global word, one of them writing, without
//     an atomic (tsan preset): a launch runs its blocks on up to four slots at once (four
//     for blocks of up to 128 threads, else two), each slot with its own OS threads, block
//     i on slot i % slots. The layer adds no happens-before edge between blocks on different
//     slots, as CUDA orders the blocks of a launch in no way, so TSan reports the race as a
//     data race between the two blocks. Its only edges are the ones CUDA promises: what the
//     host did before the launch happens before every block, every block before the launch
//     returns. Blocks that one slot runs one after another are ordered (its OS threads are
//     reused), so a race only between blocks i and i + slots goes unseen. Atomics are
//     std::atomic_ref operations: atomic across blocks, and atomic to TSan. In the fiber
//     flavour such a race is not reported.
//   - A __syncthreads not every thread of the block reaches (inside a branch, or after a
//     thread returned), threads waiting at different __syncthreads, or a deadlock between
//     a barrier and a warp collective: the launch fails with cudaErrorLaunchFailure and
//     last_error_message() names the kernel, the block and the threads involved. Decided
//     without timeouts: when every live thread of a block is blocked and none can proceed.
//     As the issue asks, a thread that exits before a barrier others wait at is an error.
//   - A shuffle/vote/__syncwarp mask that names a lane that exited, that does not exist, that
//     waits at another collective, or that omits the calling lane: same reporting. Lanes
//     named in a mask must meet at the same collective (same call site, same mask). A
//     shuffle whose source lane is outside the mask is legal but undefined on the GPU: it
//     returns the uninitialised-memory pattern below.
//   - Reads of memory never written: cudaMalloc memory and shared memory start filled with
//     0x7FA07FA0 words (signalling NaN as float, NaN as half/bf16); see runtime.h.
//
// Fidelity: the emulated result equals a sequential C++ reading of the kernel, run thread
// by thread between barriers. Where a GPU may differ, tolerances must allow for it:
//   - nvcc contracts a*b+c into fused multiply-adds by default (--fmad=true); the host
//     build does not (x86-64 without -mfma has no FMA instruction, and -std=c++20 means
//     -ffp-contract=off), so products summed in a kernel may differ in the last bits.
//   - __expf, __logf, __fdividef, rsqrtf are approximate on the GPU; here they are the exact
//     libm functions.
//   - Float atomicAdd across threads or blocks sums in an order the GPU does not promise.
//   - half/bfloat16 conversions use common/dtype.h (round to nearest even, bit-exact with
//     CUDA's __float2half_rn / __float2bfloat16_rn for all non-NaN inputs; NaN payloads may
//     differ).
//   - Warps are 32 lanes; blocks up to 1024 threads; several blocks run in parallel on host
//     threads (kvp::simt::set_host_threads; under TSan 2 to 4 at once, see above), results
//     do not depend on how many.
//
// Cost (2-core CI machine, default build, bench/simt_bench.cc): see the note in
// kernels/simt/README.md.
#pragma once

#include "kernels/simt/runtime.h"

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <string>

#define KVP_SHARED(T, name, count) __shared__ T name[count]
#define KVP_DYNAMIC_SHARED(T, name)                                    \
  extern __shared__ __align__(16) unsigned char kvp_dynamic_shared_[]; \
  T* const name = reinterpret_cast<T*>(kvp_dynamic_shared_)
#define KVP_LAUNCH(kernel, grid, block, shmem_bytes, stream) kernel<<<(grid), (block), (shmem_bytes), (stream)>>>
// `#pragma unroll` for the loop that follows (nvcc); nothing in the emulated flavour.
#define KVP_UNROLL _Pragma("unroll")

namespace kvp::simt {
// What went wrong in the last failed call, for test messages.
inline std::string error_message(cudaError_t e) { return cudaGetErrorString(e); }
// Whether kernels can run: a CUDA device is present.
inline bool device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
}  // namespace kvp::simt

#else  // the emulated flavour

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/dtype.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

#define KVP_SHARED(T, name, count) T* const name = ::kvp::simt::static_shared<T>(static_cast<std::size_t>(count))
#define KVP_DYNAMIC_SHARED(T, name) T* const name = ::kvp::simt::dynamic_shared<T>()
#define KVP_LAUNCH(kernel, grid, block, shmem_bytes, stream) \
  ::kvp::simt::Launch(#kernel, kernel, (grid), (block), (shmem_bytes), (stream))
#define KVP_UNROLL

// Everything below is declared in runtime.h's inline namespaces (kvp_simt_emulated,
// kvp::simt::emulated): kernels name it as CUDA spells it, and its mangled names are not
// those of the nvcc flavour's objects, which a program links beside these (runtime.h).
inline namespace kvp_simt_emulated {

struct uint3 {
  unsigned x, y, z;
};

// The built-in variables. The layer sets them before it runs (or resumes) a CUDA thread on
// a host thread, so kernel code reads them unchanged.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

}  // namespace kvp_simt_emulated

namespace kvp::simt {
inline namespace emulated {

namespace detail {

enum class WarpOp : uint8_t { kSyncWarp, kShfl, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll };

void sync_block(const char* file, int line);
// One warp collective: waits until every lane named in `mask` arrives at the same call
// site, then returns this lane's result (for shuffles, the source lane's `value` bits).
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line);
void* static_shared(std::size_t bytes, std::size_t align);
void* dynamic_shared();

struct KernelBody {
  void (*run)(const void* context);
  const void* context;
};
void launch(const char* kernel, dim3 grid, dim3 block, std::size_t shmem_bytes, cudaStream_t stream, KernelBody body);
// cp.async (block.cc): see __pipeline_memcpy_async below.
void pipeline_memcpy_async(void* dst, const void* src, std::size_t size, std::size_t zfill, const char* file, int line);
void pipeline_commit();
void pipeline_wait_prior(std::size_t prior);

// What a launch of `kernel` on `stream` does now (runtime.h, stream capture): run; be
// recorded into the stream's capture; or be refused (a launch on the legacy stream while a
// capture that forbids it is active: the capture is invalidated, the thread's error set).
enum class LaunchMode { kRun, kRecord, kRefused };
LaunchMode launch_mode(const char* kernel, cudaStream_t stream);
// Appends a recorded operation to the capture of `stream`. REQUIRES: launch_mode(.., stream)
// was kRecord.
void record(cudaStream_t stream, std::function<void()> operation);

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a type over 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <class T>
T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

}  // namespace detail

template <class T>
T* static_shared(std::size_t count) {
  return static_cast<T*>(detail::static_shared(count * sizeof(T), alignof(T)));
}
template <class T>
T* dynamic_shared() {
  return static_cast<T*>(detail::dynamic_shared());
}

// The error's CUDA description, then what the last launch on this thread reported.
inline std::string error_message(cudaError_t e) {
  const std::string detail = last_error_message();
  return std::string(cudaGetErrorString(e)) + (detail.empty() ? "" : ": " + detail);
}
inline bool device_available() { return true; }

// What KVP_LAUNCH builds: converts the arguments to the kernel's parameter types once, as a
// real launch does, then runs every thread of every block with its own copy.
template <class... P>
class Launch {
 public:
  Launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shmem_bytes, cudaStream_t stream)
      : name_(name), kernel_(kernel), grid_(grid), block_(block), shmem_(shmem_bytes), stream_(stream) {}

  template <class... A>
  void operator()(A&&... args) const {
    const detail::LaunchMode mode = detail::launch_mode(name_, stream_);
    if (mode == detail::LaunchMode::kRefused) return;
    if (mode == detail::LaunchMode::kRecord) {  // a graph's kernel node: these parameters at every replay
      auto params = std::make_shared<const std::tuple<P...>>(std::forward<A>(args)...);
      detail::record(stream_, [name = name_, kernel = kernel_, grid = grid_, block = block_, shmem = shmem_,
                               stream = stream_, params] { run(name, kernel, grid, block, shmem, stream, *params); });
      return;
    }
    const std::tuple<P...> params(std::forward<A>(args)...);
    run(name_, kernel_, grid_, block_, shmem_, stream_, params);
  }

 private:
  static void run(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shmem, cudaStream_t stream,
                  const std::tuple<P...>& params) {
    struct Context {
      void (*kernel)(P...);
      const std::tuple<P...>* params;
    } context{kernel, &params};
    auto body = [](const void* c) {
      const auto* ctx = static_cast<const Context*>(c);
      std::apply(ctx->kernel, *ctx->params);
    };
    detail::launch(name, grid, block, shmem, stream, detail::KernelBody{body, &context});
  }

  const char* name_;
  void (*kernel_)(P...);
  dim3 grid_, block_;
  std::size_t shmem_;
  cudaStream_t stream_;
};

}  // namespace emulated
}  // namespace kvp::simt

inline namespace kvp_simt_emulated {

// ---- barriers, warp collectives ----
// The trailing defaulted arguments record the call site for error messages.

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  kvp::simt::detail::sync_block(file, line);
}
// cp.async, as <cuda_pipeline.h> spells it (sm_80+): an asynchronous copy of 4, 8 or 16 bytes
// (the last `zfill` of them zeros) from global to shared memory, both addresses aligned to
// the size; __pipeline_commit closes this thread's current group of copies;
// __pipeline_wait_prior(N) completes every committed group but the newest N. Emulated: the
// source is read when the copy is issued and the destination filled with the uninitialised
// pattern (NaN), and the bytes land at the wait that completes the group; so a read of a
// stage before its wait shows NaN (and under TSan another thread's read without a barrier
// after the wait is a data race), a misaligned copy fails the launch, and a thread that exits
// with copies never waited for fails it too, naming the thread.
inline void __pipeline_memcpy_async(void* dst_shared, const void* src_global, std::size_t size_and_align,
                                    std::size_t zfill = 0, const char* file = __builtin_FILE(),
                                    int line = __builtin_LINE()) {
  kvp::simt::detail::pipeline_memcpy_async(dst_shared, src_global, size_and_align, zfill, file, line);
}
inline void __pipeline_commit() { kvp::simt::detail::pipeline_commit(); }
inline void __pipeline_wait_prior(std::size_t prior) { kvp::simt::detail::pipeline_wait_prior(prior); }

inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  kvp::simt::detail::warp_collective(kvp::simt::detail::WarpOp::kSyncWarp, mask, 0, 0, warpSize, file, line);
}

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  using namespace kvp::simt::detail;
  return from_bits<T>(warp_collective(WarpOp::kShfl, mask, to_bits(var), src_lane, width, file, line));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  using namespace kvp::simt::detail;
  return from_bits<T>(warp_collective(WarpOp::kShflUp, mask, to_bits(var), static_cast<int>(delta), width, file, line));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  using namespace kvp::simt::detail;
  return from_bits<T>(
      warp_collective(WarpOp::kShflDown, mask, to_bits(var), static_cast<int>(delta), width, file, line));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  using namespace kvp::simt::detail;
  return from_bits<T>(warp_collective(WarpOp::kShflXor, mask, to_bits(var), lane_mask, width, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  using namespace kvp::simt::detail;
  return static_cast<unsigned>(warp_collective(WarpOp::kBallot, mask, predicate != 0, 0, warpSize, file, line));
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace kvp::simt::detail;
  return static_cast<int>(warp_collective(WarpOp::kAny, mask, predicate != 0, 0, warpSize, file, line));
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace kvp::simt::detail;
  return static_cast<int>(warp_collective(WarpOp::kAll, mask, predicate != 0, 0, warpSize, file, line));
}

// ---- atomics (global and shared memory alike) ----

template <class T>
T atomicAdd(T* address, T value) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned> || std::is_same_v<T, unsigned long long> ||
                std::is_same_v<T, float> || std::is_same_v<T, double>);
  return std::atomic_ref<T>(*address).fetch_add(value);
}
template <class T>
T atomicSub(T* address, T value) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned>);
  return std::atomic_ref<T>(*address).fetch_sub(value);
}
template <class T>
T atomicMax(T* address, T value) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned> || std::is_same_v<T, long long> ||
                std::is_same_v<T, unsigned long long>);
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (old < value && !a.compare_exchange_weak(old, value)) {
  }
  return old;
}
template <class T>
T atomicMin(T* address, T value) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned> || std::is_same_v<T, long long> ||
                std::is_same_v<T, unsigned long long>);
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (value < old && !a.compare_exchange_weak(old, value)) {
  }
  return old;
}
template <class T>
T atomicCAS(T* address, T compare, T value) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned> || std::is_same_v<T, unsigned long long> ||
                std::is_same_v<T, unsigned short>);
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value);
  return compare;
}
template <class T>
T atomicExch(T* address, T value) {
  return std::atomic_ref<T>(*address).exchange(value);
}

// ---- loads, bit and math intrinsics ----

template <class T>
T __ldg(const T* address) {
  return *address;
}
// A load that bypasses L1 (cache-global): for data another block of the same launch wrote
// (made visible by __threadfence and an atomic). A plain load here.
template <class T>
T __ldcg(const T* address) {
  return *address;
}
// Orders this thread's global writes before its later ones for every other thread (the
// device-wide fence). Nothing here: the pattern it serves (write, fence, barrier, an atomic
// ticket) is already ordered on the host by the barrier and the ticket's sequentially
// consistent std::atomic_ref operation, which TSan sees (TSan does not model a bare fence,
// and GCC refuses std::atomic_thread_fence under -fsanitize=thread).
inline void __threadfence() {}
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
// Approximate on the GPU, exact here (see the header comment on fidelity).
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

// ---- half and bfloat16 (bit-exact conversions from common/dtype.h) ----

struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
using half = __half;
inline __half __float2half(float f) { return __half{kvp::float_to_f16(f)}; }
inline __half __float2half_rn(float f) { return __half{kvp::float_to_f16(f)}; }
inline float __half2float(__half h) { return kvp::f16_to_float(h.bits); }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{kvp::float_to_bf16(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{kvp::float_to_bf16(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return kvp::bf16_to_float(h.bits); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }

}  // namespace kvp_simt_emulated

#endif  // emulated flavour
