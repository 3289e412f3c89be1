#include "common/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace kvp {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return Status::error("temperature must be finite and >= 0, got " + std::to_string(temperature));
  if (top_k < 0) return Status::error("top_k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) return Status::error("top_p must be in (0, 1], got " + std::to_string(top_p));
  return Status::ok();
}

int32_t argmax(std::span<const float> logits) {
  KVP_CHECK(!logits.empty());
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

namespace {

// A key whose ascending order is the logits' descending order: +0 and -0 the same key (they
// compare equal), NaN after every number (a NaN logit is never preferred).
uint32_t descending_key(float x) {
  if (std::isnan(x)) return 0xffffffffu;
  if (x == 0.0f) x = 0.0f;
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  const uint32_t ascending = (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  return ~ascending;
}

// Sorts keys built as (key << 32) | id with the ids ascending, as std::sort would: a stable
// least-significant-digit radix sort on the high 32 bits (three passes of 11 bits), so equal
// keys keep their ids in order. Passes in which every key has the same digit are skipped.
void sort_by_high_half(std::vector<uint64_t>& keys) {
  if (keys.size() < 1024) {
    std::sort(keys.begin(), keys.end());
    return;
  }
  constexpr int kBits = 11;
  constexpr std::size_t kBuckets = std::size_t{1} << kBits;
  std::vector<uint64_t> other(keys.size());
  for (int shift = 32; shift < 64; shift += kBits) {
    std::vector<std::size_t> start(kBuckets + 1, 0);
    for (uint64_t k : keys) ++start[((k >> shift) & (kBuckets - 1)) + 1];
    if (std::find(start.begin() + 1, start.end(), keys.size()) != start.end()) continue;  // one digit: in order
    for (std::size_t b = 0; b < kBuckets; ++b) start[b + 1] += start[b];
    for (uint64_t k : keys) other[start[(k >> shift) & (kBuckets - 1)]++] = k;
    keys.swap(other);
  }
}

}  // namespace

TruncatedDistribution truncated_distribution(std::span<const float> logits, const SamplingParams& params) {
  KVP_CHECK(logits.size() <= 0xffffffffu);
  TruncatedDistribution d;
  // The order as one integer per token, sorted: descending logit in the high half, the id in
  // the low half (ties by id). A vocabulary of 150k tokens sorts this way (a radix sort)
  // many times faster than by comparing logits through the ids; top-k needs only its first k.
  std::vector<uint64_t> keys(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) keys[i] = (uint64_t{descending_key(logits[i])} << 32) | i;
  std::size_t sorted = keys.size();
  if (params.top_k > 0 && static_cast<std::size_t>(params.top_k) < keys.size()) {
    sorted = static_cast<std::size_t>(params.top_k);
    std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(sorted), keys.end());
  } else {
    sort_by_high_half(keys);
  }
  d.order.resize(sorted);
  for (std::size_t i = 0; i < sorted; ++i) d.order[i] = static_cast<int32_t>(keys[i] & 0xffffffffu);
  d.keep = sorted;

  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  const double max_logit = static_cast<double>(logits[d.order[0]]) * inv_t;
  d.p.resize(d.keep);
  for (std::size_t i = 0; i < d.keep; ++i) {
    d.p[i] = std::exp(static_cast<double>(logits[d.order[i]]) * inv_t - max_logit);
    d.total += d.p[i];
  }
  if (params.top_p < 1.0f) {
    double mass = 0.0;
    std::size_t cut = d.keep;
    for (std::size_t i = 0; i < d.keep; ++i) {
      mass += d.p[i] / d.total;
      if (mass >= static_cast<double>(params.top_p)) {
        cut = i + 1;
        break;
      }
    }
    d.keep = cut;
    d.total = std::accumulate(d.p.begin(), d.p.begin() + static_cast<std::ptrdiff_t>(d.keep), 0.0);
  }
  return d;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& params, Rng& rng) {
  KVP_CHECK(!logits.empty());
  KVP_CHECK(params.validate().is_ok());
  if (params.greedy()) return argmax(logits);
  const TruncatedDistribution d = truncated_distribution(logits, params);
  const double u = rng.uniform() * d.total;
  double acc = 0.0;
  for (std::size_t i = 0; i < d.keep; ++i) {
    acc += d.p[i];
    if (u < acc) return d.order[i];
  }
  return d.order[d.keep - 1];
}

}  // namespace kvp
