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

// Draws a token. `rng` is the request's stream (Rng(params.seed) at the start).
// REQUIRES: params.validate().is_ok(), !logits.empty().
int32_t sample_token(std::span<const float> logits, const SamplingParams& params, Rng& rng);

}  // namespace kvp
