// Speculative decoding on the CPU backend: target forwards per generated token and wall-clock
// generated tokens/s, with and without speculation, measured in one run and reported as
// ratios (these machines are noisy; compare within a run). Build in Release:
//   cmake --preset release && cmake --build build-release --target speculation_bench
//   build-release/bin/speculation_bench
// Workloads (greedy, so every run generates exactly the same tokens):
//   repetitive  prompts made of repeated motifs (boilerplate, code), n-gram proposer
//   random      random prompts, draft model (the target's first layer: make_draft_model)
// Counters: speedup = spec tok/s / plain tok/s; fwd_ratio = target forwards per token,
// spec / plain; acceptance = accepted / proposed drafts.
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/rng.h"
#include "model/presets.h"
#include "optimized/backends/cpu_backend.h"
#include "optimized/backends/plan_validation.h"
#include "optimized/engine/engine.h"
#include "optimized/engine/speculation.h"
#include "optimized/engine/workload.h"

namespace kvp {
namespace {

const Model& model() {
  static const Model m = *make_preset("small");
  return m;
}

Workload make_workload(bool repetitive) {
  Workload w{repetitive ? "repetitive" : "random", {}};
  Rng rng(42);
  for (int i = 0; i < 4; ++i) {
    WorkloadRequest r;
    std::vector<int32_t> motif(8);
    for (auto& t : motif) t = static_cast<int32_t>(rng.below(2048));
    for (int j = 0; j < 96; ++j)
      r.spec.prompt.push_back(repetitive ? motif[static_cast<std::size_t>(j) % motif.size()]
                                         : static_cast<int32_t>(rng.below(2048)));
    r.spec.max_tokens = 64;
    w.requests.push_back(r);
  }
  return w;
}

struct Measured {
  double seconds = 0;
  EngineMetrics metrics;
};

Measured run(const Workload& w, SpeculationParams speculation) {
  EngineConfig c;
  c.kv.pool = pool_shape_for(model().config, 16, 64, 0);
  c.scheduler.max_num_batched_tokens = 1024;
  c.scheduler.max_num_seqs = 8;
  c.scheduler.prefill_chunk_size = 1024;
  c.scheduler.max_model_len = 1024;
  c.vocab_size = model().config.vocab_size;
  c.speculation = speculation;
  CpuBackendConfig bc;
  bc.pool = c.kv.pool;
  CpuBackend backend(model(), bc);
  Engine engine(c, backend);
  if (speculation.proposer == ProposerKind::kDraft) {
    static const Model draft = make_draft_model(model(), default_draft_layers(model().config));
    KvCacheConfig kv;
    kv.pool = pool_shape_for(draft.config, 16, 64, 0);
    CpuBackendConfig dbc;
    dbc.pool = kv.pool;
    engine.set_draft_proposer(
        std::make_unique<DraftModelProposer>(std::make_unique<CpuBackend>(draft, dbc), kv, draft.config.vocab_size));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_workload(engine, w, 100000);
  Measured m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.metrics = engine.metrics();
  if (!r) m.seconds = -1;
  return m;
}

void BM_Speculation(benchmark::State& state, bool repetitive, ProposerKind kind, int32_t k) {
  const Workload w = make_workload(repetitive);
  Measured plain, spec;
  for (auto _ : state) {
    plain = run(w, {});
    spec = run(w, {kind, k});
  }
  if (plain.seconds < 0 || spec.seconds < 0) state.SkipWithError("a run failed");
  const auto tok = [](const Measured& m) {
    return static_cast<double>(m.metrics.counters.generated_tokens) / m.seconds;
  };
  state.counters["plain_tok_s"] = tok(plain);
  state.counters["spec_tok_s"] = tok(spec);
  state.counters["speedup"] = tok(spec) / tok(plain);
  state.counters["plain_fwd_per_tok"] = plain.metrics.forwards_per_token;
  state.counters["spec_fwd_per_tok"] = spec.metrics.forwards_per_token;
  state.counters["fwd_ratio"] = spec.metrics.forwards_per_token / plain.metrics.forwards_per_token;
  state.counters["acceptance"] = spec.metrics.acceptance_rate;
  state.counters["mean_accepted"] = spec.metrics.mean_accepted_length;
}

BENCHMARK_CAPTURE(BM_Speculation, repetitive_ngram_k4, true, ProposerKind::kNgram, 4)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Speculation, random_ngram_k4, false, ProposerKind::kNgram, 4)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Speculation, repetitive_draft_k4, true, ProposerKind::kDraft, 4)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Speculation, random_draft_k4, false, ProposerKind::kDraft, 4)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvp

BENCHMARK_MAIN();
