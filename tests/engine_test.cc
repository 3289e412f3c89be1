// The scheduler and engine loop, with a model-free backend: admission, rejection,
// cancellation, chunked prefill, preemption and the terminal-state contract.
#include "optimized/engine/engine.h"

#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "optimized/checkers/engine_invariants.h"
#include "optimized/checkers/invariants.h"
#include "optimized/engine/workload.h"
#include "tests/fake_backend.h"

namespace kvp {

// The engine's KV manager behind the scheduler's back: only to plant a leak.
class EngineTestPeer {
 public:
  static KvCacheManager& kv(Engine& e) { return e.kv_; }
};

// Gives a request a second home for its token history (a copy), as the engine had before
// the history had one home: the bug I10's checker guards against.
class RequestTestPeer {
 public:
  static void read_from_a_copy(const Request& r, std::vector<int32_t> copy) {
    auto& m = const_cast<Request&>(r);
    m.tokens_ = std::move(copy);
    m.kv_tokens_ = nullptr;
  }
};

namespace {

constexpr int64_t kVocab = 64;

// A PrefixHit is valid until the manager's next state change: the scheduler's methods that
// take one refuse a stale one, as the manager's own do (KvCacheManager::is_current).
TEST(SchedulerDeathTest, AHitFromBeforeAStateChangeIsRefused) {
  KvCacheConfig kc;
  kc.pool.num_device_blocks = 8;
  kc.pool.num_host_blocks = 4;
  kc.pool.block_size = 4;
  KvCacheManager kv(kc);
  Scheduler s(SchedulerConfig{}, kv);
  RequestSpec spec;
  spec.prompt = {1, 2, 3, 4, 5, 6};
  Request r(1, spec);
  s.add(&r);
  const PrefixHit hit = kv.find_prefix(r.id);
  EXPECT_EQ(s.tokens_to_compute(r, hit), 6);
  ASSERT_TRUE(kv.add_sequence(99, 0, std::vector<int32_t>{7, 8}).is_ok());  // a state change
  EXPECT_DEATH((void)s.tokens_to_compute(r, hit), "KVP_CHECK");
  EXPECT_EQ(s.tokens_to_compute(r, kv.find_prefix(r.id)), 6);
}

EngineConfig small_config(int32_t blocks, AdmissionRule admission = AdmissionRule::kOptimistic,
                          PreemptionMode mode = PreemptionMode::kRecompute) {
  EngineConfig c;
  c.kv.pool.num_device_blocks = blocks;
  c.kv.pool.num_host_blocks = blocks / 2;
  c.kv.pool.block_size = 4;
  c.kv.watermark_blocks = 0;
  c.scheduler.max_num_batched_tokens = 32;
  c.scheduler.max_num_seqs = 8;
  c.scheduler.max_model_len = 256;
  c.scheduler.prefill_chunk_size = 16;
  c.scheduler.admission = admission;
  c.scheduler.preemption = mode;
  c.vocab_size = kVocab;
  return c;
}

RequestSpec spec(int64_t prompt_len, int64_t max_tokens, int32_t first = 1) {
  RequestSpec s;
  for (int64_t i = 0; i < prompt_len; ++i) s.prompt.push_back(static_cast<int32_t>((first + i) % kVocab));
  s.max_tokens = max_tokens;
  return s;
}

Status run_to_end(Engine& e, int64_t max_steps = 10000) {
  ProgressWatch watch;
  for (int64_t i = 0; i < max_steps && e.has_unfinished(); ++i) {
    KVP_RETURN_IF_ERROR(e.step());
    KVP_RETURN_IF_ERROR(check_all(e.kv()));
    KVP_RETURN_IF_ERROR(check_progress(e, watch));
  }
  return e.has_unfinished() ? Status::error("did not finish") : Status::ok();
}

// S1 progress: a leak that leaves a request unschedulable forever is reported within
// kMaxIdleSteps steps, naming the stuck request, instead of spinning to the step limit.
TEST(Engine, ARunThatStopsMakingProgressFailsWithAnS1ViolationNamingTheStuckRequest) {
  const EngineConfig e_config = small_config(8);
  testing::FakeBackend backend(e_config.kv.pool, kVocab);
  Engine e(e_config, backend);
  // A planted leak: a sequence the scheduler does not know holds every device block.
  std::vector<int32_t> hog(32, 7);
  std::vector<int64_t> slots;
  ASSERT_TRUE(EngineTestPeer::kv(e).add_sequence(9999, 0, hog).is_ok());
  ASSERT_TRUE(EngineTestPeer::kv(e).allocate_slots(9999, 32, slots).is_ok());
  const RequestId id = e.add_request(spec(8, 4));
  int64_t steps = 0;
  ProgressWatch watch;
  Status s = Status::ok();
  while (s && steps < 1000) {
    s = e.step();
    ++steps;
    if (s) s = check_progress(e, watch);
  }
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(steps, kMaxIdleSteps + 1);
  EXPECT_NE(s.message().find("S1 progress"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("stuck: " + std::to_string(id) + " (waiting)"), std::string::npos) << s.message();
}

TEST(Engine, RejectsRequestsThatCanNeverRunWithAReasonAndChangesNothingElse) {
  const EngineConfig e_config = small_config(16);
  testing::FakeBackend backend(e_config.kv.pool, kVocab);
  Engine e(e_config, backend);
  const RequestId empty = e.add_request(spec(0, 4));
  const RequestId bad_token = e.add_request([] {
    auto s = spec(3, 4);
    s.prompt[1] = kVocab;
    return s;
  }());
  const RequestId too_long = e.add_request(spec(250, 10));
  const RequestId too_big = e.add_request(spec(60, 10));  // 70 tokens = 18 blocks > 16
  const RequestId zero = e.add_request(spec(3, 0));
  for (RequestId id : {empty, bad_token, too_long, too_big, zero}) {
    EXPECT_EQ(e.request(id).finish(), FinishReason::kRejected) << id;
    EXPECT_FALSE(e.request(id).reject_reason().empty());
  }
  EXPECT_NE(e.request(too_big).reject_reason().find("blocks"), std::string::npos);
  EXPECT_NE(e.request(too_long).reject_reason().find("max_model_len"), std::string::npos);
  EXPECT_FALSE(e.has_unfinished());
  EXPECT_EQ(e.kv().num_sequences(), 0);
  EXPECT_EQ(e.metrics().counters.rejections, 5);
}

TEST(Engine, GeneratesExactlyMaxTokensAndFreesEverything) {
  const EngineConfig e_config = small_config(32);
  testing::FakeBackend backend(e_config.kv.pool, kVocab);
  Engine e(e_config, backend);
  const RequestId id = e.add_request(spec(10, 7));
  ASSERT_TRUE(run_to_end(e).is_ok());
  EXPECT_EQ(e.request(id).finish(), FinishReason::kLength);
  EXPECT_EQ(e.request(id).num_generated(), 7);
  EXPECT_TRUE(check_no_leak(e.kv()).is_ok());
  // Greedy on the fake logits: token i+1 = (token_i * 31 + position_i * 17) % vocab.
  const Request& r = e.request(id);
  for (std::size_t p = 9; p + 1 < r.tokens().size(); ++p)
    EXPECT_EQ(r.tokens()[p + 1], (r.tokens()[p] * 31 + static_cast<int64_t>(p) * 17) % kVocab) << p;
}

// Rows taken while a request runs: every row once, at its position, the same bits as a run
// that keeps them all; later rows still land at their positions; the slots are left empty.
TEST(Engine, CapturedLogitsTakenMidRunAreEveryRowOnceAtItsPosition) {
  const EngineConfig e_config = small_config(32);
  RequestSpec s = spec(10, 7);
  s.capture_logits = true;
  testing::FakeBackend kept_backend(e_config.kv.pool, kVocab);
  Engine kept(e_config, kept_backend);
  const RequestId kept_id = kept.add_request(s);
  ASSERT_TRUE(run_to_end(kept).is_ok());
  const std::vector<std::vector<float>>& all = kept.request(kept_id).logits;

  testing::FakeBackend backend(e_config.kv.pool, kVocab);
  Engine e(e_config, backend);
  const RequestId id = e.add_request(s);
  std::map<int64_t, std::vector<float>> taken;
  int64_t calls_with_rows = 0;
  while (e.has_unfinished()) {
    ASSERT_TRUE(e.step().is_ok());
    auto rows = e.take_captured_logits(id);
    calls_with_rows += rows.empty() ? 0 : 1;
    for (auto& [p, row] : rows) EXPECT_TRUE(taken.emplace(p, std::move(row)).second) << "position " << p << " twice";
  }
  EXPECT_TRUE(e.take_captured_logits(id).empty());
  EXPECT_GT(calls_with_rows, 1);  // taken mid-run, not only at the end
  ASSERT_EQ(e.request(id).logits.size(), all.size());
  std::size_t non_empty = 0;
  for (std::size_t p = 0; p < all.size(); ++p) {
    EXPECT_TRUE(e.request(id).logits[p].empty()) << p;
    if (all[p].empty()) {
      EXPECT_EQ(taken.count(static_cast<int64_t>(p)), 0u) << p;
      continue;
    }
    ++non_empty;
    ASSERT_EQ(taken.count(static_cast<int64_t>(p)), 1u) << p;
    EXPECT_EQ(taken[static_cast<int64_t>(p)], all[p]) << p;
  }
  EXPECT_EQ(taken.size(), non_empty);
  EXPECT_GE(non_empty, 7u);
  EXPECT_TRUE(e.take_captured_logits(12345).empty());
}

// The one way to flush the prefix cache from outside the scheduler refuses while a request
// holds blocks, and changes nothing then; once every request has ended it frees every block.
TEST(Engine, FlushWhenIdleIsRefusedWhileARequestIsUnfinished) {
  const EngineConfig e_config = small_config(32);
  testing::FakeBackend backend(e_config.kv.pool, kVocab);
  Engine e(e_config, backend);
  e.add_request(spec(10, 7));
  ASSERT_TRUE(e.step().is_ok());
  const int64_t free_before = e.kv().device_allocator().num_free();
  const Status refused = e.flush_prefix_cache_when_idle();
  EXPECT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("1 sequences are waiting, running or swapped"), std::string::npos)
      << refused.message();
  EXPECT_EQ(e.kv().device_allocator().num_free(), free_before);
  ASSERT_TRUE(run_to_end(e).is_ok());
  ASSERT_TRUE(e.flush_prefix_cache_when_idle().is_ok());
  EXPECT_TRUE(check_all_free(e.kv()).is_ok());
}

TEST(Engine, StopTokenEndsTheRequest) {
  const EngineConfig e_config = small_config(32);
  testing::FakeBackend backend(e_config.kv.pool, kVocab);
  Engine e(e_config, backend);
  RequestSpec s = spec(10, 20);
  // The first generated token is (token 9 * 31 + 9 * 17) % 64.
  s.stop_tokens = {static_cast<int32_t>((s.prompt[9] * 31 + 9 * 17) % kVocab)};
  const RequestId id = e.add_request(s);
  ASSERT_TRUE(run_to_end(e).is_ok());
  EXPECT_EQ(e.request(id).finish(), FinishReason::kStop);
  EXPECT_EQ(e.request(id).num_generated(), 1);
}

TEST(Engine, CancellationTakesEffectAtTheNextStepAndFreesBlocks) {
  const EngineConfig e_config = small_config(32);
  testing::FakeBackend backend(e_config.kv.pool, kVocab);
  Engine e(e_config, backend);
  const RequestId a = e.add_request(spec(10, 50));
  const RequestId b = e.add_request(spec(10, 5));
  ASSERT_TRUE(e.step().is_ok());
  EXPECT_NE(e.kv().sequence(a), nullptr);
  e.cancel(a);
  EXPECT_FALSE(e.request(a).finished());  // not before the step boundary
  ASSERT_TRUE(e.step().is_ok());
  EXPECT_EQ(e.request(a).finish(), FinishReason::kCancelled);
  EXPECT_EQ(e.kv().sequence(a), nullptr);
  ASSERT_TRUE(run_to_end(e).is_ok());
  EXPECT_EQ(e.request(b).finish(), FinishReason::kLength);
  e.cancel(b);  // finished: no-op
  EXPECT_EQ(e.request(b).finish(), FinishReason::kLength);
  EXPECT_EQ(e.metrics().counters.cancellations, 1);
}

TEST(Engine, RunningDecodesAreServedWhileALongPromptPrefillsInChunks) {
  EngineConfig c = small_config(64);
  c.scheduler.max_num_batched_tokens = 16;
  c.scheduler.prefill_chunk_size = 12;
  testing::FakeBackend backend(c.kv.pool, kVocab);
  Engine e(c, backend);
  const RequestId chat = e.add_request(spec(4, 20));
  ASSERT_TRUE(e.step().is_ok());  // chat's prefill
  const RequestId doc = e.add_request(spec(120, 2));
  int64_t steps_while_doc_prefills = 0;
  while (e.request(doc).num_generated() == 0) {
    const int64_t before = e.request(chat).num_generated();
    ASSERT_TRUE(e.step().is_ok());
    ++steps_while_doc_prefills;
    if (!e.request(chat).finished()) {
      EXPECT_EQ(e.request(chat).num_generated(), before + 1) << "chat stalled";
    }
  }
  // 120 prompt tokens in chunks of at most 12 (budget 16 minus the decode): >= 10 steps.
  EXPECT_GE(steps_while_doc_prefills, 10);
  ASSERT_TRUE(run_to_end(e).is_ok());
}

TEST(Engine, ConservativeAdmissionNeverPreemptsUnderOverload) {
  const EngineConfig e_config = small_config(24, AdmissionRule::kConservative);
  testing::FakeBackend backend(e_config.kv.pool, kVocab);
  Engine e(e_config, backend);
  std::vector<RequestId> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(e.add_request(spec(10 + i % 7, 12, i)));
  ASSERT_TRUE(run_to_end(e).is_ok());
  EXPECT_EQ(e.metrics().counters.preemptions, 0);
  for (RequestId id : ids) EXPECT_EQ(e.request(id).finish(), FinishReason::kLength);
}

TEST(Engine, OptimisticAdmissionPreemptsAndEveryRequestStillFinishes) {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    const EngineConfig e_config = small_config(24, AdmissionRule::kOptimistic, mode);
    testing::FakeBackend backend(e_config.kv.pool, kVocab);
    Engine e(e_config, backend);
    std::vector<RequestId> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(e.add_request(spec(10 + i % 7, 12, i)));
    ASSERT_TRUE(run_to_end(e).is_ok());
    EXPECT_GT(e.metrics().counters.preemptions, 0);
    if (mode == PreemptionMode::kSwap) {
      EXPECT_GT(e.metrics().counters.swaps_out, 0);
    }
    for (RequestId id : ids) {
      EXPECT_EQ(e.request(id).finish(), FinishReason::kLength);
      EXPECT_EQ(e.request(id).num_generated(), 12);
    }
    EXPECT_TRUE(check_no_leak(e.kv()).is_ok());
  }
}

TEST(Engine, PreemptedRequestsProduceTheTokensTheyWouldHaveAlone) {
  const EngineConfig crowded_config = small_config(20);
  testing::FakeBackend backend(crowded_config.kv.pool, kVocab);
  Engine crowded(crowded_config, backend);
  std::vector<RequestId> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(crowded.add_request(spec(14, 16, 3 * i)));
  ASSERT_TRUE(run_to_end(crowded).is_ok());
  ASSERT_GT(crowded.metrics().counters.preemptions, 0);
  for (int i = 0; i < 12; ++i) {
    const EngineConfig alone_config = small_config(64);
    testing::FakeBackend b2(alone_config.kv.pool, kVocab);
    Engine alone(alone_config, b2);
    const RequestId id = alone.add_request(spec(14, 16, 3 * i));
    ASSERT_TRUE(run_to_end(alone).is_ok());
    EXPECT_EQ(alone.request(id).tokens(), crowded.request(ids[static_cast<std::size_t>(i)]).tokens()) << i;
  }
}

TEST(Engine, ParallelSamplesForkTheirPromptAndCopyOnWrite) {
  const EngineConfig e_config = small_config(32);
  testing::FakeBackend backend(e_config.kv.pool, kVocab);
  Engine e(e_config, backend);
  RequestSpec s = spec(10, 6);  // 10 tokens: the prompt's last block is half full, so shared
  s.n = 3;
  s.sampling = SamplingParams{1.0f, 0, 1.0f, 40};
  const RequestId parent = e.add_request(s);
  ASSERT_TRUE(run_to_end(e).is_ok());
  const Request& p = e.request(parent);
  ASSERT_EQ(p.children.size(), 2u);
  EXPECT_GT(e.metrics().counters.copy_on_writes, 0);
  std::vector<RequestId> all = {parent, p.children[0], p.children[1]};
  for (std::size_t k = 0; k < all.size(); ++k) {
    const Request& r = e.request(all[k]);
    EXPECT_EQ(r.finish(), FinishReason::kLength);
    EXPECT_EQ(r.num_generated(), 6);
    EXPECT_EQ(r.spec.sampling.seed, 40 + k);
    // Each sample is what a lone request with its seed produces.
    const EngineConfig alone_config = small_config(32);
    testing::FakeBackend b2(alone_config.kv.pool, kVocab);
    Engine alone(alone_config, b2);
    RequestSpec one = spec(10, 6);
    one.sampling = SamplingParams{1.0f, 0, 1.0f, 40 + k};
    const RequestId id = alone.add_request(one);
    ASSERT_TRUE(run_to_end(alone).is_ok());
    EXPECT_EQ(alone.request(id).tokens(), r.tokens()) << "sample " << k;
  }
  EXPECT_NE(e.request(all[0]).tokens(), e.request(all[1]).tokens());  // different seeds, near-uniform logits
  EXPECT_TRUE(check_no_leak(e.kv()).is_ok());
  // n beyond max_num_seqs can never run.
  RequestSpec wide = spec(4, 2);
  wide.n = 9;
  EXPECT_EQ(e.request(e.add_request(wide)).finish(), FinishReason::kRejected);
}

TEST(Workload, ParserErrorsNameTheRequestAndField) {
  auto err = [](const char* text) {
    auto w = parse_workload(nlohmann::json::parse(text), kVocab, 0);
    return w.is_ok() ? std::string("<accepted>") : w.status().message();
  };
  EXPECT_EQ(err(R"({"requests":[{"prompt":[1,2]}]})"), "<accepted>");
  EXPECT_NE(err(R"({"requests":[{"prompt":[1,2]},{"prompt_len":4,"max_tokens":0}]})").find("requests[1]: max_tokens"),
            std::string::npos);
  EXPECT_NE(err(R"({"requests":[{"prompt":[1,64]}]})").find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(err(R"({"requests":[{"prompt":[1],"prompt_len":3}]})").find("exactly one of"), std::string::npos);
  EXPECT_NE(err(R"({"requests":[{"prompt":[1],"colour":3}]})").find("unknown field 'colour'"), std::string::npos);
  EXPECT_NE(err(R"({"requests":[{"prompt":[1],"top_p":0}]})").find("top_p"), std::string::npos);
  EXPECT_NE(err(R"({"requests":[]})").find("empty"), std::string::npos);
  EXPECT_NE(err(R"([1])").find("JSON object"), std::string::npos);
  EXPECT_NE(err(R"({"requests":[{"prompt_len":8,"shared_prefix":{"group":1}}]})").find("shared_prefix"),
            std::string::npos);
}

TEST(Workload, SharedPrefixGroupsShareTheirLeadingTokens) {
  auto w = builtin_workload("shared-prefix", kVocab, 7);
  ASSERT_TRUE(w.is_ok());
  const auto& a = w->requests[0].spec.prompt;
  const auto& b = w->requests[1].spec.prompt;
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 32, b.begin()));
  EXPECT_NE(a, b);
  auto again = builtin_workload("shared-prefix", kVocab, 7);
  EXPECT_EQ(again->requests[3].spec.prompt, w->requests[3].spec.prompt);
  EXPECT_FALSE(builtin_workload("nope", kVocab, 0).is_ok());
}

// Cancels `id` now and runs one step: the request must end at that boundary, cancelled in
// `state`, holding no blocks.
void expect_cancelled_at_next_boundary(Engine& e, RequestId id, const std::string& state) {
  const int64_t boundary = e.steps_done();
  e.cancel(id);
  ASSERT_TRUE(e.step().is_ok());
  const Request& r = e.request(id);
  EXPECT_EQ(r.finish(), FinishReason::kCancelled);
  EXPECT_EQ(r.cancelled_in, state);
  EXPECT_EQ(r.time.finish_step, boundary);
  EXPECT_EQ(e.kv().sequence(id), nullptr);
  EXPECT_TRUE(check_cancellations(e).is_ok()) << check_cancellations(e).message();
  EXPECT_TRUE(check_all(e.kv()).is_ok());  // its blocks' refcounts dropped with its table (I2)
}

TEST(Engine, CancellationEndsARequestAtTheNextBoundaryInEveryState) {
  {  // waiting: one seat, taken by another request
    EngineConfig c = small_config(32);
    c.scheduler.max_num_seqs = 1;
    testing::FakeBackend backend(c.kv.pool, kVocab);
    Engine e(c, backend);
    e.add_request(spec(8, 20));
    const RequestId waiting = e.add_request(spec(8, 4, 5));
    ASSERT_TRUE(e.step().is_ok());
    ASSERT_EQ(e.request(waiting).state(), RequestState::kWaiting);
    expect_cancelled_at_next_boundary(e, waiting, "waiting");
  }
  {  // mid-prefill, then running
    const EngineConfig c = small_config(32);
    testing::FakeBackend backend(c.kv.pool, kVocab);
    Engine e(c, backend);
    const RequestId prefilling = e.add_request(spec(40, 4));  // chunk 16: three steps of prefill
    const RequestId decoding = e.add_request(spec(4, 30, 9));
    ASSERT_TRUE(e.step().is_ok());
    ASSERT_TRUE(e.step().is_ok());
    ASSERT_LT(e.kv().sequence(prefilling)->num_slots, 40);
    expect_cancelled_at_next_boundary(e, prefilling, "prefill");
    ASSERT_GT(e.request(decoding).num_generated(), 0);
    expect_cancelled_at_next_boundary(e, decoding, "running");
  }
  {  // swapped out
    const EngineConfig c = small_config(24, AdmissionRule::kOptimistic, PreemptionMode::kSwap);
    testing::FakeBackend backend(c.kv.pool, kVocab);
    Engine e(c, backend);
    std::vector<RequestId> ids;
    for (int i = 0; i < 12; ++i) ids.push_back(e.add_request(spec(10 + i % 7, 12, i)));
    RequestId swapped = -1;
    for (int step = 0; step < 200 && swapped < 0 && e.has_unfinished(); ++step) {
      ASSERT_TRUE(e.step().is_ok());
      for (RequestId id : ids)
        if (e.request(id).state() == RequestState::kSwapped) swapped = id;
    }
    ASSERT_GE(swapped, 0) << "no request was swapped out";
    expect_cancelled_at_next_boundary(e, swapped, "swapped");
    ASSERT_TRUE(run_to_end(e).is_ok());
  }
  {  // with forked parallel samples: the samples end with it
    const EngineConfig c = small_config(32);
    testing::FakeBackend backend(c.kv.pool, kVocab);
    Engine e(c, backend);
    RequestSpec s = spec(6, 20);
    s.n = 3;
    s.sampling.temperature = 1.0;
    const RequestId parent = e.add_request(s);
    ASSERT_TRUE(e.step().is_ok());
    ASSERT_TRUE(e.step().is_ok());
    ASSERT_EQ(e.request(parent).children.size(), 2u);
    expect_cancelled_at_next_boundary(e, parent, "running");
    for (RequestId child : e.request(parent).children) {
      EXPECT_EQ(e.request(child).finish(), FinishReason::kCancelled);
      EXPECT_EQ(e.kv().sequence(child), nullptr);
    }
    EXPECT_FALSE(e.has_unfinished());
    EXPECT_TRUE(check_no_leak(e.kv()).is_ok());
  }
}

TEST(Engine, CreateRefusesABackendWhosePoolIsNotTheManagers) {
  const EngineConfig c = small_config(16);
  KvPoolShape other = c.kv.pool;
  other.num_device_blocks += 1;
  testing::FakeBackend backend(other, kVocab);
  auto e = Engine::create(c, backend);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("device blocks 17"), std::string::npos) << e.status().message();
  testing::FakeBackend same(c.kv.pool, kVocab);
  EXPECT_TRUE(Engine::create(c, same).is_ok());
}

TEST(Engine, RecordsWhenEachRequestWasFirstScheduled) {
  const EngineConfig c = small_config(32);
  testing::FakeBackend backend(c.kv.pool, kVocab);
  Engine e(c, backend);
  std::vector<RequestId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(e.add_request(spec(20, 4, i)));
  ASSERT_TRUE(run_to_end(e).is_ok());
  for (RequestId id : ids) {
    const RequestTimeline& t = e.request(id).time;
    EXPECT_GE(t.first_scheduled_s, t.arrival_s) << "request " << id;
    EXPECT_LE(t.first_scheduled_s, t.first_token_s) << "request " << id;
    EXPECT_GE(t.first_scheduled_step, 0);
  }
  EXPECT_EQ(e.metrics().queue_s.count, 6);
  EXPECT_GE(e.metrics().queue_s.p50, 0.0);
}

TEST(Engine, EveryPlanAndStatePassesTheCheckersAndTheTokenHistoryIsOne) {
  const EngineConfig c = small_config(20, AdmissionRule::kOptimistic, PreemptionMode::kSwap);
  testing::FakeBackend backend(c.kv.pool, kVocab);
  Engine e(c, backend);
  int64_t plans = 0;
  e.set_plan_observer([&](const Engine& eng, const BatchPlan& plan) {
    ++plans;
    return check_plan(eng, plan);
  });
  e.set_step_observer([](const Engine& eng, const BatchPlan&) { return check_engine_state(eng); });
  for (int i = 0; i < 12; ++i) e.add_request(spec(10 + i, 12, i));
  ASSERT_TRUE(run_to_end(e).is_ok());
  EXPECT_GT(plans, 0);
  EXPECT_GT(e.metrics().counters.preemptions, 0);
}

TEST(Engine, TokenHistoryCheckerSeesARequestAndItsSequenceDisagree) {
  const EngineConfig c = small_config(32);
  testing::FakeBackend backend(c.kv.pool, kVocab);
  Engine e(c, backend);
  const RequestId id = e.add_request(spec(6, 8));
  ASSERT_TRUE(e.step().is_ok());
  ASSERT_TRUE(check_token_history(e).is_ok());
  std::vector<int32_t> copy = e.request(id).tokens();
  // An equal copy is a second home: the histories would drift apart at the next token.
  RequestTestPeer::read_from_a_copy(e.request(id), copy);
  Status st = check_token_history(e);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("reads a copy of its token history"), std::string::npos) << st.message();
  copy[2] += 1;
  RequestTestPeer::read_from_a_copy(e.request(id), copy);
  st = check_token_history(e);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("first difference at position 2"), std::string::npos) << st.message();
}

TEST(Engine, ARequestReadsItsTokenHistoryFromItsSequenceWhileItHoldsOne) {
  const EngineConfig c = small_config(32);
  testing::FakeBackend backend(c.kv.pool, kVocab);
  Engine e(c, backend);
  const RequestId id = e.add_request(spec(6, 8));
  EXPECT_EQ(e.request(id).tokens(), e.request(id).spec.prompt);  // waiting: its own, the prompt
  ASSERT_TRUE(e.step().is_ok());
  const SequenceState* s = e.kv().sequence(id);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(&e.request(id).tokens(), &s->tokens);  // running: the sequence's, no copy
  ASSERT_TRUE(run_to_end(e).is_ok());
  EXPECT_EQ(e.kv().sequence(id), nullptr);
  EXPECT_EQ(e.request(id).tokens().size(), 6u + 8u);  // finished: handed back, whole
}

}  // namespace
}  // namespace kvp
