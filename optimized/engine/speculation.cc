#include "optimized/engine/speculation.h"

#include <algorithm>
#include <set>

#include "kernels/kv_index.h"
#include "optimized/engine/acceptance.h"
#include "optimized/engine/scheduler.h"

namespace kvp {

const char* to_string(ProposerKind k) {
  switch (k) {
    case ProposerKind::kOff: return "off";
    case ProposerKind::kNgram: return "ngram";
    case ProposerKind::kDraft: return "draft";
  }
  return "?";
}

// ---------------------------------------------------------------- n-gram

NgramProposer::NgramProposer(int32_t max_n, int32_t min_n) : max_n_(max_n), min_n_(min_n) {
  KVP_CHECK(1 <= min_n && min_n <= max_n);
}

std::vector<int32_t> NgramProposer::lookup(std::span<const int32_t> tokens, int32_t k) const {
  const auto len = static_cast<int64_t>(tokens.size());
  for (int64_t n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<std::size_t>(len - n));
    // The most recent earlier occurrence (its continuation is the freshest evidence).
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t to = std::min(len, from + k);
      return {tokens.begin() + from, tokens.begin() + to};
    }
  }
  return {};
}

Status NgramProposer::propose(std::span<const ProposalRequest> requests, std::vector<Proposal>& out) {
  out.assign(requests.size(), Proposal{});
  for (std::size_t i = 0; i < requests.size(); ++i) out[i].tokens = lookup(requests[i].tokens, requests[i].k);
  return Status::ok();
}

// ---------------------------------------------------------------- draft model

namespace {
KvCacheConfig draft_kv_config(KvCacheConfig kv) {
  kv.enable_prefix_caching = false;
  kv.poison_on_free = false;
  kv.watermark_blocks = 0;
  return kv;
}
// The draft's sampling stream for the draft token at `position`: a pure function of the
// request's seed and the position, so a proposal does not depend on which step made it.
constexpr uint64_t kDraftStream = 0x64726166745f7371ull;
}  // namespace

DraftModelProposer::DraftModelProposer(std::unique_ptr<Backend> backend, KvCacheConfig kv, int64_t vocab_size)
    : backend_(std::move(backend)), kv_(draft_kv_config(kv)), vocab_size_(vocab_size) {
  KVP_CHECK(backend_ != nullptr && backend_->pool_shape() == kv.pool);
}

bool DraftModelProposer::sync(const ProposalRequest& r, int64_t& reserved_blocks) {
  const auto len = static_cast<int64_t>(r.tokens.size());
  if (kv_.sequence(r.id) == nullptr) KVP_CHECK(kv_.add_sequence(r.id, 0, std::span<const int32_t>()).is_ok());
  const SequenceState* s = kv_.sequence(r.id);
  int64_t common = 0;
  const int64_t limit = std::min<int64_t>(len - 1, static_cast<int64_t>(s->tokens.size()));
  while (common < limit && s->tokens[static_cast<std::size_t>(common)] == r.tokens[static_cast<std::size_t>(common)])
    ++common;
  common = std::min(common, s->num_slots);
  KVP_CHECK(kv_.truncate(r.id, common).is_ok());  // rollback in step with the target
  KVP_CHECK(kv_.append_tokens(r.id, r.tokens.subspan(static_cast<std::size_t>(common))).is_ok());
  // Room for the catch-up forward and the k - 1 single-token forwards after it.
  const int64_t final_len = len + r.k - 1;
  const int64_t blocks_needed =
      kernels::blocks_for_tokens(final_len, kv_.block_size()) - kv_.sequence(r.id)->table().size();
  if (blocks_needed > kv_.device_allocator().num_available() - reserved_blocks) return false;
  reserved_blocks += std::max<int64_t>(0, blocks_needed);
  return true;
}

Status DraftModelProposer::forward(const std::vector<std::size_t>& rows, std::span<const ProposalRequest> requests,
                                   StepOutput& out) {
  BatchPlan plan;
  plan.step = step_++;
  plan.query_start.push_back(0);
  for (std::size_t i : rows) {
    const ProposalRequest& r = requests[i];
    const SequenceState* s = kv_.sequence(r.id);
    const int64_t start = s->num_slots;
    const int64_t n = static_cast<int64_t>(s->tokens.size()) - start;
    KVP_CHECK(kv_.allocate_slots(r.id, n, kv_.find_prefix(r.id), plan.slot_mapping) == AllocStatus::kOk);
    add_plan_row(plan, r.id, s->tokens, start + n, n, /*needs_logits=*/true, /*logits_all=*/false);
  }
  finish_plan(kv_, plan);
  ++forwards_;
  return backend_->execute(plan, out);
}

Status DraftModelProposer::propose(std::span<const ProposalRequest> requests, std::vector<Proposal>& out) {
  out.assign(requests.size(), Proposal{});
  // Draft sequences of requests not asked about now (finished, preempted, cancelled, or
  // simply not decoding this step) are dropped; they are rebuilt if the request comes back.
  std::set<RequestId> asked;
  for (const ProposalRequest& r : requests) asked.insert(r.id);
  std::vector<SeqId> stale;
  for (const auto& [id, s] : kv_.sequences())
    if (asked.count(id) == 0) stale.push_back(id);
  for (SeqId id : stale) KVP_CHECK(kv_.free(id).is_ok());

  std::vector<std::size_t> active;
  int64_t reserved_blocks = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].k <= 0 || requests[i].tokens.empty()) continue;
    if (sync(requests[i], reserved_blocks)) {
      active.push_back(i);
    } else {
      KVP_CHECK(kv_.free(requests[i].id).is_ok());  // no room: no proposal, and give the room back
    }
  }
  for (int32_t j = 0; !active.empty(); ++j) {
    StepOutput logits;
    KVP_RETURN_IF_ERROR(forward(active, requests, logits).with_context("draft model"));
    std::vector<std::size_t> next;
    for (std::size_t a = 0; a < active.size(); ++a) {
      const std::size_t i = active[a];
      const ProposalRequest& r = requests[i];
      const std::span<const float> row(logits.row(logits.logit_row_start[a]), static_cast<std::size_t>(vocab_size_));
      int32_t d;
      if (r.sampling.greedy()) {
        d = argmax(row);
      } else {
        std::vector<double> q = sampling_distribution(row, r.sampling);
        const int64_t position = static_cast<int64_t>(kv_.sequence(r.id)->tokens.size());
        Rng rng(mix_seed(r.sampling.seed ^ kDraftStream, static_cast<uint64_t>(position)));
        d = draw_from(q, rng);
        out[i].draft_probs.push_back(std::move(q));
      }
      out[i].tokens.push_back(d);
      if (static_cast<int32_t>(out[i].tokens.size()) < r.k) {
        KVP_CHECK(kv_.append_tokens(r.id, std::span<const int32_t>(&d, 1)).is_ok());
        next.push_back(i);
      }
    }
    active = std::move(next);
  }
  return Status::ok();
}

}  // namespace kvp
