// Acceptance of draft tokens after the target's verification forward.
//
// The target ran 1 + k tokens: the last accepted token and the k drafts d_1..d_k. Its logits
// row j (j = 0..k) is the distribution of the token after d_j (after the last accepted
// token for j = 0), conditioned only on accepted tokens and d_1..d_j.
//
//   greedy     accept d_{j+1} while it is the arg-max of row j; the next token is the
//              arg-max of the first row that disagrees (or of row k: the bonus token).
//              Exactly the tokens plain greedy decoding would give.
//   sampling   the rejection rule (Leviathan et al. 2023; Chen et al. 2023): with p_j the
//              target's sampling distribution of row j (temperature, top-k, top-p as in
//              common/sampling.h) and q_j the proposal's, accept d_{j+1} when
//              u < p_j(d) / q_j(d) (u uniform from the request's stream); at the first
//              rejection draw the next token from normalise(max(0, p_j - q_j)); when all k
//              are accepted draw the bonus token from row k with sample_token. Each output
//              token is then distributed exactly as the target's plain sampling.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/rng.h"
#include "common/sampling.h"

namespace kvp {

// The target's logits rows for one verification: rows[j] has vocab entries.
struct VerifyRows {
  const float* data = nullptr;
  int64_t vocab = 0;
  int64_t num_rows = 0;  // k + 1
  std::span<const float> row(int64_t j) const { return {data + j * vocab, static_cast<std::size_t>(vocab)}; }
};

struct AcceptResult {
  int32_t num_accepted = 0;  // drafts kept, 0..k
  int32_t next_token = 0;    // the target's token after them (correction or bonus)
};

// Test hook: kNoRatioTest is a planted bug (every draft accepted without the ratio test),
// kept so the statistical test proves its power in every run.
enum class AcceptanceRule { kRejectionSampling, kNoRatioTest };

// REQUIRES: rows.num_rows == drafts.size() + 1.
AcceptResult accept_greedy(std::span<const int32_t> drafts, const VerifyRows& rows);

// REQUIRES: rows.num_rows == drafts.size() + 1; !params.greedy(); draft_probs empty (point
// masses) or one vocab-sized distribution per draft.
AcceptResult accept_sampled(std::span<const int32_t> drafts, std::span<const std::vector<double>> draft_probs,
                            const VerifyRows& rows, const SamplingParams& params, Rng& rng,
                            AcceptanceRule rule = AcceptanceRule::kRejectionSampling);

// The distribution sample_token draws from (vocab entries summing to 1): a point mass on
// the arg-max for greedy params.
std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& params);
// Draws from a distribution with one uniform number. REQUIRES: probs sums to > 0.
int32_t draw_from(std::span<const double> probs, Rng& rng);

}  // namespace kvp
