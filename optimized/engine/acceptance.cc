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
  // The same steps as sample_token (common/sampling.cc), kept as a distribution.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::size_t keep = order.size();
  if (params.top_k > 0) keep = std::min(keep, static_cast<std::size_t>(params.top_k));
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  const double max_logit = static_cast<double>(logits[order[0]]) * inv_t;
  std::vector<double> p(keep);
  double total = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    p[i] = std::exp(static_cast<double>(logits[order[i]]) * inv_t - max_logit);
    total += p[i];
  }
  if (params.top_p < 1.0f) {
    double mass = 0.0;
    std::size_t cut = keep;
    for (std::size_t i = 0; i < keep; ++i) {
      mass += p[i] / total;
      if (mass >= static_cast<double>(params.top_p)) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  }
  for (std::size_t i = 0; i < keep; ++i) probs[static_cast<std::size_t>(order[i])] = p[i] / total;
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
