// Test kernels for the SIMT emulation layer, one source for both flavours:
//   nvcc:          built as kvp_simt_test_kernels_cuda when CMake finds nvcc (sm_80, sm_90)
//   host compiler: built as kvp_simt_test_kernels via test_kernels_emulated.cc, always
// Kernels: block_reduce (shared memory + __syncthreads tree), warp_reduce (shuffles and
// votes), block_scan (__shfl_up_sync + shared warp totals), histogram (shared and global
// atomics, atomicCAS), block_reverse (dynamic shared memory), grid_count (global atomicAdd
// from every block), convert (half / bfloat16).
// Each takes a planted-bug selector (see test_kernels.h); the kernel bodies hold no
// emulation #ifdefs.
#include "kernels/simt/test_kernels.h"

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/simt/simt.h"

namespace kvp::simt::test {
namespace {

constexpr int kOobGlobalRead = static_cast<int>(Bug::kOobGlobalRead);
constexpr int kOobDynamicSharedRead = static_cast<int>(Bug::kOobDynamicSharedRead);
constexpr int kOobSharedWrite = static_cast<int>(Bug::kOobSharedWrite);
constexpr int kMissingBarrier = static_cast<int>(Bug::kMissingBarrier);
constexpr int kBarrierInBranch = static_cast<int>(Bug::kBarrierInBranch);
constexpr int kEarlyReturn = static_cast<int>(Bug::kEarlyReturn);
constexpr int kShuffleSkipped = static_cast<int>(Bug::kShuffleSkipped);
constexpr int kVoteMaskBeyondWarp = static_cast<int>(Bug::kVoteMaskBeyondWarp);
constexpr int kPlainGlobalAdd = static_cast<int>(Bug::kPlainGlobalAdd);

__device__ __forceinline__ int linear_thread() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}
__device__ __forceinline__ int threads_per_block() { return static_cast<int>(blockDim.x * blockDim.y * blockDim.z); }
__device__ __forceinline__ int linear_block() {
  return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}
__device__ __forceinline__ int blocks_per_grid() { return static_cast<int>(gridDim.x * gridDim.y * gridDim.z); }
// The lanes of this thread's warp that exist (the block's last warp may be partial).
__device__ __forceinline__ unsigned warp_mask() {
  const int base = linear_thread() / warpSize * warpSize;
  const int lanes = threads_per_block() - base < warpSize ? threads_per_block() - base : warpSize;
  return lanes == warpSize ? 0xffffffffu : (1u << lanes) - 1u;
}

__global__ void block_reduce_kernel(const float* in, int n, int chunk, float* out, int bug) {
  KVP_SHARED(float, partial, 1024);
  const int threads = threads_per_block();
  const int t = linear_thread();
  const int b = linear_block();
  const int begin = b * chunk;
  const int end = begin + chunk < n ? begin + chunk : n;
  float acc = 0.0f;
  for (int i = begin + t; i < end; i += threads) acc += in[i];
  partial[t] = acc;
  if (bug == kEarlyReturn && threads > 1 && t == threads - 1) return;
  if (bug != kMissingBarrier) __syncthreads();
  int span = 1;
  while (span < threads) span <<= 1;
  for (int s = span / 2; s > 0; s >>= 1) {
    if (bug == kBarrierInBranch) {
      if (t < s) {
        if (t + s < threads) partial[t] += partial[t + s];
        __syncthreads();
      }
    } else {
      if (t < s && t + s < threads) partial[t] += partial[t + s];
      __syncthreads();
    }
  }
  if (t == 0) out[b] = partial[0];
}

__global__ void warp_reduce_kernel(const float* in, int n, float* sums, int* positives, int* any_negative,
                                   int* all_positive, int bug) {
  const int threads = threads_per_block();
  const int t = linear_thread();
  const int lane = t % warpSize;
  const int warp = t / warpSize;
  const unsigned mask = warp_mask();
  const int lanes = __popc(mask);
  const int gid = linear_block() * threads + t;
  const float x = gid < n ? in[gid] : 0.0f;
  float v = x;
  if (!(bug == kShuffleSkipped && lane == 3)) {
    if (lanes == warpSize) {
      for (int offset = warpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset);
    } else {
      for (int offset = warpSize / 2; offset > 0; offset >>= 1) {
        const float other = __shfl_down_sync(mask, v, offset);
        if (lane + offset < lanes) v += other;
      }
      v = __shfl_sync(mask, v, 0);
    }
  }
  const unsigned vote_mask = bug == kVoteMaskBeyondWarp ? 0xffffffffu : mask;
  const unsigned ballot = __ballot_sync(vote_mask, x > 0.0f);
  const int any_neg = __any_sync(mask, x < 0.0f);
  const int all_pos = __all_sync(mask, x > 0.0f);
  __syncwarp(mask);
  if (lane == 0) {
    const int w = linear_block() * ((threads + warpSize - 1) / warpSize) + warp;
    sums[w] = v;
    positives[w] = __popc(ballot);
    any_negative[w] = any_neg;
    all_positive[w] = all_pos;
  }
}

__global__ void block_scan_kernel(const int* in, int n, int* out) {
  KVP_SHARED(int, warp_totals, 32);
  const int threads = threads_per_block();
  const int t = linear_thread();
  const int lane = t % warpSize;
  const int warp = t / warpSize;
  const unsigned mask = warp_mask();
  const int lanes = __popc(mask);
  const int gid = linear_block() * threads + t;
  int v = gid < n ? in[gid] : 0;
  for (int d = 1; d < warpSize; d <<= 1) {
    const int other = __shfl_up_sync(mask, v, static_cast<unsigned>(d));
    if (lane >= d) v += other;
  }
  if (lane == lanes - 1) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (threads + warpSize - 1) / warpSize;
    int total = lane < warps ? warp_totals[lane] : 0;
    for (int d = 1; d < warpSize; d <<= 1) {
      const int other = __shfl_up_sync(mask, total, static_cast<unsigned>(d));
      if (lane >= d) total += other;
    }
    if (lane < warps) warp_totals[lane] = total;
  }
  __syncthreads();
  if (warp > 0) v += warp_totals[warp - 1];
  if (gid < n) out[gid] = v;
}

__device__ void atomic_max_float(float* address, float value) {
  unsigned* bits = reinterpret_cast<unsigned*>(address);
  unsigned old = atomicAdd(bits, 0u);
  while (__uint_as_float(old) < value) {
    const unsigned assumed = old;
    old = atomicCAS(bits, assumed, __float_as_uint(value));
    if (old == assumed) break;
  }
}

__global__ void histogram_kernel(const unsigned* in, int n, unsigned* bins_out, unsigned* max_out, float* half_max,
                                 int bug) {
  KVP_SHARED(unsigned, bins, kHistogramBins);
  const int threads = threads_per_block();
  const int t = linear_thread();
  for (int i = t; i < kHistogramBins; i += threads) bins[i] = 0u;
  __syncthreads();
  const unsigned overflow = bug == kOobSharedWrite ? 1u : 0u;
  for (int i = linear_block() * threads + t; i < n; i += blocks_per_grid() * threads) {
    const unsigned v = __ldg(in + i);
    const unsigned bin = v % kHistogramBins;
    atomicAdd(&bins[bin == kHistogramBins - 1 ? bin + overflow : bin], 1u);
    atomicMax(max_out, v);
    atomic_max_float(half_max, static_cast<float>(v) * 0.5f);
  }
  __syncthreads();
  for (int i = t; i < kHistogramBins; i += threads)
    if (bins[i] != 0u) atomicAdd(&bins_out[i], bins[i]);
}

__global__ void block_reverse_kernel(const float* in, float* out, int bug) {
  KVP_DYNAMIC_SHARED(float, buffer);
  const int threads = static_cast<int>(blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  const int gid = linear_block() * threads + t;
  buffer[t] = in[bug == kOobGlobalRead ? gid + 1 : gid];
  __syncthreads();
  out[gid] = buffer[bug == kOobDynamicSharedRead ? threads - t : threads - 1 - t];
}

__global__ void grid_count_kernel(unsigned* count, int bug) {
  if (bug == kPlainGlobalAdd) {
    if (threadIdx.x == 0) *count += blockDim.x;
    return;
  }
  atomicAdd(count, 1u);
}

__global__ void convert_kernel(const float* in, int n, unsigned short* f16, unsigned short* bf16, float* f16_back,
                               float* bf16_back) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const __half h = __float2half_rn(in[i]);
  f16[i] = __half_as_ushort(h);
  f16_back[i] = __half2float(h);
  const __nv_bfloat16 b = __float2bfloat16_rn(in[i]);
  bf16[i] = __bfloat16_as_ushort(b);
  bf16_back[i] = __bfloat162float(b);
}

// pipelined_sum's kernel: two 128-float stages in shared memory, filled by cp.async.
__global__ void pipelined_sum_kernel(const float* in, int tiles, float* out, int bug) {
  KVP_SHARED(float, stage, 256);
  const int t = static_cast<int>(threadIdx.x);
  const float* src = in + (bug == static_cast<int>(Bug::kMisalignedAsyncCopy) ? 1 : 0);
  for (int k = 0; k < 8; ++k) stage[8 * t + k] = 0.0f;  // a stale stage reads finite
  __syncthreads();
  __pipeline_memcpy_async(stage + 4 * t, src + 4 * t, 16);
  __pipeline_commit();
  float sum = 0.0f;
  for (int i = 0; i < tiles; ++i) {
    const bool more = i + 1 < tiles;
    if (more) {
      __pipeline_memcpy_async(stage + ((i + 1) % 2) * 128 + 4 * t, src + (i + 1) * 128 + 4 * t, 16);
      __pipeline_commit();
    }
    if (bug == static_cast<int>(Bug::kReadBeforeAsyncWait)) {
      __pipeline_wait_prior(2);  // completes nothing here: tile i is still in flight
    } else if (!(bug == static_cast<int>(Bug::kAsyncCopyNeverWaited) && !more)) {
      __pipeline_wait_prior(more ? 1 : 0);
    }
    __syncthreads();
    sum += stage[(i % 2) * 128 + (4 * t + 5) % 128];
    __syncthreads();  // before the next iteration's copy overwrites this stage
  }
  if (bug == static_cast<int>(Bug::kReadBeforeAsyncWait)) __pipeline_wait_prior(0);
  out[t] = sum;
}

// y[i] = a * x[i] (graph_replay: `a` is a kernel parameter, captured by value).
__global__ void scale_kernel(const float* x, float a, float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = a * x[i];
}

// ---- host side: allocation, copies, launch, error reporting ----

dim3 to_dim3(Shape s) { return dim3(s.x, s.y, s.z); }

// An exactly-sized device array, freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t count) : count_(count) { status_ = cudaMalloc(&ptr_, count * sizeof(T)); }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  cudaError_t status() const { return status_; }
  cudaError_t upload(const std::vector<T>& host, std::size_t count) {
    return cudaMemcpy(ptr_, host.data(), count * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t download(std::vector<T>* host) const {
    host->resize(count_);
    return cudaMemcpy(host->data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  cudaError_t zero() { return cudaMemset(ptr_, 0, count_ * sizeof(T)); }

 private:
  T* ptr_ = nullptr;
  std::size_t count_;
  cudaError_t status_;
};

// A failed call's error stays the thread's last error until read (CUDA's rule too): read it
// here, so that the next run on this thread does not report it as its own.
KernelRun failed(const char* what, cudaError_t e) {
  KernelRun run{false, std::string(what) + ": " + error_message(e)};
  (void)cudaGetLastError();
  return run;
}

// The launch's error, if any: configuration errors at once, execution errors at the sync.
KernelRun finish_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return failed(kernel, e);
  return KernelRun{};
}

#define KVP_TEST_CHECK(call)                                                 \
  do {                                                                       \
    const cudaError_t kvp_test_error = (call);                               \
    if (kvp_test_error != cudaSuccess) return failed(#call, kvp_test_error); \
  } while (0)

}  // namespace

bool device_available() { return kvp::simt::device_available(); }

KernelRun block_reduce(const std::vector<float>& in, Shape grid, Shape block, Bug bug, std::vector<float>* out) {
  const int n = static_cast<int>(in.size());
  const int blocks = static_cast<int>(grid.count());
  const int chunk = (n + blocks - 1) / blocks;
  DeviceArray<float> d_in(in.size() + (in.empty() ? 1 : 0));
  DeviceArray<float> d_out(static_cast<std::size_t>(blocks));
  KVP_TEST_CHECK(d_in.status());
  KVP_TEST_CHECK(d_out.status());
  KVP_TEST_CHECK(d_in.upload(in, bug == Bug::kUninitialisedInput ? in.size() - 1 : in.size()));
  KVP_LAUNCH(block_reduce_kernel, to_dim3(grid), to_dim3(block), 0, nullptr)
  (d_in.get(), n, chunk, d_out.get(), static_cast<int>(bug));
  KernelRun run = finish_launch("block_reduce_kernel");
  if (!run.ok) return run;
  KVP_TEST_CHECK(d_out.download(out));
  return run;
}

KernelRun warp_reduce(const std::vector<float>& in, Shape grid, Shape block, Bug bug, WarpResults* out) {
  const std::size_t warps = grid.count() * ((block.count() + 31) / 32);
  DeviceArray<float> d_in(in.size());
  DeviceArray<float> sums(warps);
  DeviceArray<int> positives(warps), any_negative(warps), all_positive(warps);
  KVP_TEST_CHECK(d_in.status());
  KVP_TEST_CHECK(d_in.upload(in, in.size()));
  cudaStream_t stream;
  KVP_TEST_CHECK(cudaStreamCreate(&stream));
  KVP_LAUNCH(warp_reduce_kernel, to_dim3(grid), to_dim3(block), 0, stream)
  (d_in.get(), static_cast<int>(in.size()), sums.get(), positives.get(), any_negative.get(), all_positive.get(),
   static_cast<int>(bug));
  KernelRun run = finish_launch("warp_reduce_kernel");
  KVP_TEST_CHECK(cudaStreamSynchronize(stream));
  KVP_TEST_CHECK(cudaStreamDestroy(stream));
  if (!run.ok) return run;
  KVP_TEST_CHECK(sums.download(&out->sums));
  KVP_TEST_CHECK(positives.download(&out->positives));
  KVP_TEST_CHECK(any_negative.download(&out->any_negative));
  KVP_TEST_CHECK(all_positive.download(&out->all_positive));
  return run;
}

KernelRun block_scan(const std::vector<int>& in, Shape grid, unsigned threads, std::vector<int>* out) {
  DeviceArray<int> d_in(in.size()), d_out(in.size());
  KVP_TEST_CHECK(d_in.status());
  KVP_TEST_CHECK(d_in.upload(in, in.size()));
  KVP_LAUNCH(block_scan_kernel, to_dim3(grid), dim3(threads), 0, nullptr)
  (d_in.get(), static_cast<int>(in.size()), d_out.get());
  KernelRun run = finish_launch("block_scan_kernel");
  if (!run.ok) return run;
  KVP_TEST_CHECK(d_out.download(out));
  return run;
}

KernelRun histogram(const std::vector<unsigned>& in, Shape grid, unsigned threads, Bug bug, Histogram* out) {
  DeviceArray<unsigned> d_in(in.size()), bins(kHistogramBins), max(1);
  DeviceArray<float> half_max(1);
  KVP_TEST_CHECK(d_in.upload(in, in.size()));
  KVP_TEST_CHECK(bins.zero());
  KVP_TEST_CHECK(max.zero());
  KVP_TEST_CHECK(half_max.zero());
  KVP_LAUNCH(histogram_kernel, to_dim3(grid), dim3(threads), 0, nullptr)
  (d_in.get(), static_cast<int>(in.size()), bins.get(), max.get(), half_max.get(), static_cast<int>(bug));
  KernelRun run = finish_launch("histogram_kernel");
  if (!run.ok) return run;
  std::vector<unsigned> m;
  std::vector<float> h;
  KVP_TEST_CHECK(bins.download(&out->bins));
  KVP_TEST_CHECK(max.download(&m));
  KVP_TEST_CHECK(half_max.download(&h));
  out->max = m[0];
  out->half_max = h[0];
  return run;
}

KernelRun block_reverse(const std::vector<float>& in, Shape grid, unsigned threads, Bug bug, std::vector<float>* out) {
  DeviceArray<float> d_in(in.size()), d_out(in.size());
  KVP_TEST_CHECK(d_in.upload(in, in.size()));
  KVP_LAUNCH(block_reverse_kernel, to_dim3(grid), dim3(threads), threads * sizeof(float), nullptr)
  (d_in.get(), d_out.get(), static_cast<int>(bug));
  KernelRun run = finish_launch("block_reverse_kernel");
  if (!run.ok) return run;
  KVP_TEST_CHECK(d_out.download(out));
  return run;
}

KernelRun grid_count(Shape grid, unsigned threads, Bug bug, unsigned* count) {
  DeviceArray<unsigned> d_count(1);
  KVP_TEST_CHECK(d_count.status());
  KVP_TEST_CHECK(d_count.zero());
  KVP_LAUNCH(grid_count_kernel, to_dim3(grid), dim3(threads), 0, nullptr)(d_count.get(), static_cast<int>(bug));
  KernelRun run = finish_launch("grid_count_kernel");
  if (!run.ok) return run;
  std::vector<unsigned> c;
  KVP_TEST_CHECK(d_count.download(&c));
  *count = c[0];
  return run;
}

KernelRun pipelined_sum(const std::vector<float>& in, Bug bug, std::vector<float>* out) {
  const int tiles = static_cast<int>(in.size() / 128);
  DeviceArray<float> d_in(in.size() + 4), d_out(32);  // 4 spare: the misaligned copies stay inside
  KVP_TEST_CHECK(d_in.status());
  KVP_TEST_CHECK(d_out.status());
  KVP_TEST_CHECK(d_in.upload(in, in.size()));
  KVP_LAUNCH(pipelined_sum_kernel, dim3(1), dim3(32), 0, nullptr)
  (d_in.get(), tiles, d_out.get(), static_cast<int>(bug));
  KernelRun run = finish_launch("pipelined_sum_kernel");
  if (!run.ok) return run;
  KVP_TEST_CHECK(d_out.download(out));
  return run;
}

KernelRun graph_replay(const std::vector<std::vector<float>>& inputs, float a, Bug bug,
                       std::vector<std::vector<float>>* out) {
  const int n = inputs.empty() ? 0 : static_cast<int>(inputs[0].size());
  DeviceArray<float> d_x(static_cast<std::size_t>(n)), d_y(static_cast<std::size_t>(n)),
      d_z(static_cast<std::size_t>(n));
  KVP_TEST_CHECK(d_x.status());
  KVP_TEST_CHECK(d_y.status());
  KVP_TEST_CHECK(d_z.status());
  cudaStream_t stream = nullptr;
  KVP_TEST_CHECK(cudaStreamCreate(&stream));
  struct Cleanup {
    cudaStream_t stream;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ~Cleanup() {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    }
  } c{stream};
  const unsigned blocks = static_cast<unsigned>((n + 127) / 128);
  KVP_TEST_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  if (bug == Bug::kSyncCopyInCapture) (void)d_x.upload(inputs[0], static_cast<std::size_t>(n));
  KVP_LAUNCH(scale_kernel, dim3(blocks), dim3(128), 0, bug == Bug::kLegacyStreamInCapture ? nullptr : stream)
  (d_x.get(), a, d_y.get(), n);
  (void)cudaGetLastError();  // a refused launch's error: the end of the capture reports it
  KVP_TEST_CHECK(cudaMemcpyAsync(d_z.get(), d_y.get(), static_cast<std::size_t>(n) * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream));
  KVP_TEST_CHECK(cudaStreamEndCapture(stream, &c.graph));
  KVP_TEST_CHECK(cudaGraphInstantiate(&c.exec, c.graph, 0));
  a += 1.0f;  // the captured node keeps the old value
  out->clear();
  for (const std::vector<float>& input : inputs) {
    KVP_TEST_CHECK(d_x.upload(input, static_cast<std::size_t>(n)));
    KVP_TEST_CHECK(cudaGraphLaunch(c.exec, stream));
    KVP_TEST_CHECK(cudaStreamSynchronize(stream));
    out->emplace_back();
    KVP_TEST_CHECK(d_z.download(&out->back()));
  }
  return KernelRun{};
}

KernelRun convert(const std::vector<float>& in, Conversions* out) {
  const std::size_t n = in.size();
  DeviceArray<float> d_in(n), f16_back(n), bf16_back(n);
  DeviceArray<unsigned short> f16(n), bf16(n);
  KVP_TEST_CHECK(d_in.upload(in, n));
  const unsigned threads = 128;
  KVP_LAUNCH(convert_kernel, dim3(static_cast<unsigned>((n + threads - 1) / threads)), dim3(threads), 0, nullptr)
  (d_in.get(), static_cast<int>(n), f16.get(), bf16.get(), f16_back.get(), bf16_back.get());
  KernelRun run = finish_launch("convert_kernel");
  if (!run.ok) return run;
  KVP_TEST_CHECK(f16.download(&out->f16));
  KVP_TEST_CHECK(bf16.download(&out->bf16));
  KVP_TEST_CHECK(f16_back.download(&out->f16_back));
  KVP_TEST_CHECK(bf16_back.download(&out->bf16_back));
  return run;
}

}  // namespace kvp::simt::test
