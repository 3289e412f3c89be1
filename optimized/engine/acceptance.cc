#include "optimized/engine/acceptance.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/status.h"

namespace kvp {

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& params) {
  KVP_CHECK(!logits.empty());
  std::vector<double> probs(logits.size(), 0.0);
  if (params.greedy()) {
    probs[static_cast<std::size_t>(argmax(logits))] = 1.0;
    return probs;
  }
  const TruncatedDistribution d = truncated_distribution(logits, params);
  for (std::size_t i = 0; i < d.keep; ++i) probs[static_cast<std::size_t>(d.order[i])] = d.p[i] / d.total;
  return probs;
}

int32_t draw_from(std::span<const double> probs, Rng& rng) {
  const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  KVP_CHECK(total > 0);
  const double u = rng.uniform() * total;
  double acc = 0.0;
  int32_t last = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    acc += probs[i];
    last = static_cast<int32_t>(i);
    if (u < acc) return last;
  }
  return last;
}

AcceptResult accept_greedy(std::span<const int32_t> drafts, const VerifyRows& rows) {
  KVP_CHECK(rows.num_rows == static_cast<int64_t>(drafts.size()) + 1);
  AcceptResult r;
  for (std::size_t j = 0; j < drafts.size(); ++j) {
    const int32_t target = argmax(rows.row(static_cast<int64_t>(j)));
    if (target != drafts[j]) {
      r.next_token = target;
      return r;
    }
    ++r.num_accepted;
  }
  r.next_token = argmax(rows.row(static_cast<int64_t>(drafts.size())));
  return r;
}

AcceptResult accept_sampled(std::span<const int32_t> drafts, std::span<const std::vector<double>> draft_probs,
                            const VerifyRows& rows, const SamplingParams& params, Rng& rng, AcceptanceRule rule) {
  KVP_CHECK(rows.num_rows == static_cast<int64_t>(drafts.size()) + 1);
  KVP_CHECK(draft_probs.empty() || draft_probs.size() == drafts.size());
  KVP_CHECK(!params.greedy());
  AcceptResult r;
  for (std::size_t j = 0; j < drafts.size(); ++j) {
    const int32_t d = drafts[j];
    std::vector<double> p = sampling_distribution(rows.row(static_cast<int64_t>(j)), params);
    const double pd = p[static_cast<std::size_t>(d)];
    const double qd = draft_probs.empty() ? 1.0 : draft_probs[j][static_cast<std::size_t>(d)];
    const double u = rng.uniform();
    if (rule == AcceptanceRule::kNoRatioTest || (qd > 0 && u * qd < pd)) {
      ++r.num_accepted;
      continue;
    }
    // Rejected: the residual max(0, p - q).
    double total = 0;
    for (std::size_t v = 0; v < p.size(); ++v) {
      const double q = draft_probs.empty() ? (static_cast<int32_t>(v) == d ? 1.0 : 0.0) : draft_probs[j][v];
      p[v] = std::max(0.0, p[v] - q);
      total += p[v];
    }
    // p == q exactly leaves no residual; then any rejection had probability 0, and the
    // target's own distribution is the right fallback.
    if (!(total > 0)) p = sampling_distribution(rows.row(static_cast<int64_t>(j)), params);
    r.next_token = draw_from(p, rng);
    return r;
  }
  r.next_token = sample_token(rows.row(static_cast<int64_t>(drafts.size())), params, rng);
  return r;
}

}  // namespace kvp
