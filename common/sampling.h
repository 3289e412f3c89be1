// Token sampling shared by the reference and the engine, so that both draw the same token
// from the same logits and the same per-request random stream.
//
// Greedy takes the arg-max (lowest token id on ties). Otherwise: logits / temperature,
// keep the top_k highest (0 = all), softmax in double, keep the smallest prefix (by
// descending probability, ties by token id) whose mass reaches top_p, renormalise and draw
// one uniform number from the request's stream. One draw per sampled token, so the stream
// position equals the number of tokens sampled: a recomputed or resumed request draws
// exactly what it would have drawn.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/rng.h"
#include "common/status.h"

namespace kvp {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = no top-k cut
  float top_p = 1.0f;        // 1 = no nucleus cut
  uint64_t seed = 0;

  bool greedy() const { return temperature == 0.0f; }
  // temperature >= 0 and finite, top_k >= 0, 0 < top_p <= 1.
  Status validate() const;
};

// Arg-max; lowest index on ties. REQUIRES: !logits.empty().
int32_t argmax(std::span<const float> logits);

// The sampling distribution before the draw: tokens by descending logit (ties by id; a NaN
// logit after every number), the first `keep` of them kept by top-k and top-p (`order` holds
// at least those: every token, or the first top_k), with unnormalised weights p (softmax of
// logits / temperature) summing to `total`. sample_token draws from it; speculative
// acceptance (optimized/engine/acceptance.h) uses it as a distribution.
// REQUIRES: !params.greedy(), !logits.empty().
struct TruncatedDistribution {
  std::vector<int32_t> order;
  std::vector<double> p;  // weights of order[0 .. keep)
  std::size_t keep = 0;
  double total = 0.0;
};
TruncatedDistribution truncated_distribution(std::span<const float> logits, const SamplingParams& params);

// Draws a token. `rng` is the request's stream (Rng(params.seed) at the start).
// REQUIRES: params.validate().is_ok(), !logits.empty().
int32_t sample_token(std::span<const float> logits, const SamplingParams& params, Rng& rng);

}  // namespace kvp
