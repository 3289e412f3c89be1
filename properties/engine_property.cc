// Properties of the serving engine.
//   - Non-interference (N1): a target request's tokens and logits are bitwise identical
//     whatever runs beside it and whatever the schedule (block size, chunk size, token
//     budget, preemption mode, pool size, prefix caching, arrival step).
//   - Scheduler contract under random arrivals and cancellations on a small pool: I8
//     bounds on every plan, every invariant after every step, progress within a bound,
//     every request ends exactly once, conservative admission never preempts, no leak.
#include <algorithm>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "kernels/kv_index.h"
#include "model/presets.h"
#include "optimized/backends/cpu_backend.h"
#include "optimized/backends/plan_validation.h"
#include "optimized/checkers/engine_invariants.h"
#include "optimized/engine/engine.h"
#include "optimized/engine/workload.h"
#include "tests/fake_backend.h"
#include "tests/micro_model.h"

namespace kvp {
namespace {

constexpr int64_t kMaxLen = 48;

using ::kvp::test_models::micro_model;

struct Schedule {
  int32_t block_size, num_blocks, chunk, budget, max_seqs;
  PreemptionMode mode;
  AdmissionRule admission;
  bool prefix_caching;
  SpeculationParams speculation = {};       // every request's (off: plain decoding)
  int64_t window = 0;                       // KvCacheConfig::sliding_window (the fake backend's only)
  std::vector<int64_t> group_windows = {};  // KvCacheConfig::group_windows (the fake backend's only)
};

// Draw functions (called inside a property, where *gen draws a value).
Schedule draw_schedule() {
  const int32_t bs = *rc::gen::element(1, 2, 3, 4, 8);
  // Enough blocks for the longest request (kMaxLen tokens) plus the watermark.
  const auto need = static_cast<int32_t>(kernels::blocks_for_tokens(kMaxLen, bs)) + 1;
  Schedule s{bs,
             need + *rc::gen::inRange(0, 10),
             *rc::gen::inRange(1, 20),
             *rc::gen::inRange(8, 64),
             *rc::gen::inRange(1, 8),
             PreemptionMode::kRecompute,
             AdmissionRule::kOptimistic,
             *rc::gen::arbitrary<bool>()};
  if (*rc::gen::arbitrary<bool>()) s.mode = PreemptionMode::kSwap;
  if (*rc::gen::arbitrary<bool>()) s.admission = AdmissionRule::kConservative;
  s.speculation.proposer = *rc::gen::element(ProposerKind::kOff, ProposerKind::kNgram, ProposerKind::kDraft);
  s.speculation.k = *rc::gen::inRange(1, 7);
  return s;
}

// A draft model for the micro model: its first layer, on its own CPU backend and pool.
std::unique_ptr<Proposer> micro_draft_proposer(const Model& target) {
  static const Model draft = make_draft_model(target, 1);
  KvCacheConfig kv;
  kv.pool = pool_shape_for(draft.config, 8, 8 * (kMaxLen / 8 + 2), 0);
  CpuBackendConfig bc;
  bc.pool = kv.pool;
  return std::make_unique<DraftModelProposer>(std::make_unique<CpuBackend>(draft, bc), kv, draft.config.vocab_size);
}

// `model`: the backend's model, whose dimensions the pool carries (nullptr: no model).
EngineConfig engine_config(const Schedule& s, int64_t vocab, const ModelConfig* model = nullptr) {
  EngineConfig c;
  if (model != nullptr) c.kv.pool = pool_shape_for(*model, s.block_size, s.num_blocks, s.num_blocks / 2);
  c.kv.pool.num_device_blocks = s.num_blocks;
  c.kv.pool.num_host_blocks = s.num_blocks / 2;
  c.kv.pool.block_size = s.block_size;
  c.kv.watermark_blocks = 1;
  c.kv.enable_prefix_caching = s.prefix_caching;
  c.kv.poison_on_free = true;
  c.kv.sliding_window = s.window;
  c.kv.group_windows = s.group_windows;
  c.scheduler.max_num_batched_tokens = s.budget;
  c.scheduler.max_num_seqs = s.max_seqs;
  c.scheduler.max_model_len = kMaxLen;
  c.scheduler.prefill_chunk_size = s.chunk;
  c.scheduler.admission = s.admission;
  c.scheduler.preemption = s.mode;
  c.vocab_size = vocab;
  c.speculation = s.speculation;
  return c;
}

// A request whose prompt often shares a prefix with the others' (and the target's).
WorkloadRequest draw_request(const std::vector<int32_t>& common_prefix) {
  WorkloadRequest w;
  const int prefix_len = *rc::gen::inRange(0, static_cast<int>(common_prefix.size()) + 1);
  w.spec.prompt.assign(common_prefix.begin(), common_prefix.begin() + prefix_len);
  const int tail = *rc::gen::inRange(0, 20);
  for (int i = 0; i < tail; ++i) w.spec.prompt.push_back(*rc::gen::inRange(0, 64));
  if (w.spec.prompt.empty()) w.spec.prompt.push_back(1);
  w.spec.max_tokens = std::min<int64_t>(*rc::gen::inRange(1, 12), kMaxLen - static_cast<int64_t>(w.spec.prompt.size()));
  if (*rc::gen::arbitrary<bool>()) w.spec.sampling = SamplingParams{0.9f, 0, 0.95f, *rc::gen::arbitrary<uint64_t>()};
  w.spec.tenant = *rc::gen::inRange(0, 2);
  w.arrival_step = *rc::gen::inRange(0, 6);
  if (*rc::gen::inRange(0, 5) == 0) w.cancel_step = w.arrival_step + *rc::gen::inRange(0, 10);
  if (*rc::gen::inRange(0, 4) == 0) w.spec.n = *rc::gen::inRange(2, 4);  // parallel samples (fork, CoW)
  return w;
}

std::vector<WorkloadRequest> draw_requests(const std::vector<int32_t>& prefix, int lo, int hi) {
  std::vector<WorkloadRequest> out(static_cast<std::size_t>(*rc::gen::inRange(lo, hi)));
  for (auto& r : out) r = draw_request(prefix);
  return out;
}

std::vector<int32_t> draw_prefix() {
  std::vector<int32_t> p(24);
  for (auto& t : p) t = *rc::gen::inRange(0, 64);
  return p;
}

struct TargetResult {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  FinishReason finish;
};

TargetResult run_with_target(const Schedule& s, const WorkloadRequest& target, std::vector<WorkloadRequest> others) {
  const EngineConfig config = engine_config(s, micro_model().config.vocab_size, &micro_model().config);
  CpuBackendConfig bc;
  bc.pool = config.kv.pool;
  CpuBackend backend(micro_model(), bc);
  Engine engine(config, backend);
  engine.set_draft_proposer(micro_draft_proposer(micro_model()));
  Workload w{"w", std::move(others)};
  w.requests.push_back(target);
  w.requests.back().spec.capture_logits = true;
  auto run = run_workload(engine, w, 100000);
  RC_ASSERT(run.is_ok());
  const Request& r = engine.request(run->ids.back());
  return {r.tokens(), r.logits, r.finish()};
}

RC_GTEST_PROP(EngineProperty, TargetRequestIsBitwiseIndependentOfNeighboursAndSchedule, ()) {
  const auto prefix = draw_prefix();
  WorkloadRequest target = draw_request(prefix);
  target.cancel_step.reset();
  target.spec.n = 1;
  const auto others_a = draw_requests(prefix, 0, 6);
  const auto others_b = draw_requests(prefix, 0, 6);
  const Schedule sa = draw_schedule();
  const Schedule sb = draw_schedule();
  WorkloadRequest target_b = target;
  target_b.arrival_step = *rc::gen::inRange(0, 6);
  // Speculation (random proposer and k per schedule) must not change a greedy target by a
  // bit. A sampled target's draws depend on how many drafts each step verified, which the
  // schedule decides, so it decodes plainly (its neighbours still speculate).
  if (!target.spec.sampling.greedy()) target.spec.speculation = target_b.spec.speculation = SpeculationParams{};

  auto describe = [](const Schedule& s) {
    return "bs=" + std::to_string(s.block_size) + " blocks=" + std::to_string(s.num_blocks) +
           " chunk=" + std::to_string(s.chunk) + " budget=" + std::to_string(s.budget) +
           " seqs=" + std::to_string(s.max_seqs) + (s.mode == PreemptionMode::kSwap ? " swap" : " recompute") +
           (s.admission == AdmissionRule::kConservative ? " conservative" : " optimistic") +
           (s.prefix_caching ? " prefix" : "") + " speculate=" + to_string(s.speculation.proposer) +
           " k=" + std::to_string(s.speculation.k);
  };
  RC_LOG() << "schedule a: " << describe(sa) << ", " << others_a.size() << " others\n"
           << "schedule b: " << describe(sb) << ", " << others_b.size() << " others\n"
           << "target prompt " << target.spec.prompt.size() << " tokens, max_tokens " << target.spec.max_tokens << "\n";
  const TargetResult a = run_with_target(sa, target, others_a);
  const TargetResult b = run_with_target(sb, target_b, others_b);
  RC_ASSERT(a.finish == b.finish);
  RC_ASSERT(a.tokens == b.tokens);
  RC_ASSERT(a.logits.size() == b.logits.size());
  int64_t compared = 0;
  for (std::size_t p = 0; p < a.logits.size(); ++p) {
    if (a.logits[p].empty() || b.logits[p].empty()) continue;  // served from the prefix cache
    RC_LOG() << "position " << p << "\n";
    RC_ASSERT(a.logits[p] == b.logits[p]);
    ++compared;
  }
  RC_ASSERT(compared > 0);
  RC_CLASSIFY(sa.block_size != sb.block_size, "different block sizes");
  RC_CLASSIFY(sa.speculation.enabled() != sb.speculation.enabled(), "speculative against plain");
}

// Admitted means schedulable: over pool sizes, watermarks, block, chunk and budget sizes,
// a request that add_request does not reject runs to its end when it is alone (S1 within
// kMaxIdleSteps), and one that it rejects says why. An admission check weaker than the
// scheduler's (say, one that forgets the watermark) admits requests that wait forever.
RC_GTEST_PROP(EngineProperty, EveryAdmittedRequestCanBeScheduledAlone, ()) {
  const int32_t bs = *rc::gen::element(1, 2, 3, 4, 8, 16);
  EngineConfig c;
  c.kv.pool.block_size = bs;
  c.kv.pool.num_device_blocks = *rc::gen::inRange(1, 13);
  c.kv.pool.num_host_blocks = *rc::gen::inRange(0, 7);
  c.kv.watermark_blocks = *rc::gen::inRange(0, 4);
  c.kv.enable_prefix_caching = *rc::gen::arbitrary<bool>();
  // A window lets a request longer than the pool in (admission bounds it by the window).
  c.kv.sliding_window = *rc::gen::element(0, 0, 0, 1, 3, 8);
  c.scheduler.max_num_batched_tokens = *rc::gen::inRange(1, 64);
  c.scheduler.max_num_seqs = *rc::gen::inRange(1, 4);
  c.scheduler.max_model_len = *rc::gen::inRange(1, 97);
  c.scheduler.prefill_chunk_size = *rc::gen::inRange(1, 40);
  c.scheduler.admission = *rc::gen::element(AdmissionRule::kOptimistic, AdmissionRule::kConservative);
  c.scheduler.preemption = *rc::gen::element(PreemptionMode::kRecompute, PreemptionMode::kSwap);
  c.vocab_size = 64;
  RC_PRE(validate(c).is_ok());
  testing::FakeBackend backend(c.kv.pool, c.vocab_size, c.kv.sliding_window);
  Engine engine(c, backend);
  RequestSpec spec;
  // Mostly near the limits (the whole pool, max_model_len), where admission is decided.
  const int64_t len_limit =
      c.kv.sliding_window > 0 ? int64_t{c.scheduler.max_model_len}
                              : std::min<int64_t>(c.scheduler.max_model_len, int64_t{c.kv.pool.num_device_blocks} * bs);
  const int64_t total = std::max<int64_t>(2, len_limit + *rc::gen::inRange(-3, 3));
  const auto prompt = static_cast<int>(*rc::gen::inRange<int64_t>(1, total));
  for (int t = 0; t < prompt; ++t) spec.prompt.push_back(*rc::gen::inRange(0, 64));
  spec.max_tokens = total - prompt;
  const RequestId id = engine.add_request(spec);
  const Request& r = engine.request(id);
  RC_TAG(r.finish() == FinishReason::kRejected ? "rejected" : "admitted");
  if (r.finish() == FinishReason::kRejected) {
    RC_ASSERT(!r.reject_reason().empty());
    return;
  }
  ProgressWatch watch;
  for (int step = 0; step < 10000 && engine.has_unfinished(); ++step) {
    RC_ASSERT(engine.step().is_ok());
    const Status progress = check_progress(engine, watch);
    RC_ASSERT_FALSE(!progress.is_ok() && (RC_LOG() << progress.message() << "\n", true));
  }
  RC_ASSERT(!engine.has_unfinished());
  RC_ASSERT(r.finish() == FinishReason::kLength);
  RC_ASSERT(r.num_generated() == spec.max_tokens);
}

RC_GTEST_PROP(EngineProperty, SchedulerKeepsItsContractUnderRandomTrafficOnASmallPool, ()) {
  Schedule s = draw_schedule();
  // A sliding window in three draws of seven (every layer windowed, Mistral's): blocks
  // released behind it as positions turn final, under chunked prefill, drafts and their
  // rollback, preemption of both kinds, forks and prefix hits; check_plan refuses a read of
  // a released entry, check_engine_state holds I11 after every step.
  s.window = *rc::gen::element(0, 0, 0, 0, 1, 3, 9);
  if (s.window > 0) {
    // A pool near what one request needs behind the window (Scheduler::worst_case_blocks),
    // plus the watermark: windowed requests contend and preempt as unwindowed ones do.
    const int64_t step = std::max<int64_t>(std::min(s.budget, s.chunk), 1 + s.speculation.k);
    const auto windowed = static_cast<int32_t>((s.window - 1 + step) / s.block_size + 3);
    s.num_blocks = std::min(s.num_blocks, windowed + *rc::gen::inRange(0, 6));
  } else if (*rc::gen::element(0, 0, 1) == 1) {
    // KV-cache groups in a third of the rest (a hybrid model: full and sliding layers, each
    // group its own table over the one pool). The pool holds one request in every group.
    s.group_windows = *rc::gen::element(std::vector<int64_t>{0, 3}, std::vector<int64_t>{0, 9, 9},
                                        std::vector<int64_t>{1, 0}, std::vector<int64_t>{5, 5});
    s.num_blocks *= static_cast<int32_t>(s.group_windows.size());
  }
  const auto prefix = draw_prefix();
  const auto requests = draw_requests(prefix, 1, 40);
  const EngineConfig config = engine_config(s, 64);
  testing::FakeBackend backend(config.kv.pool, 64, s.window, s.group_windows);
  Engine engine(config, backend);
  // The draft model runs on a fake backend of its own (its own pool).
  KvCacheConfig draft_kv;
  draft_kv.pool.block_size = 4;
  draft_kv.pool.num_device_blocks = 8 * (kMaxLen / 4 + 1);
  draft_kv.pool.num_host_blocks = 0;
  engine.set_draft_proposer(
      std::make_unique<DraftModelProposer>(std::make_unique<testing::FakeBackend>(draft_kv.pool, 64), draft_kv, 64));
  std::string violation;
  engine.set_plan_observer([&](const Engine& e, const BatchPlan& plan) -> Status {
    if (Status st = check_plan(e, plan); !st && violation.empty()) violation = st.message();
    return violation.empty() ? Status::ok() : Status::error(violation);
  });
  engine.set_step_observer([](const Engine& e, const BatchPlan&) { return check_engine_state(e); });

  // Progress: a generous bound on steps; a deadlock or livelock runs past it.
  int64_t work = 0;
  int64_t last_arrival = 0;
  for (const auto& r : requests) {
    work += static_cast<int64_t>(r.spec.prompt.size()) + r.spec.max_tokens;
    last_arrival = std::max(last_arrival, r.arrival_step);
  }
  const int64_t bound = last_arrival + work * (static_cast<int64_t>(requests.size()) + 1) + 10;
  auto run = run_workload(engine, Workload{"random", requests}, bound);
  RC_ASSERT(violation.empty());
  RC_ASSERT(run.is_ok());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Request& r = engine.request(run->ids[i]);
    RC_ASSERT(r.finished());
    if (r.finish() == FinishReason::kLength) RC_ASSERT(r.num_generated() == r.spec.max_tokens);
    if (r.finish() == FinishReason::kCancelled) RC_ASSERT(requests[i].cancel_step.has_value());
    // Every generated request fits the pool, but n parallel samples may need more blocks or
    // sequences than the configuration has.
    if (r.spec.n == 1 && r.parent < 0) RC_ASSERT(r.finish() != FinishReason::kRejected);
    for (RequestId c : r.children) RC_ASSERT(engine.request(c).finished());
  }
  if (s.admission == AdmissionRule::kConservative) RC_ASSERT(engine.metrics().counters.preemptions == 0);
  RC_ASSERT(check_no_leak(engine.kv()).is_ok());
  RC_ASSERT(engine.flush_prefix_cache_when_idle().is_ok());
  RC_ASSERT(check_all_free(engine.kv()).is_ok());
  RC_CLASSIFY(s.window > 0, "windowed");
  RC_CLASSIFY(!s.group_windows.empty(), "KV-cache groups");
  RC_CLASSIFY(engine.metrics().counters.preemptions > 0, "preempted");
  RC_CLASSIFY(engine.metrics().counters.copy_on_writes > 0, "copy-on-write");
  RC_CLASSIFY(engine.metrics().counters.spec_accepted > 0, "drafts accepted");
  RC_CLASSIFY(engine.metrics().counters.spec_proposed > engine.metrics().counters.spec_accepted, "drafts rolled back");
}

// Overload: ten times more requests than the pool holds at once, all arriving together:
// none lost, none rejected, every one finishes with all its tokens.
TEST(EngineProperty, OverloadLosesNothing) {
  Schedule s{4, 13, 8, 32, 8, PreemptionMode::kRecompute, AdmissionRule::kOptimistic, true};
  const EngineConfig config = engine_config(s, 64);
  testing::FakeBackend backend(config.kv.pool, 64);
  Engine engine(config, backend);
  std::vector<RequestId> ids;
  // Each request needs 20 tokens = 5 blocks at its longest; 13 blocks hold ~2 at once.
  for (int i = 0; i < 26; ++i) {
    RequestSpec spec;
    for (int t = 0; t < 12; ++t) spec.prompt.push_back((i * 7 + t) % 64);
    spec.max_tokens = 8;
    ids.push_back(engine.add_request(spec));
  }
  for (int step = 0; step < 100000 && engine.has_unfinished(); ++step) {
    ASSERT_TRUE(engine.step().is_ok());
    Status inv = check_all(engine.kv());
    ASSERT_TRUE(inv.is_ok()) << inv.message();
  }
  EXPECT_GT(engine.metrics().counters.preemptions, 0);
  for (RequestId id : ids) {
    EXPECT_EQ(engine.request(id).finish(), FinishReason::kLength);
    EXPECT_EQ(engine.request(id).num_generated(), 8);
  }
}

}  // namespace
}  // namespace kvp
