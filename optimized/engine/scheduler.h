// The continuous-batching scheduler: waiting, running and swapped queues; one schedule()
// per step builds a BatchPlan whose every slot is already reserved in the KvCacheManager.
//
// Order of service in a step (S1 progress, S2 protection of admitted work):
//   1. running requests, oldest first: a decode token, or the next prefill chunk. When the
//      pool cannot hold a running request's tokens, the most recently arrived running
//      request is preempted (recompute: free its blocks and requeue it at the front of the
//      waiting queue; swap: move its blocks to the host pool, falling back to recompute when
//      the host pool is full) until it fits, or until the request itself was the newest.
//   2. swapped requests, oldest first, when nothing was preempted this step.
//   3. waiting requests, FCFS (no overtaking), when nothing is swapped out or was preempted,
//      under the admission rule:
//        optimistic   the manager's watermark of free blocks;
//        conservative the worst case (prompt + max_tokens) of every running request plus
//                     the new one fits in the pool: no preemption can ever happen.
// Limits: max_num_batched_tokens per step, max_num_seqs running, prefill_chunk_size tokens
// per request per step. Admission never drops a running request.
//
// Speculative decoding: schedule() may be given draft tokens for running requests that are
// decoding. try_plan then plans a verification row of 1 + k' tokens (k' <= k, within the
// token budget and chunk size, and below what the request may still generate), charged
// against the budget, with logits for every row, when the pool holds all of them: the
// drafts go to allocate_slots as lookahead, which appends them to the KV-cache sequence
// with their slots or changes nothing. Only then are they appended to the request. When
// the pool cannot hold them the request decodes one token (drafts never preempt their own request's
// neighbours directly; like any growth they may leave a newer request short later in the
// step under optimistic admission, never beyond worst_case_blocks). apply() rolls
// back the rejected drafts (truncate) before anything is marked final, so only accepted
// positions ever become final or enter the prefix cache (I9). A request carries drafts only
// between schedule() and apply() of one step, so cancellation, preemption, swapping and
// forking (all decided outside that window) only ever see accepted tokens.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "optimized/backends/batch_plan.h"
#include "optimized/engine/request.h"
#include "optimized/kv/kv_cache_manager.h"

namespace kvp {

enum class AdmissionRule { kOptimistic, kConservative };
enum class PreemptionMode { kRecompute, kSwap };

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 256;
  int32_t max_num_seqs = 32;
  int64_t max_model_len = 2048;
  int32_t prefill_chunk_size = 256;
  AdmissionRule admission = AdmissionRule::kOptimistic;
  PreemptionMode preemption = PreemptionMode::kRecompute;
};
Status validate(const SchedulerConfig& c);

// What one schedule() decided, besides the plan.
struct ScheduleStats {
  int64_t preemptions = 0;
  int64_t swaps_out = 0;
  int64_t swaps_in = 0;
  int64_t admitted = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_lookup_tokens = 0;  // tokens of admitted sequences looked up in the prefix cache
};

// One step's plan and what deciding it did.
struct ScheduledStep {
  BatchPlan plan;
  ScheduleStats stats;
};

// What the engine made of one executed plan, for Scheduler::apply. The engine decides
// (samples tokens, decides stops); the scheduler changes the state.
struct StepUpdate {
  struct Fork {
    Request* parent = nullptr;
    std::vector<Request*> children;  // new requests (state kWaiting, in_kv false)
  };
  struct Token {
    Request* request = nullptr;
    int32_t token = 0;
    FinishReason finish = FinishReason::kNone;  // kStop or kLength ends the request with it
  };
  // A verification row's outcome: the first num_accepted of the request's num_drafts drafts
  // are kept, the rest rolled back. Every request planned with drafts has exactly one.
  struct Verification {
    Request* request = nullptr;
    int32_t num_accepted = 0;
  };
  std::vector<Fork> forks;
  std::vector<Verification> verifications;
  std::vector<Token> tokens;
};

// Draft tokens proposed for running requests this step (see the header comment).
using DraftTokens = std::unordered_map<RequestId, std::vector<int32_t>>;

// Adds one sequence's row to every planner's plan (the scheduler's and the draft model's):
// the tokens at positions [end - n, end) of `tokens`, context length `end`, and which logits
// it asks for. The row's slots are the ones allocate_slots appended to plan.slot_mapping.
// REQUIRES: 0 < n <= end <= tokens.size().
void add_plan_row(BatchPlan& plan, SeqId seq, std::span<const int32_t> tokens, int64_t end, int64_t n,
                  bool needs_logits, bool logits_all);

// Ends every planner (the scheduler's and the draft model's): the plan's block tables from
// the manager's, padded with -1 to the longest, every group's (group-major), and the memory
// ops the manager queued. With KV-cache groups, the planner collected each group's slots in
// group_slots[g] (plan.slot_mapping stays empty until here) and they are laid out group-major.
void finish_plan(KvCacheManager& kv, BatchPlan& plan, std::span<std::vector<int64_t>> group_slots = {});

class Scheduler {
 public:
  // REQUIRES: validate(config).is_ok(); kv outlives the scheduler.
  Scheduler(const SchedulerConfig& config, KvCacheManager& kv);

  // Queues a validated request at the back of the waiting queue; its token history starts
  // as its prompt.
  void add(Request* r);
  // Ends a request that was never queued (the engine refused it), with its reason: every
  // request state change goes through the scheduler. REQUIRES: r was not add()ed.
  void reject(Request* r, std::string reason);
  // A parallel sample (a new request, not yet added) of `parent`, which the engine makes
  // after the parent's prompt is computed: its token history is a copy of the parent's until
  // apply() forks the parent's KV-cache sequence, which then holds it.
  void prepare_sample(const Request& parent, Request* child);
  // Ends a request that is waiting, running or swapped: frees its blocks, drops it from
  // its queue. REQUIRES: !r->finished().
  void finish(Request* r, FinishReason reason);

  // Builds the plan of step `step`: every slot in it is reserved in the KvCacheManager, and
  // the plan carries the manager's pending memory ops. `drafts`: proposals for running
  // decoding requests (others are ignored).
  ScheduledStep schedule(int64_t step, const DraftTokens& drafts = {});

  // Applies what the engine made of `plan` after the backend executed it, the only way the
  // engine changes KV-cache state: in that order,
  //   0. each verification rolls back its rejected drafts (request tokens and sequence
  //      truncated; blocks past the new end released);
  //   1. every scheduled sequence's positions up to its context length (after the
  //      rollback: its accepted positions) become final (full blocks enter the prefix cache);
  //   2. each fork's children become running sequences sharing the parent's blocks;
  //   3. each token is appended to its request and its sequence, or ends the request
  //      (its blocks are freed) when it carries a finish reason.
  // REQUIRES: `plan` is the last plan schedule() returned, executed; the update's requests
  // are running.
  void apply(const BatchPlan& plan, const StepUpdate& update);

  const SchedulerConfig& config() const { return config_; }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_swapped() const { return static_cast<int64_t>(swapped_.size()); }
  bool idle() const { return waiting_.empty() && running_.empty() && swapped_.empty(); }
  const std::vector<Request*>& running() const { return running_; }

  // Worst-case blocks of a request: blocks_for_tokens(prompt + max_tokens), and for n
  // parallel samples the prompt's full blocks once plus each sample's own blocks.
  int64_t worst_case_blocks(const Request& r) const;
  // Running sequences held or reserved (a request that will fork reserves n).
  int64_t seats_in_use() const;
  // Positions r still has to compute: its tokens past the slots its sequence holds (past
  // the cached prefix `hit` it will take, for a sequence with no blocks yet).
  // REQUIRES: hit is the manager's find_prefix(r.id), with no state change since.
  int64_t tokens_to_compute(const Request& r, const PrefixHit& hit) const;
  // tokens_to_compute(r, find_prefix(r.id)).
  int64_t tokens_to_compute(const Request& r) const;

 private:
  // Adds r's next tokens (up to `budget`) to the plan if the pool allows, preempting the
  // newest running requests as needed. Returns the tokens scheduled (0: r was preempted or
  // has nothing to compute).
  int64_t schedule_running(Request* r, int64_t budget, BatchPlan& plan, ScheduleStats& stats);
  // What try_plan did: n tokens planned; when none, fit says whether the pool could hold
  // them later (kLater) or never (kNever); kOk with n = 0: nothing to compute.
  struct Planned {
    int64_t n = 0;
    AllocStatus fit = AllocStatus::kOk;
    int64_t prefix_hit_tokens = 0;  // positions skipped because the prefix cache held them
  };
  // The one path from "tokens to run" to a plan row: the prefix is looked up once, n = the
  // tokens r may run within `budget` and the chunk size (with drafts, 1 + k' when the pool
  // holds them all); if the pool holds them now, reserves their slots and adds r's row to
  // the plan; otherwise changes nothing. REQUIRES: r holds a KvCacheManager sequence on the
  // device.
  // allocate_slots for one row of the plan: its slots go to plan.slot_mapping, or with
  // KV-cache groups to group_slots_ (finish_plan lays them out).
  AllocStatus allocate(SeqId seq, int64_t n, const PrefixHit& hit, BatchPlan& plan,
                       std::span<const int32_t> drafts = {});
  Planned try_plan(Request* r, int64_t budget, BatchPlan& plan);
  void preempt(Request* victim, ScheduleStats& stats);
  // Moves r's token history into a new KvCacheManager sequence (r reads it from there).
  void take_sequence(Request* r);
  // Frees r's KvCacheManager sequence, moving its token history back into r.
  void release_sequence(Request* r);
  void insert_running(Request* r);  // keeps running_ in arrival (id) order
  // The drafts r may carry in a verification row of at most `max_tokens` tokens (empty:
  // none). REQUIRES: hit is the manager's find_prefix(r.id), with no state change since.
  std::span<const int32_t> drafts_for(const Request& r, int64_t max_tokens, const PrefixHit& hit) const;

  SchedulerConfig config_;
  KvCacheManager& kv_;
  // With KV-cache groups: each group's slots of the step being planned (see finish_plan).
  std::vector<std::vector<int64_t>> group_slots_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;        // oldest first
  std::deque<Request*> swapped_;         // oldest first
  const DraftTokens* drafts_ = nullptr;  // during schedule() only
};

}  // namespace kvp
