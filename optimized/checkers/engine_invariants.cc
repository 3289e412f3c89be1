#include "optimized/checkers/engine_invariants.h"

#include <string>

namespace kvp {

Status check_plan(const Engine& e, const BatchPlan& plan, PlanReadStats* stats) {
  const SchedulerConfig& sc = e.config().scheduler;
  const PlanBounds bounds{sc.max_num_batched_tokens, sc.max_num_seqs, sc.max_model_len, e.scheduler().num_running()};
  return check_plan(e.kv(), plan, bounds, stats);
}

Status check_token_history(const Engine& e) {
  for (const auto& [id, r] : e.requests()) {
    if (r->num_drafts() != 0)
      return Status::error("I10: request " + std::to_string(id) + " has " + std::to_string(r->num_drafts()) +
                           " draft tokens in flight between steps (not rolled back or accepted)");
    const SequenceState* s = e.kv().sequence(id);
    if (r->in_kv() != (s != nullptr))
      return Status::error("I10: request " + std::to_string(id) + (r->in_kv() ? " claims" : " does not claim") +
                           " a KV-cache sequence, the manager " + (s != nullptr ? "has" : "has none"));
    // One home: the request reads its sequence's vector itself, so the values are compared
    // only when it does not (the difference says which copy went wrong).
    if (s == nullptr || &s->tokens == &r->tokens()) continue;
    if (s->tokens != r->tokens()) {
      std::size_t p = 0;
      while (p < s->tokens.size() && p < r->tokens().size() && s->tokens[p] == r->tokens()[p]) ++p;
      return Status::error("I10: request " + std::to_string(id) + " has " + std::to_string(r->tokens().size()) +
                           " tokens, its KV-cache sequence " + std::to_string(s->tokens.size()) +
                           "; first difference at position " + std::to_string(p));
    }
    return Status::error("I10: request " + std::to_string(id) +
                         " reads a copy of its token history, not its KV-cache sequence's (one home)");
  }
  return Status::ok();
}

Status check_cancellations(const Engine& e) {
  for (const auto& [id, r] : e.requests()) {
    // Pending: cancelled since the last step ran.
    if (!r->cancel_requested || (!r->finished() && r->cancel_step >= e.steps_done())) continue;
    const std::string who =
        "request " + std::to_string(id) + " (cancelled before step " + std::to_string(r->cancel_step) + ")";
    if (r->finish() != FinishReason::kCancelled || r->time.finish_step != r->cancel_step)
      return Status::error(who + ": ended " + to_string(r->finish()) + " at step " +
                           std::to_string(r->time.finish_step) + ", expected cancelled at step " +
                           std::to_string(r->cancel_step));
    if (r->in_kv() || e.kv().sequence(id) != nullptr)
      return Status::error(who + ": still holds a KV-cache sequence (blocks not released)");
  }
  return Status::ok();
}

Status check_progress(const Engine& e, ProgressWatch& w, int64_t max_idle_steps) {
  const EngineCounters& c = e.counters();
  const int64_t progress = c.scheduled_tokens + c.cancellations + c.rejections;
  if (progress != w.last_progress || !e.has_unfinished()) {
    w.last_progress = progress;
    w.idle_steps = 0;
    return Status::ok();
  }
  if (++w.idle_steps < max_idle_steps) return Status::ok();
  std::string stuck;
  int listed = 0;
  for (const auto& [id, r] : e.requests()) {
    if (r->finished()) continue;
    if (++listed > 8) {
      stuck += ", ...";
      break;
    }
    const char* state = r->state() == RequestState::kWaiting   ? "waiting"
                        : r->state() == RequestState::kSwapped ? "swapped"
                                                               : "running";
    stuck += (stuck.empty() ? "" : ", ") + std::to_string(id) + " (" + state + ")";
  }
  return Status::error(
      "S1 progress: " + std::to_string(w.idle_steps) +
      " steps in a row scheduled no token and ended no request while requests are unfinished; stuck: " + stuck);
}

void record_timeline(const Engine& e, const BatchPlan& plan, bool after_step, TimelineWitness& w) {
  if (!after_step) {
    for (int64_t id : plan.seq_ids) w.first_scheduled.emplace(id, plan.step);
    return;
  }
  for (const auto& [id, r] : e.requests()) {
    if (r->num_generated() > 0) w.first_token.emplace(id, plan.step);
    if (r->finished()) w.finished.emplace(id, plan.step);
  }
}

Status check_timeline(const Engine& e, const TimelineWitness& w, int64_t* compared) {
  int64_t n = 0;
  Status first = Status::ok();
  for (const auto& entry : e.requests()) {
    const RequestId id = entry.first;
    const Request* r = entry.second.get();
    if (r->finish() == FinishReason::kRejected || !r->finished()) continue;
    const RequestTimeline& t = r->time;
    const std::string who = "request " + std::to_string(id);
    const auto expect = [&](const char* what, int64_t got, const std::map<RequestId, int64_t>& seen) -> Status {
      auto it = seen.find(id);
      const int64_t want = it == seen.end() ? -1 : it->second;
      if (got != want)
        return Status::error(who + ": " + what + " step " + std::to_string(got) + ", but the steps show " +
                             std::to_string(want));
      return Status::ok();
    };
    // A forked parallel sample inherits its parent's timeline (it was scheduled and produced
    // its first token as part of the parent): only its finish is its own.
    if (first && r->parent < 0) first = expect("first scheduled", t.first_scheduled_step, w.first_scheduled);
    if (first && r->parent < 0) first = expect("first token", t.first_token_step, w.first_token);
    if (first) first = expect("finish", t.finish_step, w.finished);
    ++n;
  }
  if (compared != nullptr) *compared = n;
  return first;
}

Status check_engine_state(const Engine& e) {
  KVP_RETURN_IF_ERROR(check_all(e.kv()));
  KVP_RETURN_IF_ERROR(check_token_history(e));
  return check_cancellations(e);
}

}  // namespace kvp
