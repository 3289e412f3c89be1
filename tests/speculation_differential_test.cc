// Speculative decoding in the engine, and the proofs that it changes nothing: greedy
// speculation is bitwise equal to plain decoding across schedules (block size, chunk size,
// prefix hits, both preemption modes, forks, cancellations), every invariant holds after
// every step (I9 accepted-only cache included, the draft model's own cache too), nothing
// leaks, the event log of the rollbacks replays; sampled speculation keeps the target's
// distribution (a two-sample chi-squared test whose power is shown on a planted bug in
// every run); `kvproof verify --speculate` passes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "optimized/backends/cpu_backend.h"
#include "optimized/backends/plan_validation.h"
#include "optimized/checkers/engine_invariants.h"
#include "optimized/checkers/event_log_replay.h"
#include "optimized/checkers/invariants.h"
#include "optimized/engine/engine.h"
#include "optimized/engine/speculation.h"
#include "optimized/engine/workload.h"
#include "tests/micro_model.h"
#include "verify/verify.h"

namespace kvp {
namespace {

using V = std::vector<int32_t>;

// ---------------------------------------------------------------- the engine

using ::kvp::test_models::micro_model;

struct SpecSetup {
  int32_t block_size = 4;
  int32_t num_blocks = 40;
  int32_t chunk = 16;
  int32_t budget = 48;
  PreemptionMode mode = PreemptionMode::kRecompute;
  bool prefix_caching = true;
  SpeculationParams speculation;
  AcceptanceRule rule = AcceptanceRule::kRejectionSampling;
  int32_t max_seqs = 8;
};

struct Run {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Engine> engine;
  WorkloadRun run;
  EventLog log;
  std::string failure;  // first invariant failure
};

std::unique_ptr<Run> run_engine(const Model& model, const SpecSetup& s, const Workload& w) {
  auto out = std::make_unique<Run>();
  EngineConfig ec;
  ec.kv.pool = pool_shape_for(model.config, s.block_size, s.num_blocks, s.num_blocks);
  ec.kv.watermark_blocks = 1;
  ec.kv.enable_prefix_caching = s.prefix_caching;
  ec.kv.poison_on_free = true;
  ec.scheduler.max_num_batched_tokens = s.budget;
  ec.scheduler.max_num_seqs = s.max_seqs;
  ec.scheduler.max_model_len = 128;
  ec.scheduler.prefill_chunk_size = s.chunk;
  ec.scheduler.preemption = s.mode;
  ec.vocab_size = model.config.vocab_size;
  ec.speculation = s.speculation;
  ec.acceptance_rule = s.rule;
  CpuBackendConfig bc;
  bc.pool = ec.kv.pool;
  out->backend = std::make_unique<CpuBackend>(model, bc);
  out->engine = std::make_unique<Engine>(ec, *out->backend);
  Engine& e = *out->engine;
  e.set_draft_proposer(verify::make_draft_proposer(make_draft_model(model, 1), s.max_seqs, 128, 1));
  e.set_kv_event_log(&out->log);
  Run* r = out.get();
  e.set_plan_observer([r](const Engine& eng, const BatchPlan& plan) {
    Status st = check_plan(eng, plan);
    if (!st && r->failure.empty()) r->failure = "plan: " + st.message();
    return st;
  });
  e.set_step_observer([r](const Engine& eng, const BatchPlan& plan) {
    Status st = check_engine_state(eng);
    if (st) {
      const auto* draft = dynamic_cast<const DraftModelProposer*>(eng.draft_proposer());
      if (draft != nullptr) st = check_all(draft->kv()).with_context("draft model's cache");
    }
    if (!st && r->failure.empty()) r->failure = "after step " + std::to_string(plan.step) + ": " + st.message();
    return st;
  });
  auto run = run_workload(e, w, 100000);
  if (!run && r->failure.empty()) r->failure = run.status().message();
  if (run) r->run = *run;
  return out;
}

// Prompts with repetition (so the n-gram proposer finds matches), a shared prefix (prefix
// hits), a fork, a cancellation and a sampled request.
Workload repetitive_workload() {
  Workload w{"repetitive", {}};
  const V motif = {5, 9, 14, 3, 22, 7};
  const V system = {40, 41, 42, 43, 44, 45, 46, 47, 48, 49};
  for (int i = 0; i < 8; ++i) {
    WorkloadRequest r;
    r.spec.prompt = system;
    for (int rep = 0; rep < 2 + i % 3; ++rep)
      for (int32_t t : motif) r.spec.prompt.push_back((t + i) % 64);
    r.spec.max_tokens = 18 + i;
    r.spec.capture_logits = true;
    r.arrival_step = i % 3;
    if (i == 3) r.spec.n = 2;  // fork (greedy samples are alike, but share and copy blocks)
    if (i == 5) r.cancel_step = 7;
    if (i == 6) r.spec.sampling = SamplingParams{0.8f, 0, 1.0f, 77};
    w.requests.push_back(r);
  }
  return w;
}

// Tokens and logits of every request (children by index) equal bitwise; for cancelled
// requests, up to where the shorter run stopped. Returns the positions compared.
int64_t expect_same_as_plain(const Engine& spec, const Engine& plain, RequestId a, RequestId b,
                             const std::string& where) {
  const Request& x = spec.request(a);
  const Request& y = plain.request(b);
  const bool cancelled = x.finish() == FinishReason::kCancelled || y.finish() == FinishReason::kCancelled;
  const std::size_t n = std::min(x.tokens().size(), y.tokens().size());
  std::size_t agree = 0;
  while (agree < n && x.tokens()[agree] == y.tokens()[agree]) ++agree;
  int64_t compared = 0;
  if (x.spec.sampling.greedy()) {
    EXPECT_EQ(agree, n) << where << " request " << a;
    if (!cancelled) {
      EXPECT_EQ(x.tokens(), y.tokens()) << where << " request " << a;
      EXPECT_EQ(x.finish(), y.finish()) << where << " request " << a;
    }
  }
  for (std::size_t p = 0; p < agree && p < x.logits.size() && p < y.logits.size(); ++p) {
    if (x.logits[p].empty() || y.logits[p].empty()) continue;
    EXPECT_EQ(x.logits[p], y.logits[p]) << where << " request " << a << " position " << p;
    ++compared;
  }
  EXPECT_EQ(x.recomputed_logit_mismatches, 0) << where;
  EXPECT_EQ(x.children.size(), y.children.size()) << where;
  for (std::size_t c = 0; c < x.children.size() && c < y.children.size(); ++c)
    compared += expect_same_as_plain(spec, plain, x.children[c], y.children[c], where);
  return compared;
}

void expect_clean_end(Run& r, const std::string& where) {
  EXPECT_TRUE(r.failure.empty()) << where << ": " << r.failure;
  EXPECT_TRUE(check_no_leak(r.engine->kv()).is_ok()) << where;
  EXPECT_TRUE(r.engine->flush_prefix_cache_when_idle().is_ok()) << where;
  const Status all_free = check_all_free(r.engine->kv());
  EXPECT_TRUE(all_free.is_ok()) << where << ": " << all_free.message();
  const auto* draft = dynamic_cast<const DraftModelProposer*>(r.engine->draft_proposer());
  ASSERT_NE(draft, nullptr);
  const Status draft_free = check_all_free(draft->kv());  // the draft model's own cache, rolled back and freed
  EXPECT_TRUE(draft_free.is_ok()) << where << ": draft model: " << draft_free.message();
  const ReplayResult replay = replay_event_log(r.log.text());
  EXPECT_TRUE(replay.ok()) << where << ": " << replay.message;
  EXPECT_EQ(replay.device_in_use, 0) << where;
}

// The main differential: greedy speculation (both proposers, several k) against plain
// decoding, over a grid of schedules that exercises preemption (small pools), swapping,
// chunked prefill, prefix hits, a fork and a cancellation.
TEST(Speculation, GreedySpeculationIsBitwisePlainDecodingAcrossSchedules) {
  const Workload w = repetitive_workload();
  struct Case {
    int32_t block_size, num_blocks, chunk;
    PreemptionMode mode;
    bool prefix;
  };
  const Case cases[] = {
      {4, 40, 16, PreemptionMode::kRecompute, true}, {4, 24, 5, PreemptionMode::kSwap, true},
      {1, 90, 7, PreemptionMode::kRecompute, false}, {16, 9, 32, PreemptionMode::kSwap, true},
      {2, 50, 3, PreemptionMode::kRecompute, true},
  };
  int64_t accepted = 0, preemptions = 0, swaps = 0, prefix_hits = 0, compared = 0;
  for (const Case& c : cases) {
    SpecSetup plain_setup;
    plain_setup.block_size = c.block_size;
    plain_setup.num_blocks = c.num_blocks;
    plain_setup.chunk = c.chunk;
    plain_setup.mode = c.mode;
    plain_setup.prefix_caching = c.prefix;
    auto plain = run_engine(micro_model(), plain_setup, w);
    ASSERT_TRUE(plain->failure.empty()) << plain->failure;
    for (ProposerKind kind : {ProposerKind::kNgram, ProposerKind::kDraft}) {
      for (int32_t k : {1, 3, 6}) {
        SpecSetup s = plain_setup;
        s.speculation = {kind, k};
        const std::string where = std::string(to_string(kind)) + " k=" + std::to_string(k) +
                                  " bs=" + std::to_string(c.block_size) + " blocks=" + std::to_string(c.num_blocks) +
                                  " chunk=" + std::to_string(c.chunk) +
                                  (c.mode == PreemptionMode::kSwap ? " swap" : " recompute");
        auto spec = run_engine(micro_model(), s, w);
        ASSERT_TRUE(spec->failure.empty()) << where << ": " << spec->failure;
        for (std::size_t i = 0; i < w.requests.size(); ++i)
          compared += expect_same_as_plain(*spec->engine, *plain->engine, spec->run.ids[i], plain->run.ids[i], where);
        const EngineCounters& m = spec->engine->metrics().counters;
        accepted += m.spec_accepted;
        preemptions += m.preemptions;
        swaps += m.swaps_out;
        prefix_hits += m.prefix_hit_tokens;
        expect_clean_end(*spec, where);
      }
    }
  }
  // Not vacuous: drafts were accepted, and the schedules preempted, swapped and hit.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(swaps, 0);
  EXPECT_GT(prefix_hits, 0);
  EXPECT_GT(compared, 1000);
  std::printf(
      "[ spec     ] %lld drafts accepted, %lld preemptions, %lld swaps, %lld prefix-hit tokens, %lld positions "
      "compared\n",
      static_cast<long long>(accepted), static_cast<long long>(preemptions), static_cast<long long>(swaps),
      static_cast<long long>(prefix_hits), static_cast<long long>(compared));
}

TEST(Speculation, FewerTargetForwardsPerTokenOnRepetitiveText) {
  const Workload w = repetitive_workload();
  SpecSetup s;
  auto plain = run_engine(micro_model(), s, w);
  s.speculation = {ProposerKind::kNgram, 4};
  auto spec = run_engine(micro_model(), s, w);
  const EngineMetrics a = plain->engine->metrics(), b = spec->engine->metrics();
  std::printf("[ spec     ] ngram k=4: acceptance %.3f, mean accepted %.2f, forwards/token %.3f (plain %.3f)\n",
              b.acceptance_rate, b.mean_accepted_length, b.forwards_per_token, a.forwards_per_token);
  EXPECT_GT(b.acceptance_rate, 0.2);
  EXPECT_LT(b.forwards_per_token, a.forwards_per_token);
  EXPECT_EQ(a.counters.spec_steps, 0);
}

TEST(Speculation, RequestsChooseTheirProposerAndKInTheWorkload) {
  auto w = parse_workload(nlohmann::json::parse(R"({"requests": [
      {"prompt": [1, 2, 3, 1, 2, 3, 1, 2], "max_tokens": 12, "speculate": "ngram", "k": 3},
      {"prompt": [1, 2, 3, 1, 2, 3, 1, 2], "max_tokens": 12, "speculate": "off"}]})"),
                          64, 0);
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  auto run = run_engine(micro_model(), SpecSetup{}, *w);
  ASSERT_TRUE(run->failure.empty()) << run->failure;
  EXPECT_GT(run->engine->request(run->run.ids[0]).spec_steps, 0);
  EXPECT_EQ(run->engine->request(run->run.ids[1]).spec_steps, 0);
  EXPECT_EQ(run->engine->request(run->run.ids[0]).tokens(), run->engine->request(run->run.ids[1]).tokens());
  EXPECT_FALSE(
      parse_workload(nlohmann::json::parse(R"({"requests": [{"prompt": [1], "speculate": "yes"}]})"), 64, 0).is_ok());
  EXPECT_FALSE(parse_workload(nlohmann::json::parse(R"({"requests": [{"prompt": [1], "k": 99}]})"), 64, 0).is_ok());
}

TEST(Speculation, DraftRequestWithoutADraftModelIsRejected) {
  EngineConfig ec;
  ec.kv.pool = pool_shape_for(micro_model().config, 4, 16, 0);
  ec.vocab_size = 64;
  CpuBackendConfig bc;
  bc.pool = ec.kv.pool;
  CpuBackend backend(micro_model(), bc);
  Engine e(ec, backend);
  RequestSpec spec;
  spec.prompt = {1, 2};
  spec.speculation = SpeculationParams{ProposerKind::kDraft, 2};
  const RequestId id = e.add_request(spec);
  EXPECT_EQ(e.request(id).finish(), FinishReason::kRejected);
  EXPECT_NE(e.request(id).reject_reason().find("draft"), std::string::npos);
}

// `kvproof verify --speculate`: the whole check on the default model and workload, with the
// speculative-vs-plain comparison and the acceptance figures.
TEST(Speculation, VerifyWithSpeculationPassesAndReportsAcceptance) {
  const Model tiny = *make_preset("tiny");
  auto w = builtin_workload("mixed", tiny.config.vocab_size, 0);
  ASSERT_TRUE(w.is_ok());
  verify::VerifyOptions o;
  o.modes = {PreemptionMode::kSwap};
  o.speculation = {ProposerKind::kDraft, 3};
  auto report = verify::run_verify(tiny, *w, o);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_TRUE(report->passed()) << report->table();
  bool compared = false;
  for (const verify::CheckResult& c : report->checks)
    if (c.name == "speculative-vs-plain[swap]") compared = c.passed && c.count > 100;
  EXPECT_TRUE(compared) << report->table();
  EXPECT_NE(report->table().find("speculation[swap]"), std::string::npos) << report->table();
  EXPECT_GT(report->runs[0].second.counters.spec_accepted, 0);
}

// ---------------------------------------------------------------- the distribution

// Two-sample chi-squared test of homogeneity for equal sample sizes:
// X^2 = sum_i (a_i - b_i)^2 / (a_i + b_i) over cells, with cells whose pooled count is
// under 10 merged into one; df = cells - 1. Returns X^2 / threshold, where the threshold is
// the (1 - alpha) quantile of chi^2(df) by the Wilson-Hilferty approximation.
constexpr double kAlpha = 1e-3;
constexpr double kZ = 3.090232;  // standard normal (1 - 1e-3) quantile

double chi2_ratio(const std::map<int64_t, int64_t>& a, const std::map<int64_t, int64_t>& b, std::string& detail) {
  std::map<int64_t, std::pair<int64_t, int64_t>> cells;
  for (const auto& [k, v] : a) cells[k].first += v;
  for (const auto& [k, v] : b) cells[k].second += v;
  std::vector<std::pair<int64_t, int64_t>> merged;
  std::pair<int64_t, int64_t> rest{0, 0};
  for (const auto& [k, c] : cells) {
    if (c.first + c.second < 10) {
      rest.first += c.first;
      rest.second += c.second;
    } else {
      merged.push_back(c);
    }
  }
  if (rest.first + rest.second > 0) merged.push_back(rest);
  double x2 = 0;
  for (const auto& [x, y] : merged)
    if (x + y > 0) x2 += static_cast<double>((x - y) * (x - y)) / static_cast<double>(x + y);
  const double df = static_cast<double>(merged.size()) - 1;
  const double h = 2.0 / (9.0 * df);
  const double threshold = df * std::pow(1 - h + kZ * std::sqrt(h), 3);
  detail =
      "X^2 = " + std::to_string(x2) + ", df = " + std::to_string(df) + ", threshold = " + std::to_string(threshold);
  return x2 / threshold;
}

struct Counts {
  std::map<int64_t, int64_t> first, second, pair;
};

// The micro model with 16 tokens and 64 positions (seed 21).
const Model& vocab16_model() {
  static const Model m = [] {
    ModelConfig c = ::kvp::test_models::micro_config();
    c.vocab_size = 16;
    c.max_position_embeddings = 64;
    return make_random_model(c, 21);
  }();
  return m;
}

constexpr int kSamples = 6000;

Counts sample(const SpecSetup& s) {
  Workload w{"samples", {}};
  const V prompt = {3, 7, 1, 12, 3, 7, 9, 0, 4, 15, 6, 2, 11, 5, 8, 10, 13, 14, 3, 7, 1};
  for (int i = 0; i < kSamples; ++i) {
    WorkloadRequest r;
    r.spec.prompt = prompt;
    r.spec.max_tokens = 3;
    r.spec.sampling = SamplingParams{1.0f, 0, 1.0f, static_cast<uint64_t>(1000 + i)};
    w.requests.push_back(r);
  }
  SpecSetup big = s;
  big.num_blocks = 64 * 8 + 8;
  big.budget = 1024;
  big.chunk = 32;
  big.max_seqs = 64;
  auto run = run_engine(vocab16_model(), big, w);
  EXPECT_TRUE(run->failure.empty()) << run->failure;
  Counts c;
  for (RequestId id : run->run.ids) {
    const std::vector<int32_t> out = run->engine->request(id).output();
    if (out.size() != 3) continue;
    ++c.first[out[0]];
    ++c.second[out[1]];
    ++c.pair[out[1] * 16 + out[2]];
  }
  return c;
}

// Sampling with speculation draws each token from the target's distribution: generated
// token 1 (the first one a verification decides) and the pair (token 1, token 2) have the
// same distribution as plain sampling, by a test with false-alarm rate alpha = 1e-3 per
// comparison; the same test rejects a planted bug (drafts accepted without the ratio test).
// Seeds are fixed, so the verdicts are deterministic.
TEST(Speculation, SampledSpeculationKeepsTheTargetsDistribution) {
  const Counts plain = sample(SpecSetup{});
  for (ProposerKind kind : {ProposerKind::kNgram, ProposerKind::kDraft}) {
    SpecSetup s;
    s.speculation = {kind, 2};
    const Counts spec = sample(s);
    std::string detail;
    EXPECT_LT(chi2_ratio(spec.first, plain.first, detail), 1.0) << to_string(kind) << " first token: " << detail;
    EXPECT_LT(chi2_ratio(spec.second, plain.second, detail), 1.0) << to_string(kind) << " second token: " << detail;
    std::printf("[ stats    ] %s, second token: %s\n", to_string(kind), detail.c_str());
    EXPECT_LT(chi2_ratio(spec.pair, plain.pair, detail), 1.0) << to_string(kind) << " pairs: " << detail;
    std::printf("[ stats    ] %s, pairs: %s\n", to_string(kind), detail.c_str());

    s.rule = AcceptanceRule::kNoRatioTest;  // the planted bug
    const Counts broken = sample(s);
    const double power_second = chi2_ratio(broken.second, plain.second, detail);
    EXPECT_GT(power_second, 1.0) << to_string(kind) << " planted bug not caught on the second token: " << detail;
    const double power_pair = chi2_ratio(broken.pair, plain.pair, detail);
    EXPECT_GT(power_pair, 1.0) << to_string(kind) << " planted bug not caught on pairs: " << detail;
    std::printf("[ stats    ] %s with the planted bug (no ratio test), pairs: %s\n", to_string(kind), detail.c_str());
  }
}

}  // namespace
}  // namespace kvp
