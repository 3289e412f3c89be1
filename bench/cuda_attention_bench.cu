// Decode attention on a GPU (nvcc flavour; needs a device, skips every benchmark without one):
// achieved bandwidth = (K/V bytes read + q + output) / kernel time from CUDA events after a
// warm-up, against the device-to-device copy bandwidth measured in the same run (bytes read
// + written by cudaMemcpy of 1 GiB). Shapes: batch {1, 16, 64, 256} x context {512, 4k, 32k},
// head dim 128, 32 query / 8 KV heads, bf16 KV, block size 16, default partition (128).
// The pool holds several copies of the batch's K/V and each iteration reads the next copy,
// so that no iteration finds its K/V in L2 (at least 512 MiB cycled).
//
// Counters: GB/s (attention), copy_GB/s, of_copy (the ratio, measured in one run).
// BM_Projection (below): the projection kernel's weight bandwidth, a thread or a half-warp per
// row, fp32 or bf16 weights.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu_attention.h"
#include "kernels/cuda/model_kernels.h"

namespace {

namespace ck = kvp::cuda_kernels::dev;

constexpr int64_t kHeadDim = 128, kHeads = 32, kKvHeads = 8, kBlock = 16;
constexpr int64_t kKvDim = kKvHeads * kHeadDim;
constexpr std::size_t kCycleBytes = std::size_t{512} << 20;

bool have_device() { return ck::check_device().empty(); }

// Device-to-device copy bandwidth, bytes read + written per second, best of 5 copies of 1 GiB.
double copy_bandwidth() {
  static double best = 0;
  if (best > 0) return best;
  const std::size_t bytes = std::size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // warm-up
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(start);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best = std::max(best, 2.0 * static_cast<double>(bytes) / (ms * 1e-3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return best;
}

// Times run(copy) per benchmark iteration with CUDA events (manual time), cycling through
// `copies` after a warm-up on copy 0; returns the total kernel seconds. A run that fails
// stops the loop and skips the benchmark with its error.
template <class Run>
double timed_iterations(benchmark::State& state, int64_t copies, const Run& run) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::string error = run(0);  // warm-up
  cudaDeviceSynchronize();
  double total_s = 0;
  int64_t copy = 0;
  for (auto _ : state) {
    copy = (copy + 1) % copies;
    cudaEventRecord(start);
    error = run(copy);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    if (!error.empty()) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
    total_s += ms * 1e-3;
  }
  if (!error.empty()) state.SkipWithError(error.c_str());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return total_s;
}

void BM_DecodeAttention(benchmark::State& state) {
  if (!have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t batch = state.range(0), context = state.range(1);
  const int64_t blocks_per_seq = context / kBlock;
  const std::size_t kv_bytes = static_cast<std::size_t>(batch * context * kKvDim) * 2 * 2;  // K and V, bf16
  const int64_t copies = std::max<int64_t>(1, static_cast<int64_t>((kCycleBytes + kv_bytes - 1) / kv_bytes));
  const int64_t pool_blocks = copies * batch * blocks_per_seq;
  const std::size_t pool_bytes = static_cast<std::size_t>(pool_blocks * kBlock * kKvDim) * 2;
  void *k_pool = nullptr, *v_pool = nullptr;
  if (cudaMalloc(&k_pool, pool_bytes) != cudaSuccess || cudaMalloc(&v_pool, pool_bytes) != cudaSuccess) {
    state.SkipWithError("cudaMalloc of the pools failed");
    return;
  }
  cudaMemset(k_pool, 0, pool_bytes);
  cudaMemset(v_pool, 0, pool_bytes);
  // Copy c's block tables: sequence s reads blocks (c * batch + s) * blocks_per_seq + b.
  std::vector<int32_t> tables(static_cast<std::size_t>(copies * batch * blocks_per_seq));
  for (std::size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  const std::vector<int32_t> seq_of_token = [&] {
    std::vector<int32_t> v(static_cast<std::size_t>(batch));
    for (int64_t s = 0; s < batch; ++s) v[static_cast<std::size_t>(s)] = static_cast<int32_t>(s);
    return v;
  }();
  const std::vector<int32_t> positions(static_cast<std::size_t>(batch), static_cast<int32_t>(context - 1));
  const int64_t parts = ck::attention_partitions(context - 1, kvp::kernels::kDefaultAttentionPartition);
  int32_t *d_tables = nullptr, *d_seq = nullptr, *d_pos = nullptr;
  float *d_q = nullptr, *d_out = nullptr, *d_ws = nullptr;
  cudaMalloc(&d_tables, tables.size() * 4);
  cudaMalloc(&d_seq, seq_of_token.size() * 4);
  cudaMalloc(&d_pos, positions.size() * 4);
  cudaMalloc(&d_q, static_cast<std::size_t>(batch * kHeads * kHeadDim) * 4);
  cudaMalloc(&d_out, static_cast<std::size_t>(batch * kHeads * kHeadDim) * 4);
  cudaMalloc(&d_ws, static_cast<std::size_t>(ck::attention_workspace_floats(batch, kHeads, kHeadDim, parts)) * 4);
  // The engine's one-launch merge: tickets zeroed once, left zero by every launch.
  int32_t* d_counters = nullptr;
  cudaMalloc(&d_counters, static_cast<std::size_t>(batch * kKvHeads) * 4);
  cudaMemset(d_counters, 0, static_cast<std::size_t>(batch * kKvHeads) * 4);
  cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_seq, seq_of_token.data(), seq_of_token.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_pos, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(d_q, 0, static_cast<std::size_t>(batch * kHeads * kHeadDim) * 4);
  const float scale = 1.0f / 11.3137085f;
  const auto run = [&](int64_t c) {
    return ck::attention(d_q, kvp::DType::kBF16, k_pool, v_pool, d_tables + c * batch * blocks_per_seq, blocks_per_seq,
                         d_seq, d_pos, batch, kHeads, kKvHeads, kHeadDim, kBlock, scale,
                         kvp::kernels::kDefaultAttentionPartition, parts, d_ws, d_out, nullptr, nullptr,
                         ck::AttentionVariant::kExact, 0, 0.0f, d_counters);
  };
  const double total_s = timed_iterations(state, copies, run);
  const double bytes = static_cast<double>(kv_bytes) + 2.0 * static_cast<double>(batch * kHeads * kHeadDim) * 4;
  const double iterations = static_cast<double>(state.iterations());
  const double gbps = total_s > 0 ? bytes * iterations / total_s / 1e9 : 0;
  state.counters["GB/s"] = gbps;
  state.counters["copy_GB/s"] = copy_bandwidth() / 1e9;
  state.counters["of_copy"] = copy_bandwidth() > 0 ? gbps * 1e9 / copy_bandwidth() : 0;
  for (void* p :
       {static_cast<void*>(d_tables), static_cast<void*>(d_seq), static_cast<void*>(d_pos), static_cast<void*>(d_q),
        static_cast<void*>(d_out), static_cast<void*>(d_ws), static_cast<void*>(d_counters), k_pool, v_pool})
    cudaFree(p);
}

BENCHMARK(BM_DecodeAttention)
    ->ArgsProduct({{1, 16, 64, 256}, {512, 4096, 32768}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// A projection y = W x (kvproof's project kernel, fp32 weights), with one thread per weight
// row (lanes 1) and with a half-warp per row (lanes 16, the engine's default on a GPU): the same
// bits, so the ratio between the two is what coalesced weight reads buy. Achieved bandwidth =
// weight bytes / kernel time (x and y are under 1% of it), against the copy bandwidth of the
// same run; weights cycled through copies of at least 512 MiB so no iteration finds them in L2.
// Shapes: SmolLM2-135M's q (576 x 576), gate (1536 x 576) and down (576 x 1536), Llama-3.2-1B's
// q (2048 x 2048), gate (8192 x 2048) and down (2048 x 8192); 1 and 32 tokens.
void BM_Projection(benchmark::State& state) {
  if (!have_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int64_t out_dim = state.range(0), in_dim = state.range(1), tokens = state.range(2);
  const int lanes = static_cast<int>(state.range(3));
  const bool bf16 = state.range(4) != 0;  // bf16 weights: half the bytes, the same arithmetic
  if (!ck::set_project_lanes(lanes)) {
    state.SkipWithError("set_project_lanes refused the lane count");
    return;
  }
  const std::size_t w_bytes = static_cast<std::size_t>(out_dim * in_dim) * (bf16 ? 2 : sizeof(float));
  const int64_t copies = std::max<int64_t>(1, static_cast<int64_t>((kCycleBytes + w_bytes - 1) / w_bytes));
  char* d_w = nullptr;
  float *d_x = nullptr, *d_y = nullptr;
  if (cudaMalloc(&d_w, w_bytes * static_cast<std::size_t>(copies)) != cudaSuccess ||
      cudaMalloc(&d_x, static_cast<std::size_t>(tokens * in_dim) * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&d_y, static_cast<std::size_t>(tokens * out_dim) * sizeof(float)) != cudaSuccess) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  cudaMemset(d_w, 0, w_bytes * static_cast<std::size_t>(copies));
  cudaMemset(d_x, 0, static_cast<std::size_t>(tokens * in_dim) * sizeof(float));
  const auto run = [&](int64_t c) {
    return ck::project(ck::Weights(d_w + static_cast<std::size_t>(c) * w_bytes, bf16), nullptr, out_dim, in_dim, d_x,
                       tokens, d_y);
  };
  const double total_s = timed_iterations(state, copies, run);
  const double gbps =
      total_s > 0 ? static_cast<double>(w_bytes) * static_cast<double>(state.iterations()) / total_s / 1e9 : 0;
  state.counters["GB/s"] = gbps;
  state.counters["copy_GB/s"] = copy_bandwidth() / 1e9;
  state.counters["of_copy"] = copy_bandwidth() > 0 ? gbps * 1e9 / copy_bandwidth() : 0;
  cudaFree(d_w);
  cudaFree(d_x);
  cudaFree(d_y);
  ck::set_project_lanes(16);
}

void projection_shapes(benchmark::internal::Benchmark* b) {
  const int64_t shapes[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {2048, 2048}, {8192, 2048}, {2048, 8192}};
  for (const auto& shape : shapes)
    for (const int64_t tokens : {1, 32})
      for (const int64_t lanes : {1, 16})
        for (const int64_t bf16 : {0, 1}) b->Args({shape[0], shape[1], tokens, lanes, bf16});
}

BENCHMARK(BM_Projection)
    ->ArgNames({"out", "in", "tokens", "lanes", "bf16"})
    ->Apply(projection_shapes)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
