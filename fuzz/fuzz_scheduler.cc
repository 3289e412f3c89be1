// Scheduler fuzzer: the serving engine on the fake backend (tests/fake_backend.h), driven by
// random request arrivals, cancellations and steps over a random configuration (block size,
// pool sizes, watermark, chunk size, token budget, sequence limit, preemption mode,
// admission rule, prefix caching, n-gram speculation, a sliding window). The first bytes choose the
// configuration, then each 4 bytes are one command (at most kMaxCommands): add a request
// (prompts share prefixes; greedy or sampled, n parallel samples, two tenants), cancel one
// (finished or not), or run 1-4 steps. Every plan is checked before it runs (check_plan:
// I3, I4, I5, I8, I10), every engine checker after every step (check_engine_state: every KV
// invariant, token histories, cancellations), progress after every step (S1), and at the
// end, once every request has finished, the latency timelines against the witness, no leak,
// and an empty pool after a flush. Any violation aborts.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/byte_reader.h"
#include "optimized/checkers/engine_invariants.h"
#include "optimized/engine/engine.h"
#include "tests/fake_backend.h"

namespace {

constexpr int kMaxCommands = 48;
constexpr int64_t kVocab = 64;
constexpr int64_t kMaxLen = 40;
constexpr int64_t kMaxSteps = 4000;  // after the commands; check_progress fails a stuck run long before

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_scheduler: %s\n", what.c_str());
  std::abort();
}

kvp::EngineConfig read_config(kvp::fuzz::ByteReader& in) {
  kvp::EngineConfig c;
  const uint8_t flags = in.u8();
  c.kv.pool.block_size = 1 + in.below(8);
  c.kv.pool.num_device_blocks = 1 + in.below(48);
  c.kv.pool.num_host_blocks = in.below(24);
  c.kv.watermark_blocks = in.below(3);
  c.kv.enable_prefix_caching = (flags & 1) == 0;
  c.kv.poison_on_free = (flags & 2) != 0;
  c.scheduler.max_num_batched_tokens = 1 + in.below(64);
  c.scheduler.max_num_seqs = 1 + in.below(8);
  c.scheduler.max_model_len = kMaxLen;
  c.scheduler.prefill_chunk_size = 1 + in.below(24);
  c.scheduler.preemption = (flags & 4) != 0 ? kvp::PreemptionMode::kSwap : kvp::PreemptionMode::kRecompute;
  c.scheduler.admission = (flags & 8) != 0 ? kvp::AdmissionRule::kConservative : kvp::AdmissionRule::kOptimistic;
  if ((flags & 16) != 0) {
    c.speculation.proposer = kvp::ProposerKind::kNgram;
    c.speculation.k = 1 + (flags >> 5) % 4;
  }
  c.vocab_size = kVocab;
  // A sliding window (every layer's) in half the inputs: blocks released behind it under
  // chunked prefill, preemption, forks, prefix hits and n-gram drafts and their rollback.
  static constexpr int kWindows[] = {0, 0, 0, 0, 1, 3, 6, 12};
  c.kv.sliding_window = kWindows[in.below(8)];
  return c;
}

// Prompts share prefixes often: one of three base prompts, cut, plus a short random tail.
kvp::RequestSpec read_request(kvp::fuzz::ByteReader& in) {
  kvp::RequestSpec spec;
  const uint8_t a = in.u8(), b = in.u8(), c = in.u8();
  const int base = a % 3, cut = b % 24, tail = c % 5;
  for (int i = 0; i < cut; ++i) spec.prompt.push_back(static_cast<int32_t>((base * 7 + i * 3) % kVocab));
  for (int i = 0; i < tail; ++i) spec.prompt.push_back(static_cast<int32_t>((c * 5 + i) % kVocab));
  if (spec.prompt.empty()) spec.prompt.push_back(1);
  spec.max_tokens = 1 + (b >> 5) + (a >> 6) * 4;
  spec.tenant = (a >> 2) % 2;
  if ((a & 8) != 0) spec.sampling = kvp::SamplingParams{0.9f, 0, 0.95f, static_cast<uint64_t>(c)};
  if ((a & 16) != 0) spec.n = 2 + (a >> 5) % 2;
  return spec;
}

class Checked {
 public:
  explicit Checked(kvp::Engine& engine) : e_(engine) {
    e_.set_plan_observer([this](const kvp::Engine& e, const kvp::BatchPlan& plan) -> kvp::Status {
      KVP_RETURN_IF_ERROR(kvp::check_plan(e, plan));
      kvp::record_timeline(e, plan, /*after_step=*/false, witness_);
      return kvp::Status::ok();
    });
    e_.set_step_observer([this](const kvp::Engine& e, const kvp::BatchPlan& plan) -> kvp::Status {
      kvp::record_timeline(e, plan, /*after_step=*/true, witness_);
      return kvp::check_engine_state(e);
    });
  }
  void step() {
    const kvp::Status st = e_.step();
    if (!st.is_ok()) fail("step " + std::to_string(e_.steps_done()) + ": " + st.message());
    const kvp::Status progress = kvp::check_progress(e_, watch_);
    if (!progress.is_ok()) fail(progress.message());
  }
  const kvp::TimelineWitness& witness() const { return witness_; }

 private:
  kvp::Engine& e_;
  kvp::TimelineWitness witness_;
  kvp::ProgressWatch watch_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvp::fuzz::ByteReader in(data, size);
  const kvp::EngineConfig config = read_config(in);
  auto backend = std::make_unique<kvp::testing::FakeBackend>(config.kv.pool, kVocab, config.kv.sliding_window);
  auto created = kvp::Engine::create(config, *backend);
  if (!created.is_ok()) return 0;  // a configuration the engine refuses (checked by its own tests)
  kvp::Engine& engine = **created;
  Checked checked(engine);
  std::vector<kvp::RequestId> ids;
  for (int commands = 0; !in.empty() && commands < kMaxCommands; ++commands) {
    const uint8_t kind = in.u8();
    switch (kind % 8) {
      case 0:
      case 1:
      case 2:
      case 3: ids.push_back(engine.add_request(read_request(in))); break;
      case 4:
        if (!ids.empty()) engine.cancel(ids[in.u8() % ids.size()]);
        break;
      default:
        for (int s = 0, n = 1 + kind / 8 % 4; s < n; ++s) checked.step();
        break;
    }
  }
  for (int64_t s = 0; engine.has_unfinished(); ++s) {
    if (s == kMaxSteps) fail("requests still unfinished after " + std::to_string(kMaxSteps) + " steps");
    checked.step();
  }
  for (kvp::RequestId id : ids) {
    if (!engine.request(id).finished()) fail("request " + std::to_string(id) + " did not finish");
  }
  if (const kvp::Status st = kvp::check_timeline(engine, checked.witness()); !st.is_ok()) fail(st.message());
  if (const kvp::Status st = kvp::check_no_leak(engine.kv()); !st.is_ok()) fail(st.message());
  if (const kvp::Status st = engine.flush_prefix_cache_when_idle(); !st.is_ok()) fail(st.message());
  if (const kvp::Status st = kvp::check_all_free(engine.kv()); !st.is_ok()) fail(st.message());
  return 0;
}
