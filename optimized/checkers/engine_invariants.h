// Invariant checkers that need the engine (its requests and scheduler) besides the
// KV-cache manager. Same contract as invariants.h: ok, or the first violation named.
#pragma once

#include <cstdint>
#include <map>

#include "common/status.h"
#include "optimized/checkers/invariants.h"
#include "optimized/engine/engine.h"

namespace kvp {

// check_plan (invariants.h) with the engine's scheduler bounds and running count.
Status check_plan(const Engine& e, const BatchPlan& plan, PlanReadStats* stats = nullptr);

// I10 one token history: every request that holds a KV-cache sequence reads the very
// history the manager hashes its blocks from (Request::tokens() is SequenceState::tokens,
// the one home, not an equal copy), with exactly its tokens, and no request has draft
// tokens in flight (drafts live in the history only between schedule() and apply() of a
// step; between steps every token is accepted). The Scheduler keeps this by construction;
// the checker guards the construction.
Status check_token_history(const Engine& e);

// Cancellation: every request whose cancellation took effect in a step that has run ended
// cancelled at exactly that step (the first boundary after Engine::cancel), and holds no
// KV-cache sequence (its device and host blocks were released).
Status check_cancellations(const Engine& e);

// Everything that holds between steps: check_all on the manager, check_token_history and
// check_cancellations.
Status check_engine_state(const Engine& e);

// S1 progress: while some request is unfinished, a step schedules a token or ends a request
// (a cancellation or rejection) at least once every `max_idle_steps` steps. A correct
// engine never idles with work queued (every runnable request gets scheduled; a preempted
// one resumes), so a run that does is stuck: a leaked block, a reservation never freed.
// Call after every step with the same `watch`; the error names the stuck requests and their
// states, so a driving loop fails at once instead of spinning to its step limit.
inline constexpr int64_t kMaxIdleSteps = 32;

// The latency timeline, derived twice: a witness records, from the plans and the requests'
// states as the steps run (not from RequestTimeline), the step each request was first
// scheduled in, produced its first token in and ended in. check_timeline compares each
// request's own timeline (which queue time, TTFT, TPOT and end-to-end are computed from)
// with the witness, exactly: a first-scheduled step that moves when a preempted or swapped
// request is scheduled again, or a first token or finish recorded at the wrong step, fails.
struct TimelineWitness {
  std::map<RequestId, int64_t> first_scheduled, first_token, finished;
};
// Call from the plan observer (after_step false) and the step observer (after_step true).
void record_timeline(const Engine& e, const BatchPlan& plan, bool after_step, TimelineWitness& w);
// Returns ok or the first request whose timeline differs; `compared` counts the requests checked.
Status check_timeline(const Engine& e, const TimelineWitness& w, int64_t* compared = nullptr);
struct ProgressWatch {
  int64_t last_progress = -1;  // scheduled tokens + cancellations + rejections at the last progress
  int64_t idle_steps = 0;
};
Status check_progress(const Engine& e, ProgressWatch& watch, int64_t max_idle_steps = kMaxIdleSteps);

}  // namespace kvp
