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

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/host_device.h"
#include "kernels/kv_element.h"
#include "kernels/kv_index.h"
#include "kernels/lane_trees.h"

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

#if defined(KVP_CPU_VEC4) && defined(__AVX__) && defined(KVP_HAS_LANE_TREES)
#define KVP_CPU_SCORES8 1
// dot(q, rows[j], n) * scale for the 8 rows j < 8, into out[j]; n a multiple of 16. Each
// row's two 8-lane partial sums (lanes 0 .. 7 and 8 .. 15) are dot()'s own chains; the
// halving tree (reduce_lanes) then runs for the 8 rows at once (tree8_many), then each
// total + the empty tail (0) and * scale, as dot() and its caller do.
inline void scores8(const float* q, const float* const* rows, int64_t n, float scale, float* out) {
  __m256 u[8];
  for (int j = 0; j < 8; ++j) {
    __m256 lo = _mm256_setzero_ps();
    __m256 hi = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(rows[j] + i)));
      hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(rows[j] + i + 8)));
    }
    u[j] = _mm256_add_ps(lo, hi);  // width 8
  }
  float total[8];
  tree8_many(u, total);
  for (int j = 0; j < 8; ++j) out[j] = (total[j] + 0.0f) * scale;
}
#endif

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

// cos and sin of one rotary angle: angle = position * inv_freq (one pair's).
KVP_HOST_DEVICE inline void rope_angle_cos_sin(int64_t position, float inv_freq, float& cos_out, float& sin_out) {
  const float angle = static_cast<float>(position) * inv_freq;
  cos_out = std::cos(angle);
  sin_out = std::sin(angle);
}

// cos and sin of the rotary angles of `position`, one per pair: angle_i = position * inv_freq[i].
KVP_HOST_DEVICE inline void rope_cos_sin(int64_t position, const float* inv_freq, int64_t half, float* cos_out,
                                         float* sin_out) {
  for (int64_t i = 0; i < half; ++i) rope_angle_cos_sin(position, inv_freq[i], cos_out[i], sin_out[i]);
}

// One rotary pair in place: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
KVP_HOST_DEVICE inline void rope_pair(float& x1, float& x2, float cos, float sin) {
  const float a = x1;
  const float b = x2;
  x1 = a * cos - b * sin;
  x2 = b * cos + a * sin;
}

// Rotary embedding of one head in place, Hugging Face "rotate half" convention: dimension i
// of the first half pairs with dimension i + half. `cos`/`sin` come from rope_cos_sin.
KVP_HOST_DEVICE inline void apply_rope(float* head, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) rope_pair(head[i], head[i + half], cos[i], sin[i]);
}

// silu(z) = z * sigmoid(z).
KVP_HOST_DEVICE inline float silu(float z) { return z / (1.0f + std::exp(-z)); }

// PyTorch's tanh-approximated GELU (gelu(approximate="tanh"), transformers'
// gelu_pytorch_tanh, Gemma's activation): 0.5 z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3))).
KVP_HOST_DEVICE inline float gelu_tanh(float z) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  const float inner = kSqrt2OverPi * (z + 0.044715f * z * z * z);
  return 0.5f * z * (1.0f + std::tanh(inner));
}

// Gemma 2's soft-capping of an attention score or a logit: cap * tanh(s / cap); cap 0: s.
KVP_HOST_DEVICE inline float soft_cap(float s, float cap) { return cap > 0.0f ? cap * std::tanh(s / cap) : s; }

// Causal attention of one token at `position` over its sequence's context, for the query
// heads that read KV heads kv_begin .. kv_begin + kv_count - 1 (`group` query heads per KV
// head, GQA), read through the block table from one layer's K and V pools: for each head h,
//   out_h = sum_j softmax_j(soft_cap(q_h . k_j * scale, softcap)) v_j,  j = first..position,
// first = window_first(position, window): 0, or the sliding window's first position (window
// > 0). The positions are cut into partitions [0, P), [P, 2P), ... of `partition` positions,
// fixed in positions whatever the window; the partitions wholly before `first` are skipped
// (their blocks are never read: a window's freed blocks may be anything), the one holding
// `first` starts there. Each partition keeps, per head, its own online-softmax state (max,
// sum, accumulator), and the partitions are merged in order. A NaN anywhere in the K/V read (a poisoned block) reaches
// `out`.
//
// Within a partition the positions are taken a tile of kCpuAttentionTile at a time: the
// tile's slots are located once for all the heads, each KV head's rows (converted, for
// fp16/bf16 pools) once for its group; then each query head runs three passes, as the CUDA
// kernel does (kernels/cuda/model_kernels.cu): the tile's scores; the online-softmax
// recurrence over them in position order (max, rescale, p, sum); then each position's
// rescale and p * v applied to the accumulator in position order. Every value is computed by
// the same operations in the same order as a one-pass loop over the positions of one head
// would: a head's result does not depend on kv_count or `group` (paged_attention_head is
// this function for one head), and the passes only take the exp and the dot products off the
// recurrence's critical path. What the grouping buys is memory traffic: a slot's record
// holds every KV head's row side by side, so a tile's records are read once, in order, for
// all the heads, and stay in L1 while they work.
//
// q: [kv_count * group, head_dim], the heads in order (query heads kv_begin * group .. of a
// token's [num_heads, head_dim] row). k_pool, v_pool: the layer's pools, of element type
// KvT (float, F16Bits, BF16Bits, F8E4M3Bits or F8E5M2Bits: each K/V element is converted to
// fp32 as it is read). k_scale, v_scale: fp8 pools' dequantisation scales, float[num_kv_heads]
// each (indexed by the absolute KV head), or null (1); an element reads as its value times its
// KV head's scale, as in the CUDA kernel. block_table: the sequence's block ids, at least blocks_for_tokens(position +
// 1, block_size) of them (entries before block_index_of(first) are not read). scratch:
// attention_scratch_size<KvT>(head_dim, kv_count * group) floats. out: [kv_count * group, head_dim]; must not alias q
// or scratch. REQUIRES: position >= 0, partition > 0, group > 0, 0 <= kv_begin < kv_begin + kv_count <= num_kv_heads,
// every slot read lies inside the pools.
inline constexpr int64_t kCpuAttentionTile = 32;
template <typename KvT>
inline constexpr int64_t kAttentionTileRows = 2 * kCpuAttentionTile;  // a tile of K and of V rows in fp32
template <>
inline constexpr int64_t kAttentionTileRows<float> = 0;  // rows are read in place
// Floats of scratch paged_attention_kv_heads needs for `heads` query heads: their
// accumulators, one KV head's converted K/V rows of a tile, each head's tile of scores (later
// p values) and rescale factors, and each head's four recurrence values.
template <typename KvT>
KVP_HOST_DEVICE constexpr int64_t attention_scratch_size(int64_t head_dim, int64_t heads = 1) {
  return (heads + kAttentionTileRows<KvT>)*head_dim + 2 * heads * kCpuAttentionTile + 4 * heads;
}

// A K or V row of the pool as fp32: the pool itself for fp32, else converted into `buffer`,
// each element times `scale` (an fp8 pool's dequantisation scale of the row's KV head; 1 for
// the other types, and x * 1 == x: the CUDA kernel's tile load, kv_to_float(x) * scale).
// Scales are for fp8 pools only (KvPoolShape::validate_scales), so an fp32 row ignores it.
KVP_HOST_DEVICE inline const float* kv_row_as_float(const float* row, float* /*buffer*/, int64_t /*n*/,
                                                    float /*scale*/) {
  return row;
}
#if !defined(__CUDA_ARCH__)
// Every code of an fp8 or f16 format decoded once (kv_to_float's values, NaN codes included):
// the host's row conversion reads this table instead of decoding bit by bit, the same values
// (256 floats for fp8, 64Ki for f16; bf16's decode is a shift already).
template <typename KvT, int kCodes>
inline const float* kv_decode_table() {
  static const auto table = [] {
    std::array<float, kCodes> t{};
    for (int code = 0; code < kCodes; ++code)
      t[static_cast<std::size_t>(code)] = kv_to_float(KvT{static_cast<decltype(KvT::bits)>(code)});
    return t;
  }();
  return table.data();
}
#endif
template <typename KvT>
KVP_HOST_DEVICE inline const float* kv_row_as_float(const KvT* row, float* buffer, int64_t n, float scale) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<KvT, F8E4M3Bits> || std::is_same_v<KvT, F8E5M2Bits> || std::is_same_v<KvT, F16Bits>) {
    const float* table = kv_decode_table<KvT, (1 << (8 * sizeof(KvT::bits)))>();
    for (int64_t i = 0; i < n; ++i) buffer[i] = table[row[i].bits] * scale;
    return buffer;
  }
#endif
  for (int64_t i = 0; i < n; ++i) buffer[i] = kv_to_float(row[i]) * scale;
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
KVP_HOST_DEVICE inline void paged_attention_kv_heads(const float* q, const KvT* k_pool, const KvT* v_pool,
                                                     const BlockId* block_table, int64_t block_size,
                                                     int64_t num_kv_heads, int64_t kv_begin, int64_t kv_count,
                                                     int64_t group, int64_t head_dim, int64_t position, float scale,
                                                     int64_t partition, float* scratch, float* out,
                                                     const float* k_scale = nullptr, const float* v_scale = nullptr,
                                                     int64_t window = 0, float softcap = 0.0f) {
  const int64_t heads = kv_count * group;
  const int64_t first = window_first(position, window);
  float* acc = scratch;  // [heads][head_dim]
  // One KV head's converted rows of a tile, [tile][head_dim] each (fp16/bf16 pools; none for fp32).
  constexpr bool kConverted = kAttentionTileRows < KvT >> 0;
  float* k_buffer = kConverted ? acc + heads * head_dim : nullptr;
  float* v_buffer = kConverted ? k_buffer + kCpuAttentionTile * head_dim : nullptr;
  float* p_tile = acc + (heads + kAttentionTileRows<KvT>)*head_dim;  // [heads][tile]: score, then p
  float* rescale = p_tile + heads * kCpuAttentionTile;               // [heads][tile]
  float* part_max = rescale + heads * kCpuAttentionTile;             // [heads] each
  float* part_sum = part_max + heads;
  float* running_max = part_sum + heads;
  float* running_sum = running_max + heads;
  int64_t record[kCpuAttentionTile];  // offset of each position's row of KV head kv_begin
  const float* k_rows[kCpuAttentionTile];
  const float* v_rows[kCpuAttentionTile];
  for (int64_t part_begin = first / partition * partition; part_begin <= position; part_begin += partition) {
    const int64_t begin = part_begin > first ? part_begin : first;
    const int64_t end = (position + 1 - part_begin < partition) ? position + 1 : part_begin + partition;
    // This partition's state; the first position's score initialises each head's max so
    // that a NaN score cannot be skipped by a comparison.
    for (int64_t h = 0; h < heads; ++h) {
      part_max[h] = 0.0f;
      part_sum[h] = 0.0f;
    }
    for (int64_t e = 0; e < heads * head_dim; ++e) acc[e] = 0.0f;
    for (int64_t tile = begin; tile < end; tile += kCpuAttentionTile) {
      const int64_t count = end - tile < kCpuAttentionTile ? end - tile : kCpuAttentionTile;
      // The tile's slots: slot_of(block_table, tile + j, block_size), walked block by block.
      int64_t block = block_index_of(tile, block_size);
      int64_t offset = offset_in_block(tile, block_size);
      for (int64_t j = 0; j < count; ++j) {
        const int64_t slot = slot_of_block(static_cast<int64_t>(block_table[block]), offset, block_size);
        record[j] = kv_pool_offset(slot, kv_begin, num_kv_heads, head_dim);
        if (++offset == block_size) {
          offset = 0;
          ++block;
        }
      }
      for (int64_t g = 0; g < kv_count; ++g) {
        const float ks = k_scale == nullptr ? 1.0f : k_scale[kv_begin + g];
        const float vs = v_scale == nullptr ? 1.0f : v_scale[kv_begin + g];
        for (int64_t j = 0; j < count; ++j) {
          const int64_t at = record[j] + g * head_dim;  // kv_pool_offset(slot, kv_begin + g, ...)
          k_rows[j] = kv_row_as_float(k_pool + at, kConverted ? k_buffer + j * head_dim : nullptr, head_dim, ks);
          v_rows[j] = kv_row_as_float(v_pool + at, kConverted ? v_buffer + j * head_dim : nullptr, head_dim, vs);
        }
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          float* p = p_tile + h * kCpuAttentionTile;
          float* r = rescale + h * kCpuAttentionTile;
          const float* q_h = q + h * head_dim;
          int64_t j = 0;
#if defined(KVP_CPU_SCORES8)
          if (head_dim % 16 == 0) {
            for (; j + 8 <= count; j += 8) scores8(q_h, k_rows + j, head_dim, scale, p + j);
          }
#endif
          for (; j < count; ++j) p[j] = dot(q_h, k_rows[j], head_dim) * scale;
          if (softcap > 0.0f) {
            for (j = 0; j < count; ++j) p[j] = soft_cap(p[j], softcap);
          }
          for (j = 0; j < count; ++j)
            p[j] = online_softmax_step(p[j], tile + j == begin, part_max[h], part_sum[h], r[j]);
          accumulate_tile(acc + h * head_dim, v_rows, p, r, count, head_dim);
        }
      }
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* o = out + h * head_dim;
      const float* a_h = acc + h * head_dim;
      if (begin == first) {  // the first partition read
        running_max[h] = part_max[h];
        running_sum[h] = part_sum[h];
        for (int64_t d = 0; d < head_dim; ++d) o[d] = a_h[d];
      } else {
        const float new_max = part_max[h] > running_max[h] ? part_max[h] : running_max[h];
        const float a = std::exp(running_max[h] - new_max);
        const float b = std::exp(part_max[h] - new_max);
        running_sum[h] = running_sum[h] * a + part_sum[h] * b;
        scale_add(o, a, a_h, b, head_dim);
        running_max[h] = new_max;
      }
    }
  }
  for (int64_t h = 0; h < heads; ++h) scale_in_place(out + h * head_dim, 1.0f / running_sum[h], head_dim);
}

// paged_attention_kv_heads for one query head, which reads KV head `kv_head`: q and out are
// [head_dim]; scratch is attention_scratch_size<KvT>(head_dim) floats.
template <typename BlockId, typename KvT>
KVP_HOST_DEVICE inline void paged_attention_head(const float* q, const KvT* k_pool, const KvT* v_pool,
                                                 const BlockId* block_table, int64_t block_size, int64_t num_kv_heads,
                                                 int64_t kv_head, int64_t head_dim, int64_t position, float scale,
                                                 int64_t partition, float* scratch, float* out,
                                                 const float* k_scale = nullptr, const float* v_scale = nullptr,
                                                 int64_t window = 0, float softcap = 0.0f) {
  paged_attention_kv_heads(q, k_pool, v_pool, block_table, block_size, num_kv_heads, kv_head, 1, 1, head_dim, position,
                           scale, partition, scratch, out, k_scale, v_scale, window, softcap);
}

}  // inline namespace
}  // namespace kvp::kernels

#undef KVP_CPU_VEC4
#undef KVP_CPU_SCORES8
