#include "optimized/checkers/engine_invariants.h"

#include <string>

namespace kvp {

Status check_plan(const Engine& e, const BatchPlan& plan, PlanReadStats* stats) {
  const SchedulerConfig& sc = e.config().scheduler;
  const PlanBounds bounds{sc.max_num_batched_tokens, sc.max_num_seqs, sc.max_model_len,
                          e.scheduler().num_running()};
  return check_plan(e.kv(), plan, bounds, stats);
}

Status check_token_history(const Engine& e) {
  for (const auto& [id, r] : e.requests()) {
    if (r->num_drafts != 0)
      return Status::error("I10: request " + std::to_string(id) + " has " + std::to_string(r->num_drafts) +
                           " draft tokens in flight between steps (not rolled back or accepted)");
    const SequenceState* s = e.kv().sequence(id);
    if (r->in_kv != (s != nullptr))
      return Status::error("I10: request " + std::to_string(id) + (r->in_kv ? " claims" : " does not claim") +
                           " a KV-cache sequence, the manager " + (s != nullptr ? "has" : "has none"));
    if (s == nullptr) continue;
    if (s->tokens != r->tokens) {
      std::size_t p = 0;
      while (p < s->tokens.size() && p < r->tokens.size() && s->tokens[p] == r->tokens[p]) ++p;
      return Status::error("I10: request " + std::to_string(id) + " has " + std::to_string(r->tokens.size()) +
                           " tokens, its KV-cache sequence " + std::to_string(s->tokens.size()) +
                           "; first difference at position " + std::to_string(p));
    }
  }
  return Status::ok();
}

Status check_engine_state(const Engine& e) {
  KVP_RETURN_IF_ERROR(check_all(e.kv()));
  return check_token_history(e);
}

}  // namespace kvp
