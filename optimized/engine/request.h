// A request as the engine sees it: what the user asked for, and what became of it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/rng.h"
#include "common/sampling.h"

namespace kvp {

using RequestId = int64_t;

// Speculative decoding (optimized/engine/speculation.h): who proposes draft tokens, and how
// many per step at most. k = 0 or proposer kOff decodes one token per step.
enum class ProposerKind { kOff, kNgram, kDraft };
const char* to_string(ProposerKind k);
struct SpeculationParams {
  ProposerKind proposer = ProposerKind::kOff;
  int32_t k = 4;
  bool enabled() const { return proposer != ProposerKind::kOff && k > 0; }
};

struct RequestSpec {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  int64_t tenant = 0;
  // Finishes (reason stop) when it generates any of these (a model's eos_token_id list, or
  // a workload's stop_token).
  std::vector<int32_t> stop_tokens;
  bool is_stop(int32_t token) const {
    return std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end();
  }
  // Teacher forcing (a test hook): the i-th generated token is forced_tokens[i] instead of
  // a sampled one, for as many tokens as given.
  std::vector<int32_t> forced_tokens;
  // Keep the logits of every position (prompt and generated), not only those sampled from.
  bool capture_logits = false;
  // Parallel sampling: once the prompt is computed the sequence forks into n sequences that
  // share the prompt's blocks (the first write to the shared last block copies it); sample k
  // (k = 0 is this request, 1..n-1 new requests) draws from seed + k.
  int32_t n = 1;
  // Speculative decoding for this request; unset: the engine's default
  // (EngineConfig::speculation).
  std::optional<SpeculationParams> speculation;
};

enum class RequestState { kWaiting, kRunning, kSwapped, kFinished };
enum class FinishReason { kNone, kStop, kLength, kCancelled, kRejected };
const char* to_string(FinishReason r);

// Step numbers count engine steps from 0; a request that arrives before step s is first
// schedulable in step s.
struct RequestTimeline {
  int64_t arrival_step = 0;
  int64_t first_scheduled_step = -1;
  int64_t first_token_step = -1;
  int64_t finish_step = -1;
  double arrival_s = 0, first_scheduled_s = -1, first_token_s = -1, finish_s = -1;  // wall clock
};

// A request, split by owner (docs/architecture.md, "Who owns which state"):
//   what was asked   id and spec: set when the engine makes the request, const after;
//   the scheduler's  queue state, finish reason, token history, drafts in flight, whether
//                    it holds a KV-cache sequence, and what scheduling did to it: private,
//                    written by the Scheduler only, read through the accessors;
//   the engine's     sampling stream, cancellation, parallel samples, logits, timeline and
//                    speculation figures: public, written by the Engine.
class Request {
 public:
  Request(RequestId request_id, RequestSpec what) : id(request_id), spec(std::move(what)), rng(spec.sampling.seed) {}

  // ---- what was asked ----
  const RequestId id;
  const RequestSpec spec;

  // ---- the scheduler's (read-only here) ----
  RequestState state() const { return state_; }
  FinishReason finish() const { return finish_; }
  const std::string& reject_reason() const { return reject_reason_; }
  // Prompt, then generated tokens: the token history. Between schedule() and apply() of a
  // step the last num_drafts() of them are draft tokens in flight; apply() keeps the
  // accepted ones and rolls the rest back, so between steps num_drafts() is 0 and every
  // token is accepted. The history has one home: the request's own vector while it holds no
  // KV-cache sequence, the sequence's (SequenceState::tokens) while it does, so the plans,
  // the prefix-cache hashes and the request read one copy (I10 by construction).
  const std::vector<int32_t>& tokens() const { return kv_tokens_ != nullptr ? *kv_tokens_ : tokens_; }
  int32_t num_drafts() const { return num_drafts_; }
  bool in_kv() const { return in_kv_; }  // holds a KvCacheManager sequence (running or swapped)
  int64_t num_preemptions() const { return num_preemptions_; }
  int64_t num_swaps() const { return num_swaps_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

  // ---- the engine's ----
  Rng rng;  // the sampling stream: one draw per sampled token
  bool cancel_requested = false;
  // The step at whose start a requested cancellation takes effect (the next step after
  // Engine::cancel), and what the request was doing then: "waiting", "prefill" (running,
  // prompt not yet computed), "running" or "swapped".
  int64_t cancel_step = -1;
  std::string cancelled_in;
  bool forked = false;              // parallel samples created (spec.n > 1)
  RequestId parent = -1;            // for a parallel sample: the request it forked from
  std::vector<RequestId> children;  // for a forked request: its parallel samples

  // logits[p]: the logits at position p (predicting token p + 1), when captured.
  std::vector<std::vector<float>> logits;
  int64_t recomputed_logit_mismatches = 0;  // recomputed positions whose logits differed bitwise

  // Speculation: verification steps, draft tokens verified, draft tokens accepted.
  int64_t spec_steps = 0;
  int64_t spec_proposed = 0;
  int64_t spec_accepted = 0;
  RequestTimeline time;
  // Draft tokens a decode step of this request may add at most (its speculation's k, 0
  // without): set by the engine when it accepts the request; bounds a step's tokens.
  int32_t max_drafts = 0;

  // ---- derived ----
  int64_t num_prompt() const { return static_cast<int64_t>(spec.prompt.size()); }
  int64_t num_generated() const { return static_cast<int64_t>(tokens().size()) - num_prompt(); }
  std::vector<int32_t> output() const { return {tokens().begin() + num_prompt(), tokens().end()}; }
  bool finished() const { return state_ == RequestState::kFinished; }
  // Running sequences this request will occupy: n until it has forked.
  int64_t seats() const { return forked || spec.n <= 1 ? 1 : spec.n; }

  // A record of a finished request made outside any engine (a test's, or a tool's that
  // checks outputs it read): `tokens` is its token history.
  static Request record(RequestSpec spec, std::vector<int32_t> tokens) {
    Request r(0, std::move(spec));
    r.state_ = RequestState::kFinished;
    r.tokens_ = std::move(tokens);
    return r;
  }

 private:
  friend class Scheduler;
  friend class RequestTestPeer;  // tests give a request a second copy, to prove I10's checker sees it
  RequestState state_ = RequestState::kWaiting;
  FinishReason finish_ = FinishReason::kNone;
  std::string reject_reason_;
  std::vector<int32_t> tokens_;                      // the history while not in_kv
  const std::vector<int32_t>* kv_tokens_ = nullptr;  // while in_kv: the KV-cache sequence's
  int32_t num_drafts_ = 0;
  bool in_kv_ = false;
  int64_t num_preemptions_ = 0;
  int64_t num_swaps_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace kvp
