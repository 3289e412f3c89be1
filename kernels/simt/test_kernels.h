// Test kernels for the SIMT emulation layer (kernels/simt/test_kernels.cu), callable from
// host-compiled tests in either flavour: the emulated one (library kvp_simt_test_kernels)
// or the nvcc one (kvp_simt_test_kernels_cuda). No CUDA types appear here.
//
// Each kernel takes a Bug: kNone runs the correct kernel; the others plant one of the bugs
// the emulation layer must catch (see tests/simt_test.cc). Only kNone is meant for a GPU.
#pragma once

#include <string>
#include <vector>

namespace kvp::simt::test {

struct Shape {
  unsigned x = 1, y = 1, z = 1;
  unsigned count() const { return x * y * z; }
};

enum class Bug {
  kNone,
  kOobGlobalRead,          // block_reverse: the last thread reads one element past `in`
  kOobDynamicSharedRead,   // block_reverse: thread 0 reads one element past the dynamic buffer
  kOobSharedWrite,         // histogram: bin 63 is counted one past the static shared array
  kMissingBarrier,         // block_reduce: no __syncthreads between storing partials and the tree
  kBarrierInBranch,        // block_reduce: the tree's __syncthreads sits inside `if (t < s)`
  kEarlyReturn,            // block_reduce: the last thread returns before the first barrier
  kShuffleSkipped,         // warp_reduce: lane 3 skips the shuffles that name it in their mask
  kVoteMaskBeyondWarp,     // warp_reduce: __ballot_sync(0xffffffff) in a partial warp
  kUninitialisedInput,     // block_reduce: the host copies all but the last input element
  kPlainGlobalAdd,         // grid_count: every block adds to the count without an atomic
  kLegacyStreamInCapture,  // graph_replay: the kernel is launched on stream 0 during the capture
  kSyncCopyInCapture,      // graph_replay: a synchronous cudaMemcpy inside the capture
  kReadBeforeAsyncWait,    // pipelined_sum: each stage is read before the wait that completes it
  kAsyncCopyNeverWaited,   // pipelined_sum: the last stage is never waited for (read, then exit)
  kMisalignedAsyncCopy,    // pipelined_sum: the 16-byte copies start 4 bytes into the input
};

// A kernel run: ok, or the error the launch reported (for the emulation: naming kernel and block).
struct KernelRun {
  bool ok = true;
  std::string error;
};

// Whether kernels can run here (emulated: always; nvcc flavour: a CUDA device is present).
bool device_available();

// Block b (linear index, x fastest) sums in[b*chunk, min((b+1)*chunk, n)) with a shared-memory
// tree and __syncthreads; out[b] is that sum. chunk = ceil(n / blocks). Any block shape.
KernelRun block_reduce(const std::vector<float>& in, Shape grid, Shape block, Bug bug, std::vector<float>* out);

// Every warp (32 consecutive linear thread indices of a block) reduces its lanes' inputs,
// in[block * threads_per_block + thread] (0 past the end), with shuffles and votes.
// Per warp, in order (block, warp): sum, count of x > 0, any x < 0, all x > 0.
struct WarpResults {
  std::vector<float> sums;
  std::vector<int> positives, any_negative, all_positive;
};
KernelRun warp_reduce(const std::vector<float>& in, Shape grid, Shape block, Bug bug, WarpResults* out);

// Inclusive scan of each block's segment of `in` (segment b: [b*threads, (b+1)*threads)),
// with __shfl_up_sync inside warps and shared-memory warp totals. 1-D blocks.
KernelRun block_scan(const std::vector<int>& in, Shape grid, unsigned threads, std::vector<int>* out);

// 64-bin histogram of in[i] % 64 via shared-memory atomicAdd, merged with global atomicAdd;
// also max(in) via atomicMax and max(in * 0.5f) via an atomicCAS loop on a float.
constexpr int kHistogramBins = 64;
struct Histogram {
  std::vector<unsigned> bins;
  unsigned max = 0;
  float half_max = 0;
};
KernelRun histogram(const std::vector<unsigned>& in, Shape grid, unsigned threads, Bug bug, Histogram* out);

// Reverses each block's segment of `in` through dynamic shared memory of threads floats.
// in.size() must be grid.count() * threads. 1-D blocks.
KernelRun block_reverse(const std::vector<float>& in, Shape grid, unsigned threads, Bug bug, std::vector<float>* out);

// Counts the grid's threads into one global word: every thread does atomicAdd(count, 1), so
// *count == grid.count() * threads. With kPlainGlobalAdd, thread 0 of each block adds the
// block's thread count with a plain read-modify-write instead: a race between blocks only,
// as no two threads of one block touch the word. 1-D blocks.
KernelRun grid_count(Shape grid, unsigned threads, Bug bug, unsigned* count);

// cp.async double buffering: one block of 32 threads sums `in` (a multiple of 128 floats)
// in tiles of 128, each thread copying 16 bytes of the next tile into shared memory
// (__pipeline_memcpy_async) while the block reads the current one; thread t adds element
// (4t + 5) mod 128 of every tile, which another thread copied. out[t] is its sum. The stages
// start as zeros, so only the copies' own pattern makes a premature read show.
KernelRun pipelined_sum(const std::vector<float>& in, Bug bug, std::vector<float>* out);

// Stream capture and graph replay: captures y = a * x (scale_kernel) and an async copy of y
// into z on a stream, instantiates the graph, and then for each input uploads it into x
// (outside the graph) and replays the graph; out[i] is z after replay i. After the capture
// the host variable `a` is changed to a + 1: a kernel node keeps the value it was captured
// with, as on a GPU. bug: kLegacyStreamInCapture, kSyncCopyInCapture (both invalidate the
// capture: the run fails naming the call).
KernelRun graph_replay(const std::vector<std::vector<float>>& inputs, float a, Bug bug,
                       std::vector<std::vector<float>>* out);

// fp16 and bf16 round trips: bits of __float2half_rn / __float2bfloat16_rn and back to float.
struct Conversions {
  std::vector<unsigned short> f16, bf16;
  std::vector<float> f16_back, bf16_back;
};
KernelRun convert(const std::vector<float>& in, Conversions* out);

}  // namespace kvp::simt::test
