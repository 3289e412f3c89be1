// Invariant checkers that need the engine (its requests and scheduler) besides the
// KV-cache manager. Same contract as invariants.h: ok, or the first violation named.
#pragma once

#include "common/status.h"
#include "optimized/checkers/invariants.h"
#include "optimized/engine/engine.h"

namespace kvp {

// check_plan (invariants.h) with the engine's scheduler bounds and running count.
Status check_plan(const Engine& e, const BatchPlan& plan, PlanReadStats* stats = nullptr);

// I10 one token history: every request that holds a KV-cache sequence has exactly the
// tokens the manager hashes its blocks from (Request::tokens == SequenceState::tokens), and
// no request has draft tokens in flight (speculative drafts live in both histories only
// between schedule() and apply() of a step; between steps every token is accepted, so the
// equality is between accepted histories).
Status check_token_history(const Engine& e);

// Cancellation: every request whose cancellation took effect in a step that has run ended
// cancelled at exactly that step (the first boundary after Engine::cancel), and holds no
// KV-cache sequence (its device and host blocks were released).
Status check_cancellations(const Engine& e);

// Everything that holds between steps: check_all on the manager, check_token_history and
// check_cancellations.
Status check_engine_state(const Engine& e);

}  // namespace kvp
