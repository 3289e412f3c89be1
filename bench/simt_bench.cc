// Cost of the SIMT emulation layer (fiber flavour): one __syncthreads round across a
// block, one emulated launch of a 128-thread block, a warp shuffle round. Build in the
// release preset for numbers:
//   cmake --preset release && cmake --build build-release --target simt_bench
//   build-release/bin/simt_bench
#include <benchmark/benchmark.h>

#include "kernels/simt/simt.h"

namespace {

__global__ void empty_kernel() {}

__global__ void barrier_kernel(int rounds) {
  for (int i = 0; i < rounds; ++i) __syncthreads();
}

__global__ void shuffle_kernel(int rounds, float* out) {
  float v = static_cast<float>(threadIdx.x);
  for (int i = 0; i < rounds; ++i) v += __shfl_xor_sync(0xffffffffu, v, 1);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

void launch_or_fail(benchmark::State& state) {
  if (cudaGetLastError() != cudaSuccess) state.SkipWithError(kvp::simt::last_error_message().c_str());
}

// One emulated launch of one block of `threads` threads that do nothing.
void BM_LaunchEmptyBlock(benchmark::State& state) {
  const unsigned threads = static_cast<unsigned>(state.range(0));
  for (auto _ : state) {
    KVP_LAUNCH(empty_kernel, dim3(1), dim3(threads), 0, nullptr)();
    launch_or_fail(state);
  }
}
BENCHMARK(BM_LaunchEmptyBlock)->Arg(128)->Arg(1024);

// One emulated launch of one block whose threads meet at one __syncthreads.
void BM_LaunchBlockWithOneBarrier(benchmark::State& state) {
  const unsigned threads = static_cast<unsigned>(state.range(0));
  for (auto _ : state) {
    KVP_LAUNCH(barrier_kernel, dim3(1), dim3(threads), 0, nullptr)(1);
    launch_or_fail(state);
  }
}
BENCHMARK(BM_LaunchBlockWithOneBarrier)->Arg(128)->Arg(1024);

// One __syncthreads round across the block: 1000 barriers per launch; the counter is the
// time per barrier.
void BM_BarrierRound(benchmark::State& state) {
  const unsigned threads = static_cast<unsigned>(state.range(0));
  constexpr int kRounds = 1000;
  for (auto _ : state) {
    KVP_LAUNCH(barrier_kernel, dim3(1), dim3(threads), 0, nullptr)(kRounds);
    launch_or_fail(state);
  }
  state.counters["per_barrier"] = benchmark::Counter(static_cast<double>(state.iterations()) * kRounds,
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_BarrierRound)->Arg(32)->Arg(128)->Arg(1024);

// One __shfl_xor_sync round across every warp of a 128-thread block.
void BM_ShuffleRound(benchmark::State& state) {
  constexpr int kRounds = 1000;
  float* out = nullptr;
  cudaMalloc(&out, sizeof(float));
  for (auto _ : state) {
    KVP_LAUNCH(shuffle_kernel, dim3(1), dim3(128), 0, nullptr)(kRounds, out);
    launch_or_fail(state);
  }
  cudaFree(out);
  state.counters["per_shuffle"] = benchmark::Counter(static_cast<double>(state.iterations()) * kRounds,
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_ShuffleRound);

// A grid of 64 blocks of 128 threads, each with one barrier, on all host threads.
void BM_LaunchGrid64x128(benchmark::State& state) {
  for (auto _ : state) {
    KVP_LAUNCH(barrier_kernel, dim3(64), dim3(128), 0, nullptr)(1);
    launch_or_fail(state);
  }
}
BENCHMARK(BM_LaunchGrid64x128)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
