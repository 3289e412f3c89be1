// Portable, seeded random numbers. The standard library's distributions are
// implementation-defined, so anything whose output must be the same everywhere (preset
// weights, sampling, generated workloads) draws from these instead.
#pragma once

#include <cstdint>

namespace kvp {

// SplitMix64 (Steele, Lea, Flood 2014): a tiny generator with a 64-bit state that passes
// BigCrush; enough for weights, sampling and workloads. Every stream takes a seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // The stream of `seed` from its draw `k` on: the next next_u64() is the k-th draw of
  // Rng(seed) (the state is a counter, seed + k * gamma), so threads can fill parts of one
  // stream with the same bits.
  static Rng from_draw(uint64_t seed, uint64_t k) { return Rng(seed + k * kGamma); }

  uint64_t next_u64() {
    uint64_t z = (state_ += kGamma);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n). REQUIRES: n > 0. (Multiply-shift; bias below 2^-32 for n < 2^32.)
  uint64_t below(uint64_t n) {
    __extension__ typedef unsigned __int128 u128;
    return static_cast<uint64_t>((static_cast<u128>(next_u64()) * n) >> 64);
  }

 private:
  static constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;
  uint64_t state_;
};

// Derives an independent seed for a named sub-stream (a layer, a tensor, a request).
inline uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  Rng r(seed ^ (stream * 0xd1b54a32d192ed03ull));
  r.next_u64();
  return r.next_u64();
}

}  // namespace kvp
