// Engine benchmarks. Build in Release (cmake --preset release) and run
//   build-release/bin/engine_bench
// Numbers are meant as ratios within one run (these machines are noisy):
//   - decode tokens/s of the paged engine at batch 1, 8, 32 on 1 and 2 threads (small preset,
//     context 128 to 328; and batch 1, 32 on the SmolLM2-135M shape) against the reference's
//     one-sequence dense decode loop;
//   - paged attention (one head, block size 16, scrambled block table) against a dense
//     attention over contiguous K/V of the same length: the goal is a flat ratio;
//   - scheduler + engine step overhead with 256 running sequences on a model-free backend.
#include <benchmark/benchmark.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu_attention.h"
#include "model/presets.h"
#include "optimized/backends/cpu_backend.h"
#include "optimized/backends/plan_validation.h"
#include "optimized/engine/engine.h"
#include "reference/reference_model.h"
#include "tests/fake_backend.h"

namespace kvp {
namespace {

const Model& small_model() {
  static const Model m = *make_preset("small");
  return m;
}

std::vector<int32_t> prompt(int64_t n, uint64_t seed, int64_t vocab) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return t;
}

// Decode steps of `batch` sequences (state.range(0)) on state.range(1) threads, after one
// prefill step of their prompts.
void decode(benchmark::State& state, const Model& model, int64_t prompt_len, int32_t max_tokens) {
  const auto batch = static_cast<int32_t>(state.range(0));
  const auto threads = static_cast<int>(state.range(1));
  EngineConfig c;
  // Room for every sequence's whole life: no preemption while timing.
  const auto blocks_per_seq = static_cast<int32_t>((prompt_len + max_tokens + 15) / 16 + 1);
  c.kv.pool = pool_shape_for(model.config, 16, batch * blocks_per_seq, 0);
  c.scheduler.max_num_batched_tokens = 4096;
  c.scheduler.max_num_seqs = batch;
  c.scheduler.prefill_chunk_size = 4096;
  c.scheduler.max_model_len = 4096;
  c.vocab_size = model.config.vocab_size;
  CpuBackendConfig bc;
  bc.pool = c.kv.pool;
  bc.num_threads = threads;
  CpuBackend backend(model, bc);
  Engine engine(c, backend);
  for (int32_t i = 0; i < batch; ++i) {
    RequestSpec s;
    s.prompt = prompt(prompt_len, static_cast<uint64_t>(i), model.config.vocab_size);
    s.max_tokens = max_tokens;
    engine.add_request(s);
  }
  if (!engine.step().is_ok()) state.SkipWithError("prefill failed");  // the prefill step
  for (auto _ : state) {
    if (!engine.step().is_ok()) state.SkipWithError("decode step failed");
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * batch, benchmark::Counter::kIsRate);
}

// The small preset (21 MB of fp32 weights: they stay in this machine's L3 cache), context
// 128 to 328.
void BM_EngineDecode(benchmark::State& state) { decode(state, small_model(), 128, 400); }
BENCHMARK(BM_EngineDecode)
    ->ArgNames({"batch", "threads"})
    ->Args({1, 1})
    ->Args({8, 1})
    ->Args({32, 1})
    ->Args({1, 2})
    ->Args({8, 2})
    ->Args({32, 2})
    ->Iterations(200)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The SmolLM2-135M shape (540 MB of fp32 weights, read from memory once per step): the
// regime where a batch pays for its weight reads once. Context 32 to 62.
void BM_EngineDecodeSmolLM2(benchmark::State& state) {
  static const Model m = *make_preset("smollm2-135m", 1, 2);
  decode(state, m, 32, 64);
}
// Args: batch, threads.
BENCHMARK(BM_EngineDecodeSmolLM2)
    ->ArgNames({"batch", "threads"})
    ->Args({1, 1})
    ->Args({32, 1})
    ->Args({1, 2})
    ->Args({32, 2})
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_ReferenceDenseDecode(benchmark::State& state) {
  const ReferenceModel<float> model(small_model());
  auto cache = model.make_cache(4096);
  (void)model.forward(prompt(128, 0, small_model().config.vocab_size), cache);
  const std::vector<int32_t> one = {7};
  for (auto _ : state) {
    if (cache.length() + 1 >= cache.capacity()) state.SkipWithError("cache full");
    auto r = model.forward(one, cache);
    benchmark::DoNotOptimize(r);
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReferenceDenseDecode)->Iterations(200)->Unit(benchmark::kMillisecond);

// One query head over `context` positions: paged (block size 16, blocks in scrambled order)
// against dense (contiguous K/V, the same online-softmax arithmetic without a table).
struct AttentionSetup {
  int64_t context, head_dim = 64, num_kv_heads = 1, block_size = 16;
  std::vector<float> k, v, q, out, scratch;
  std::vector<int32_t> table;
  explicit AttentionSetup(int64_t n) : context(n) {
    const int64_t blocks = (n + block_size - 1) / block_size;
    Rng rng(1);
    k.resize(static_cast<std::size_t>(blocks * block_size * head_dim));
    v.resize(k.size());
    for (auto& x : k) x = static_cast<float>(rng.uniform(-1, 1));
    for (auto& x : v) x = static_cast<float>(rng.uniform(-1, 1));
    q.resize(static_cast<std::size_t>(head_dim));
    for (auto& x : q) x = static_cast<float>(rng.uniform(-1, 1));
    out.resize(q.size());
    scratch.resize(static_cast<std::size_t>(kernels::attention_scratch_size<float>(head_dim)));
    table.resize(static_cast<std::size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    for (std::size_t i = table.size(); i > 1; --i) std::swap(table[i - 1], table[rng.below(i)]);
  }
};

void BM_PagedAttention(benchmark::State& state) {
  AttentionSetup s(state.range(0));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  for (auto _ : state) {
    kernels::paged_attention_head(s.q.data(), s.k.data(), s.v.data(), s.table.data(), s.block_size, s.num_kv_heads, 0,
                                  s.head_dim, s.context - 1, scale, kernels::kDefaultAttentionPartition,
                                  s.scratch.data(), s.out.data());
    benchmark::DoNotOptimize(s.out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * s.context * s.head_dim * 2 * 4);
}
BENCHMARK(BM_PagedAttention)->RangeMultiplier(4)->Range(128, 8192);

// The same head over an fp8-e4m3 pool (codes of x / 0.01, read as code * 0.01): a quarter of
// the bytes, each row decoded into fp32 (a 256-entry table on the host) before the fp32 math.
void BM_PagedAttentionFp8E4M3(benchmark::State& state) {
  AttentionSetup s(state.range(0));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const float kv_scale = 0.01f;
  std::vector<kernels::F8E4M3Bits> k(s.k.size()), v(s.v.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    kernels::kv_store(&k[i], s.k[i] / kv_scale);
    kernels::kv_store(&v[i], s.v[i] / kv_scale);
  }
  std::vector<float> scratch(
      static_cast<std::size_t>(kernels::attention_scratch_size<kernels::F8E4M3Bits>(s.head_dim)));
  for (auto _ : state) {
    kernels::paged_attention_head(s.q.data(), k.data(), v.data(), s.table.data(), s.block_size, s.num_kv_heads, 0,
                                  s.head_dim, s.context - 1, scale, kernels::kDefaultAttentionPartition, scratch.data(),
                                  s.out.data(), &kv_scale, &kv_scale);
    benchmark::DoNotOptimize(s.out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * s.context * s.head_dim * 2);
}
BENCHMARK(BM_PagedAttentionFp8E4M3)->RangeMultiplier(4)->Range(128, 8192);

void BM_DenseAttention(benchmark::State& state) {
  AttentionSetup s(state.range(0));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  // The identity table over contiguous storage with one block as long as the context: the
  // same kernel reading K/V densely, so the ratio isolates the cost of paging.
  std::vector<int32_t> identity = {0};
  for (auto _ : state) {
    kernels::paged_attention_head(s.q.data(), s.k.data(), s.v.data(), identity.data(),
                                  static_cast<int64_t>(s.table.size()) * s.block_size, s.num_kv_heads, 0, s.head_dim,
                                  s.context - 1, scale, kernels::kDefaultAttentionPartition, s.scratch.data(),
                                  s.out.data());
    benchmark::DoNotOptimize(s.out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * s.context * s.head_dim * 2 * 4);
}
BENCHMARK(BM_DenseAttention)->RangeMultiplier(4)->Range(128, 8192);

// Scheduler + engine bookkeeping per step with 256 running decodes (model-free backend).
void BM_SchedulerStep256(benchmark::State& state) {
  const int64_t vocab = 16;
  EngineConfig c;
  c.kv.pool.block_size = 16;
  c.kv.pool.num_device_blocks = 256 * 80;
  c.scheduler.max_num_batched_tokens = 8192;
  c.scheduler.max_num_seqs = 256;
  c.scheduler.prefill_chunk_size = 8192;
  c.scheduler.max_model_len = 1 << 16;
  c.vocab_size = vocab;
  const EngineConfig engine_config = c;
  testing::FakeBackend backend(engine_config.kv.pool, vocab);
  Engine engine(engine_config, backend);
  for (int i = 0; i < 256; ++i) {
    RequestSpec s;
    s.prompt = prompt(64, static_cast<uint64_t>(i), vocab);
    s.max_tokens = 1000;
    engine.add_request(s);
  }
  if (!engine.step().is_ok()) state.SkipWithError("prefill failed");
  for (auto _ : state) {
    if (!engine.has_unfinished() || !engine.step().is_ok()) state.SkipWithError("step failed");
  }
}
BENCHMARK(BM_SchedulerStep256)->Unit(benchmark::kMicrosecond)->Iterations(900);

}  // namespace
}  // namespace kvp

BENCHMARK_MAIN();
