// The CPU backend's hot loops: paged attention over a block table, and the small
// per-token kernels around it (dot, RMSNorm, RoPE, SiLU).
//
// Versions: the scalar loops (every build; a device build and -DKVP_NO_VECTOR_EXTENSIONS
// use only these) and, on a GCC/Clang host, 4- and 8-wide vector-extension versions of dot
// and the attention accumulators that give the same bits (tests/cpu_kernels_test.cc). Every function is a plain loop
// over pointers and marked KVP_HOST_DEVICE so that a CUDA backend can call (or mirror) it as
// it stands; no allocation, no std containers, scratch comes from the caller.
//
// Determinism (N1, docs/architecture.md) is a property of these loops, not of their callers:
//   - dot() reduces in a fixed order that depends only on n: a matrix row times a vector
//     gives the same bits however many other rows or vectors are computed beside it.
//   - paged_attention_head() reads positions 0..position in order, through the block
//     table, with partition (split) points fixed in POSITIONS, never in blocks. The result
//     is therefore bitwise independent of the block size, the block ids, how the sequence
//     was chunked and what else is in the batch; it depends only on the K/V values at the
//     positions, the query and the partition size.
//
// Slot arithmetic is kernels/kv_index.h's; this file only turns a slot into a float offset
// in the [num_blocks, block_size, num_kv_heads, head_dim] pool layout.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"
#include "kernels/kv_element.h"
#include "kernels/kv_index.h"

namespace kvp::kernels {
// The vector and the scalar loops live in different inline namespaces, so that a program may
// hold both (tests/cpu_kernels_scalar.cc compiles the scalar ones beside the vector ones, to
// check that they give the same bits) without two definitions of one inline function.
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(KVP_NO_VECTOR_EXTENSIONS)
inline namespace vector_loops {
#else
inline namespace scalar_loops {
#endif

// Positions per attention partition, the default split size. Results are bitwise
// reproducible for a fixed partition size; changing it changes the rounding.
inline constexpr int64_t kDefaultAttentionPartition = 128;

// Offset, in floats, of (slot, kv_head) in a layer's K or V pool of layout
// [num_blocks, block_size, num_kv_heads, head_dim] (a slot is block_id * block_size + offset).
KVP_HOST_DEVICE constexpr int64_t kv_pool_offset(int64_t slot, int64_t kv_head, int64_t num_kv_heads,
                                                 int64_t head_dim) {
  return (slot * num_kv_heads + kv_head) * head_dim;
}

// Host builds with GCC or Clang use their vector extension for the loops below,
// because -O2 does not vectorise them on its own. Every vector loop computes exactly the
// scalar loop's operations on each element, in the same order, so both give the same bits;
// the scalar loops are what a device build (and any other compiler) runs. Defining
// KVP_NO_VECTOR_EXTENSIONS forces the scalar loops on the host too (tests/cpu_kernels_test.cc
// compares the two bit for bit).
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(KVP_NO_VECTOR_EXTENSIONS)
#define KVP_CPU_VEC4 1
namespace detail {
typedef float Vec4 __attribute__((vector_size(16)));
// 8 lanes: one AVX register where the build has AVX, two SSE registers where it does not;
// the operations on each lane are the same either way.
typedef float Vec8 __attribute__((vector_size(32)));
template <typename V>
inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename V>
inline void store(float* p, V v) {
  std::memcpy(p, &v, sizeof(v));
}
inline Vec4 load4(const float* p) { return load<Vec4>(p); }
inline void store4(float* p, Vec4 v) { store(p, v); }
inline Vec4 splat4(float x) { return Vec4{x, x, x, x}; }
inline Vec8 load8(const float* p) { return load<Vec8>(p); }
inline void store8(float* p, Vec8 v) { store(p, v); }
inline Vec8 splat8(float x) { return Vec8{x, x, x, x, x, x, x, x}; }
// dot()'s halving tree over 16 lanes held as two vectors (lanes 0 .. 7 and 8 .. 15): widths
// 8 and 4 as vector adds, then 2 and 1.
inline float reduce_lanes(Vec8 lo, Vec8 hi) {
  const Vec8 u = lo + hi;                                                      // width 8
  const Vec4 w = Vec4{u[0], u[1], u[2], u[3]} + Vec4{u[4], u[5], u[6], u[7]};  // width 4
  const float w0 = w[0] + w[2];
  const float w1 = w[1] + w[3];
  return w0 + w1;
}
// accumulate_tile on 8 * N elements held in registers: acc[e] = acc[e] * rescale[j] (when
// rescale[j] != 1) + p[j] * v_rows[j][offset + e], j in order.
template <int N>
inline void accumulate_chunk(float* acc, const float* const* v_rows, int64_t offset, const float* p,
                             const float* rescale, int64_t count) {
  Vec8 a[N];
  for (int i = 0; i < N; ++i) a[i] = load8(acc + 8 * i);
  for (int64_t j = 0; j < count; ++j) {
    if (rescale[j] != 1.0f) {  // x * 1 == x: skipping it changes no bit
      const Vec8 r = splat8(rescale[j]);
      for (int i = 0; i < N; ++i) a[i] *= r;
    }
    const Vec8 pj = splat8(p[j]);
    const float* v = v_rows[j] + offset;
    for (int i = 0; i < N; ++i) a[i] += pj * load8(v + 8 * i);
  }
  for (int i = 0; i < N; ++i) store8(acc + 8 * i, a[i]);
}
}  // namespace detail
#endif

// sum_i a[i] * b[i], reduced in a fixed order that depends only on n: 16 interleaved
// partial sums (lane l takes i = l mod 16 of the first 16 * floor(n / 16) elements),
// combined by a fixed halving tree (lane l += lane l + w for w = 8, 4, 2, 1), plus the
// tail summed in order.
KVP_HOST_DEVICE inline float dot(const float* a, const float* b, int64_t n) {
  constexpr int64_t kLanes = 16;
  int64_t i = 0;
  float total = 0.0f;
#if defined(KVP_CPU_VEC4)
  using detail::load8;
  using detail::Vec8;
  Vec8 lo = {}, hi = {};  // lanes 0 .. 7 and 8 .. 15
  // The loop bound computed first: GCC 12 reports a false "undefined behaviour" in the tail
  // loop below (-Waggressive-loop-optimizations) when n is a known constant and this loop
  // is written as `i + kLanes <= n`.
  const int64_t full = n - n % kLanes;
  for (; i < full; i += kLanes) {
    lo += load8(a + i) * load8(b + i);
    hi += load8(a + i + 8) * load8(b + i + 8);
  }
  total = detail::reduce_lanes(lo, hi);
#else
  float acc[kLanes] = {};
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t l = 0; l < width; ++l) acc[l] += acc[l + width];
  }
  total = acc[0];
#endif
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return total + tail;
}

// y[i] = y[i] * scale for i < n.
KVP_HOST_DEVICE inline void scale_in_place(float* y, float scale, int64_t n) {
  int64_t i = 0;
#if defined(KVP_CPU_VEC4)
  for (; i + 4 <= n; i += 4) detail::store4(y + i, detail::load4(y + i) * detail::splat4(scale));
#endif
  for (; i < n; ++i) y[i] *= scale;
}

// y[i] = y[i] * a + x[i] * b for i < n. y must not alias x.
KVP_HOST_DEVICE inline void scale_add(float* y, float a, const float* x, float b, int64_t n) {
  int64_t i = 0;
#if defined(KVP_CPU_VEC4)
  for (; i + 4 <= n; i += 4)
    detail::store4(y + i, detail::load4(y + i) * detail::splat4(a) + detail::load4(x + i) * detail::splat4(b));
#endif
  for (; i < n; ++i) y[i] = y[i] * a + x[i] * b;
}

// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight. `out` may alias `x`.
KVP_HOST_DEVICE inline void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  const float mean_square = dot(x, x, n) / static_cast<float>(n);
  const float inv_rms = 1.0f / std::sqrt(mean_square + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv_rms) * weight[i];
}

// cos and sin of the rotary angles of `position`, one per pair: angle_i = position * inv_freq[i].
KVP_HOST_DEVICE inline void rope_cos_sin(int64_t position, const float* inv_freq, int64_t half, float* cos_out,
                                         float* sin_out) {
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    cos_out[i] = std::cos(angle);
    sin_out[i] = std::sin(angle);
  }
}

// Rotary embedding of one head in place, Hugging Face "rotate half" convention: dimension i
// of the first half pairs with dimension i + half. `cos`/`sin` come from rope_cos_sin.
KVP_HOST_DEVICE inline void apply_rope(float* head, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = head[i];
    const float x2 = head[i + half];
    head[i] = x1 * cos[i] - x2 * sin[i];
    head[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

// silu(z) = z * sigmoid(z).
KVP_HOST_DEVICE inline float silu(float z) { return z / (1.0f + std::exp(-z)); }

// Causal attention of one query head of one token at `position` over its sequence's
// context, read through the block table from one layer's K and V pools:
//   out = sum_j softmax_j(q . k_j * scale) v_j,  j = 0..position.
// The positions are cut into partitions [0, P), [P, 2P), ... of `partition` positions; each
// partition keeps its own online-softmax state (max, sum, accumulator), and the partitions
// are merged in order. A NaN anywhere in the K/V read (a poisoned block) reaches `out`.
//
// Within a partition the positions are taken a tile of kCpuAttentionTile at a time, in three
// passes, as the CUDA kernel does (kernels/cuda/model_kernels.cu): the tile's scores; the
// online-softmax recurrence over them in position order (max, rescale, p, sum); then each
// position's rescale and p * v applied to the accumulator in position order. Every value is
// computed by the same operations in the same order as a one-pass loop over the positions
// would; the passes only take the exp and the dot products off the recurrence's critical
// path, so a tile's scores and exps can run side by side.
//
// q: [head_dim]. k_pool, v_pool: the layer's pools, of element type KvT (float, F16Bits or
// BF16Bits: each K/V element is converted to fp32 as it is read). block_table: the sequence's
// block ids, at least blocks_for_tokens(position + 1, block_size) of them. scratch:
// attention_scratch_size<KvT>(head_dim) floats. out: [head_dim]; must not alias q or scratch.
// REQUIRES: position >= 0, partition > 0, every slot read lies inside the pools.
inline constexpr int64_t kCpuAttentionTile = 32;
template <typename KvT>
inline constexpr int64_t kAttentionRows = 2 + kCpuAttentionTile;  // accumulator, a K row, a tile of V rows in fp32
template <>
inline constexpr int64_t kAttentionRows<float> = 1;  // accumulator; rows are read in place
// Floats of scratch paged_attention_head needs: its rows of head_dim, then a tile's scores
// (later its p values) and rescale factors.
template <typename KvT>
KVP_HOST_DEVICE constexpr int64_t attention_scratch_size(int64_t head_dim) {
  return kAttentionRows<KvT> * head_dim + 2 * kCpuAttentionTile;
}

// A K or V row of the pool as fp32: the pool itself for fp32, else converted into `buffer`.
KVP_HOST_DEVICE inline const float* kv_row_as_float(const float* row, float* /*buffer*/, int64_t /*n*/) { return row; }
template <typename KvT>
KVP_HOST_DEVICE inline const float* kv_row_as_float(const KvT* row, float* buffer, int64_t n) {
  for (int64_t i = 0; i < n; ++i) buffer[i] = kv_to_float(row[i]);
  return buffer;
}

// One step of a partition's online-softmax recurrence, positions in order: the partition's
// first score sets its max (so that a NaN score cannot be skipped by a comparison); a larger
// score rescales the sum by r = exp(old max - score) and becomes the max. Returns p =
// exp(score - max) and sets `rescale` to r (1 when the max stayed). The CUDA kernel runs the
// same step (kernels/cuda/model_kernels.cu).
KVP_HOST_DEVICE inline float online_softmax_step(float score, bool first, float& part_max, float& part_sum,
                                                 float& rescale) {
  float r = 1.0f;
  if (first) {
    part_max = score;
  } else if (score > part_max) {
    r = std::exp(part_max - score);
    part_sum *= r;
    part_max = score;
  }
  const float p = std::exp(score - part_max);
  part_sum += p;
  rescale = r;
  return p;
}

// acc[d] = acc[d] * rescale[j] (when rescale[j] != 1) + p[j] * v_rows[j][d], for j = 0 ..
// count - 1 in order: each element sees the positions in order, whatever the loop nest. The
// vector version holds 16 elements in registers across the tile instead of reading and
// writing the accumulator once per position.
KVP_HOST_DEVICE inline void accumulate_tile(float* acc, const float* const* v_rows, const float* p,
                                            const float* rescale, int64_t count, int64_t head_dim) {
  int64_t d = 0;
#if defined(KVP_CPU_VEC4)
  // As many accumulator vectors as fit the head (up to 64 elements), so that the adds of
  // consecutive positions are independent chains rather than one chain per register.
  for (; d + 64 <= head_dim; d += 64) detail::accumulate_chunk<8>(acc + d, v_rows, d, p, rescale, count);
  for (; d + 32 <= head_dim; d += 32) detail::accumulate_chunk<4>(acc + d, v_rows, d, p, rescale, count);
  for (; d + 16 <= head_dim; d += 16) detail::accumulate_chunk<2>(acc + d, v_rows, d, p, rescale, count);
#endif
  for (; d < head_dim; ++d) {
    float a = acc[d];
    for (int64_t j = 0; j < count; ++j) {
      if (rescale[j] != 1.0f) a *= rescale[j];
      a += p[j] * v_rows[j][d];
    }
    acc[d] = a;
  }
}

template <typename BlockId, typename KvT>
KVP_HOST_DEVICE inline void paged_attention_head(const float* q, const KvT* k_pool, const KvT* v_pool,
                                                 const BlockId* block_table, int64_t block_size, int64_t num_kv_heads,
                                                 int64_t kv_head, int64_t head_dim, int64_t position, float scale,
                                                 int64_t partition, float* scratch, float* out) {
  float* acc = scratch;
  float* k_buffer = kAttentionRows<KvT> > 1 ? scratch + head_dim : nullptr;
  float* v_buffer = kAttentionRows<KvT> > 1 ? scratch + 2 * head_dim : nullptr;
  float* p_tile = scratch + kAttentionRows<KvT> * head_dim;  // [kCpuAttentionTile]: score, then p
  float* rescale = p_tile + kCpuAttentionTile;               // [kCpuAttentionTile]
  float running_max = 0.0f;
  float running_sum = 0.0f;
  for (int64_t begin = 0; begin <= position; begin += partition) {
    const int64_t end = (position + 1 - begin < partition) ? position + 1 : begin + partition;
    // This partition's state; the first position's score initialises its max so that a
    // NaN score cannot be skipped by a comparison.
    float part_max = 0.0f;
    float part_sum = 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) acc[d] = 0.0f;
    for (int64_t tile = begin; tile < end; tile += kCpuAttentionTile) {
      const int64_t count = end - tile < kCpuAttentionTile ? end - tile : kCpuAttentionTile;
      for (int64_t j = 0; j < count; ++j) {
        const int64_t slot = slot_of(block_table, tile + j, block_size);
        const float* k =
            kv_row_as_float(k_pool + kv_pool_offset(slot, kv_head, num_kv_heads, head_dim), k_buffer, head_dim);
        p_tile[j] = dot(q, k, head_dim) * scale;
      }
      for (int64_t j = 0; j < count; ++j)
        p_tile[j] = online_softmax_step(p_tile[j], tile + j == begin, part_max, part_sum, rescale[j]);
      const float* v_rows[kCpuAttentionTile];
      for (int64_t j = 0; j < count; ++j) {
        const int64_t slot = slot_of(block_table, tile + j, block_size);
        v_rows[j] = kv_row_as_float(v_pool + kv_pool_offset(slot, kv_head, num_kv_heads, head_dim),
                                    v_buffer + (v_buffer != nullptr ? j * head_dim : 0), head_dim);
      }
      accumulate_tile(acc, v_rows, p_tile, rescale, count, head_dim);
    }
    if (begin == 0) {
      running_max = part_max;
      running_sum = part_sum;
      for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d];
    } else {
      const float new_max = part_max > running_max ? part_max : running_max;
      const float a = std::exp(running_max - new_max);
      const float b = std::exp(part_max - new_max);
      running_sum = running_sum * a + part_sum * b;
      scale_add(out, a, acc, b, head_dim);
      running_max = new_max;
    }
  }
  const float inv_sum = 1.0f / running_sum;
  scale_in_place(out, inv_sum, head_dim);
}

}  // inline namespace
}  // namespace kvp::kernels

#undef KVP_CPU_VEC4
