// Engine: the serving loop. add_request validates and queues; each step() schedules a
// BatchPlan, runs it on the backend, samples (or takes forced tokens), appends tokens,
// finishes requests at their stop token or length, and records metrics. Deterministic
// given the requests, their seeds and the configuration.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "optimized/backends/backend.h"
#include "optimized/engine/acceptance.h"
#include "optimized/engine/metrics.h"
#include "optimized/engine/request.h"
#include "optimized/engine/scheduler.h"
#include "optimized/engine/speculation.h"
#include "optimized/kv/kv_cache_manager.h"

namespace kvp {

struct EngineConfig {
  KvCacheConfig kv;
  SchedulerConfig scheduler;
  int64_t vocab_size = 0;  // of the model the backend runs
  // Fill BatchPlan's audit arrays (tenant scope of every block read) for the backend to
  // check. Ignored with global prefix sharing, where blocks legitimately cross tenants.
  bool audit_reads = false;
  // Speculative decoding for requests that do not choose (RequestSpec::speculation).
  SpeculationParams speculation;
  // The n-gram proposer's longest and shortest suffix.
  int32_t ngram_max = 3;
  int32_t ngram_min = 1;
  // A test hook: the statistical test plants a broken acceptance rule to prove its power.
  AcceptanceRule acceptance_rule = AcceptanceRule::kRejectionSampling;
};
Status validate(const EngineConfig& c);
// validate(c), and the backend's pool shape equals c.kv.pool.
Status check_compatible(const EngineConfig& c, const Backend& backend);

class Engine {
 public:
  // REQUIRES: check_compatible(config, backend).is_ok() (use create() to get that as a
  // Status); backend outlives the engine.
  Engine(const EngineConfig& config, Backend& backend);
  // As the constructor; an invalid config, or a backend whose pool shape is not
  // config.kv.pool, is an error naming the difference.
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config, Backend& backend);

  // Queues a request. A request with n > 1 parallel samples gets n - 1 more ids once its
  // prompt is computed (Request::children). Requests that can never run are rejected now,
  // with a reason (empty
  // prompt, token outside the vocabulary, prompt + max_tokens > max_model_len, more blocks
  // than the pool, bad sampling parameters); a rejected request is finished at once and
  // nothing else changes. Either way the id names the request's result.
  RequestId add_request(RequestSpec spec);
  // Installs the draft-model proposer (speculation.h) that requests with proposer kDraft
  // use; without one they are rejected. REQUIRES: no step has run yet.
  void set_draft_proposer(std::unique_ptr<Proposer> proposer);
  const Proposer* draft_proposer() const { return draft_.get(); }

  // Cancels a request and its parallel samples; takes effect at the next step boundary
  // (the start of the next step): the request ends there, cancelled, whatever it was doing,
  // and its device and host blocks are released. Unknown or finished: no-op.
  void cancel(RequestId id);

  // Drops the logits a finished request captured (every row becomes empty; the row count
  // stays), for a driver that has consumed them: verify checks each request against the
  // oracle as it finishes, so one run never holds every request's logits at once. Returns
  // false and changes nothing for an unknown or unfinished id.
  bool release_logits(RequestId id);
  // The same, handing the rows over instead (verify's oracle checks them on another
  // thread); nothing for an unknown or unfinished id.
  std::optional<std::vector<std::vector<float>>> take_logits(RequestId id);
  // The rows a request (finished or not) has captured since the last call, as (position,
  // row), in position order; their slots become empty and later rows still land at their
  // positions. For a driver that only digests rows (verify's lone re-runs): a taken row is
  // no longer compared with its recomputation (recomputed_logit_mismatches), so a driver
  // that takes rows mid-run compares them itself. Unknown id: nothing.
  std::vector<std::pair<int64_t, std::vector<float>>> take_captured_logits(RequestId id);

  // Drops the record of a finished request (its id is never reused). A long-running driver
  // (kvproof simulate) calls it once it has read the request's results, so memory and the
  // per-step walk over requests stay bounded by the requests in flight. metrics() no longer
  // sees a forgotten request. Returns false (and changes nothing) for an unknown or
  // unfinished id, or a forked request whose parallel samples are still known.
  bool forget(RequestId id);

  // One step. Errors come from the backend (a plan it could not run) or a step observer.
  Status step();
  bool has_unfinished() const;
  int64_t steps_done() const { return step_; }

  // Called after every step with the plan that ran (invariant checks in verify and audit).
  using StepObserver = std::function<Status(const Engine&, const BatchPlan&)>;
  void set_step_observer(StepObserver observer) { observer_ = std::move(observer); }
  // Called with each plan after scheduling and before the backend runs it (checks of the
  // plan against the manager's state: slot mapping, exclusive writes, resource bounds).
  // An error stops the step before anything runs.
  void set_plan_observer(StepObserver observer) { plan_observer_ = std::move(observer); }

  const Request& request(RequestId id) const { return *requests_.at(id); }
  const std::map<RequestId, std::unique_ptr<Request>>& requests() const { return requests_; }
  const KvCacheManager& kv() const { return kv_; }
  // The two operations on the KV manager that callers other than the scheduler need; nothing
  // else reaches it behind the scheduler.
  // Every KV transition from now on also goes to `log` (null: none). Between steps only; the
  // log must outlive the engine or be detached first.
  void set_kv_event_log(EventLog* log) { kv_.set_event_log(log); }
  // Drops every cached-evictable block, so that after a run every block is free (I6's second
  // half). Errors: a request is unfinished (its sequences hold blocks the flush must not see).
  Status flush_prefix_cache_when_idle();
  const Scheduler& scheduler() const { return scheduler_; }
  const EngineConfig& config() const { return config_; }
  EngineMetrics metrics() const;
  // The running totals metrics() is built from, without its per-request walk.
  const EngineCounters& counters() const { return counters_; }

 private:
  friend class EngineTestPeer;  // tests plant state the scheduler does not know (a leak)
  void reject(Request& r, std::string reason);
  // Ends a request through the scheduler (which frees its blocks) and records when.
  void finish(Request& r, FinishReason reason);
  void record_finish(Request& r);
  // Samples the plan's outputs and hands the outcome to Scheduler::apply, the one place
  // KV-cache state changes after a step.
  void process_outputs(const BatchPlan& plan, const StepOutput& out);
  void fill_audit_arrays(BatchPlan& plan) const;
  // The n - 1 parallel samples of a request whose prompt is computed, as new requests (the
  // scheduler forks their KV-cache sequences in apply).
  std::vector<Request*> make_samples(Request& r);
  // Samples (or takes the forced) next token and decides whether it ends the request (stop
  // token or length); changes no KV-cache or queue state.
  StepUpdate::Token next_token(Request& r, std::span<const float> logits);
  // The stop rule, for plain and speculative decoding alike: the reason `token`, r's
  // num_generated-th generated token, ends r (a stop token, else the length limit), or kNone.
  static FinishReason finish_after(const Request& r, int32_t token, int64_t num_generated);
  // Keeps rows [row0, row0 + rows) of `out` as the logits of positions first_pos.. when r
  // captures logits, counting a recomputed position whose logits changed a bit.
  static void capture_logits(Request& r, const StepOutput& out, int32_t row0, int64_t first_pos, int32_t rows);
  // The speculation a request uses (its own, or the engine's default).
  SpeculationParams speculation_of(const Request& r) const;
  // Proposals for every running request that is decoding and speculates.
  DraftTokens propose();
  // A verification row: acceptance, then the tokens it emits (drafts kept and the target's
  // next token, cut at a stop token or the length limit) into `update`.
  void verify_drafts(Request& r, const StepOutput& out, int32_t row0, StepUpdate& update);
  double now() const;

  EngineConfig config_;
  Backend& backend_;
  KvCacheManager kv_;
  Scheduler scheduler_;
  std::map<RequestId, std::unique_ptr<Request>> requests_;
  RequestId next_id_ = 0;
  int64_t step_ = 0;
  StepObserver observer_;
  StepObserver plan_observer_;
  NgramProposer ngram_;
  std::unique_ptr<Proposer> draft_;
  // Draft distributions of this step's sampled draft-model proposals, by request.
  std::unordered_map<RequestId, std::vector<std::vector<double>>> draft_probs_;
  EngineCounters counters_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace kvp
