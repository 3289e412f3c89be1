// Proposers for speculative decoding: each step, before scheduling, a proposer suggests up
// to k draft tokens for every running request that is decoding; the scheduler appends them
// to the request (and its KV-cache sequence) when it plans the request's verification row
// of 1 + k tokens, and Scheduler::apply rolls back the rejected ones (acceptance.h decides
// which).
//
// Two proposers:
//   NgramProposer       prompt lookup, no model: the continuation of the most recent
//                       earlier occurrence of the longest suffix (max_n down to min_n
//                       tokens) of the request's tokens.
//   DraftModelProposer  a smaller model with the target's vocabulary, run by a Backend of
//                       its own against a KvCacheManager of its own.
//
// Why the draft model owns a Backend and a KvCacheManager instead of reusing an Engine: an
// Engine's unit of work is a request that it samples and finishes itself; a draft model
// only ever runs k forwards for tokens the target engine decides, and must follow the
// target's token history exactly (rolled back when drafts are rejected, dropped when the
// target is preempted, cancelled or finished). A bare manager and backend keep that
// contract in ~150 lines: per request one draft sequence whose tokens are synchronised to
// the target's accepted tokens at every call (longest common prefix kept, the rest
// truncated: the rollback in step with the target), then one forward that catches up the
// unseen tokens and returns the first draft, then k - 1 single-token forwards. All requests
// share each forward (a batch). Draft sequences of requests not in a call are freed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/sampling.h"
#include "common/status.h"
#include "optimized/backends/backend.h"
#include "optimized/engine/request.h"
#include "optimized/kv/kv_cache_manager.h"

namespace kvp {

// One request to propose for: its accepted tokens (the last one not yet computed by the
// target), how many drafts at most, and how it samples.
struct ProposalRequest {
  RequestId id = 0;
  std::span<const int32_t> tokens;
  int32_t k = 0;
  SamplingParams sampling;
};

// Up to k draft tokens. draft_probs[j], when given, is the distribution draft j was drawn
// from (vocab entries); empty means a deterministic proposal (a point mass on the token),
// which is what the n-gram proposer and a greedy draft model give.
struct Proposal {
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> draft_probs;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // One proposal per request, in order. An error means the proposer could not run (its
  // backend failed); the engine then decodes without drafts.
  virtual Status propose(std::span<const ProposalRequest> requests, std::vector<Proposal>& out) = 0;
  virtual const char* name() const = 0;
};

class NgramProposer final : public Proposer {
 public:
  // REQUIRES: 1 <= min_n <= max_n.
  explicit NgramProposer(int32_t max_n = 3, int32_t min_n = 1);
  Status propose(std::span<const ProposalRequest> requests, std::vector<Proposal>& out) override;
  const char* name() const override { return "ngram"; }
  // The proposal for one token history (exposed for tests).
  std::vector<int32_t> lookup(std::span<const int32_t> tokens, int32_t k) const;

 private:
  int32_t max_n_, min_n_;
};

class DraftModelProposer final : public Proposer {
 public:
  // `backend` runs the draft model over plans against `kv.pool` (same shape as the backend's
  // pool); `vocab_size` is the draft model's, which must equal the target's. Prefix caching
  // is turned off in the draft's manager (its sequences are private scratch).
  // REQUIRES: validate(kv).is_ok(), backend->pool_shape() == kv.pool.
  DraftModelProposer(std::unique_ptr<Backend> backend, KvCacheConfig kv, int64_t vocab_size);
  Status propose(std::span<const ProposalRequest> requests, std::vector<Proposal>& out) override;
  const char* name() const override { return "draft"; }

  const KvCacheManager& kv() const { return kv_; }
  int64_t forwards() const { return forwards_; }

 private:
  // Keeps the draft sequence of `r` equal to r.tokens on their longest common prefix
  // (at most all but the last token), truncating the rest. Returns false when the draft
  // pool cannot hold the catch-up plus k - 1 drafts beside `reserved_blocks` already
  // promised to other requests of this call (then no proposal); else adds its blocks.
  bool sync(const ProposalRequest& r, int64_t& reserved_blocks);
  // Runs one forward over `rows` (request index, tokens to feed) and returns each row's
  // last logits. Every row's sequence already holds the fed tokens.
  Status forward(const std::vector<std::size_t>& rows, std::span<const ProposalRequest> requests, StepOutput& out);

  std::unique_ptr<Backend> backend_;
  KvCacheManager kv_;
  int64_t vocab_size_;
  int64_t step_ = 0;
  int64_t forwards_ = 0;
};

}  // namespace kvp
