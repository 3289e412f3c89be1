// dot()'s and the projections' halving tree (lane l += lane l + w for w = 4, 2, 1 over 8
// lanes; kernels/cpu_attention.h, kernels/gemm.h) for 8 elements at once, each element's 8
// lanes in one AVX vector. Each step adds the same pairs of lanes in the same order as the
// one-element tree; the shuffles only gather the pairs of two (then four, eight) elements
// into one vector, so that one add does a step for all of them: 7 adds and 14 shuffles for 8
// elements, where one element's tree by extracts takes about 6 operations. Same bits as the
// one-element tree (tests/cpu_kernels_test.cc, tests/gemm_test.cc).
//
// x86 hosts only, compiled for AVX by a target attribute: callable from code built for AVX
// (or for more, through its own target attribute) in a binary that runs on any x86-64.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define KVP_HAS_LANE_TREES 1
#include <immintrin.h>

namespace kvp::kernels {

// out[k] = the tree of u[k]'s 8 lanes, k < 8.
__attribute__((target("avx"))) inline void tree8_many(const __m256* u, float* out) {
  __m256 w[4];  // width 4: the low 128 bits hold element 2i's four lanes, the high ones 2i + 1's
  for (int i = 0; i < 4; ++i)
    w[i] = _mm256_add_ps(_mm256_permute2f128_ps(u[2 * i], u[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(u[2 * i], u[2 * i + 1], 0x31));
  __m256 x[2];  // width 2: elements 4i and 4i + 2 in the low half, 4i + 1 and 4i + 3 in the high
  for (int i = 0; i < 2; ++i)
    x[i] =
        _mm256_add_ps(_mm256_shuffle_ps(w[2 * i], w[2 * i + 1], 0x44), _mm256_shuffle_ps(w[2 * i], w[2 * i + 1], 0xEE));
  // width 1: elements 0, 2, 4, 6, 1, 3, 5, 7
  const __m256 total = _mm256_add_ps(_mm256_shuffle_ps(x[0], x[1], 0x88), _mm256_shuffle_ps(x[0], x[1], 0xDD));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  constexpr int kElementOfLane[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int l = 0; l < 8; ++l) out[kElementOfLane[l]] = lanes[l];
}

}  // namespace kvp::kernels

#endif
