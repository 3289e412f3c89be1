// The engine's projections, y = W x over a batch of tokens, with one arithmetic for every
// output element whatever the batch, the tile, the thread or the instruction set.
//
// The arithmetic (dot_fma_scalar below is its definition; every other version gives its
// bits): sum_i a[i] * b[i] as
//   - 16 interleaved partial sums, lane l taking i = l mod 16 of the first 16 * floor(n / 16)
//     elements, each a chain of fused multiply-adds (acc_l = fma(a_i, b_i, acc_l), i rising);
//   - the lanes combined by dot()'s halving tree (lane l += lane l + w for w = 8, 4, 2, 1);
//   - the tail (the last n mod 16 elements) as its own fma chain, in order;
//   - the result: tree + tail.
// It depends only on n (in_dim). A fused multiply-add is exactly rounded (IEEE 754), so the
// scalar loop, the AVX2 and AVX-512 loops and a GPU's fmaf all give the same bits; the vector
// loops only hold the 16 lanes in registers (two 8-wide or one 16-wide) and keep each lane's
// chain in the same order. Batch invariance (N1) of the projections follows: a token's row
// never depends on which other tokens or rows are computed beside it.
//
// gemm_rows() is the host implementation, chosen at run time for the CPU it runs on (one
// binary runs on any x86-64); dot_fma() is one output element on the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "common/host_device.h"
#include "kernels/kv_element.h"

namespace kvp::kernels {

KVP_HOST_DEVICE inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The definition of the projections' arithmetic (see the top of this file). `a` (the weight
// row) may be bf16 (BF16Bits: the engine's --weight-dtype bf16), each element widened to fp32
// exactly as it is read: the same bits as the fp32 row of the same values.
template <typename W>
KVP_HOST_DEVICE inline float dot_fma_scalar(const W* a, const float* b, int64_t n) {
  constexpr int64_t kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) acc[l] = fma_rn(kv_to_float(a[i + l]), b[i + l], acc[l]);
  }
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t l = 0; l < width; ++l) acc[l] += acc[l + width];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail = fma_rn(kv_to_float(a[i]), b[i], tail);
  return acc[0] + tail;
}

// The host's instruction sets for the projections, narrowest first.
enum class GemmIsa : uint8_t { kScalar, kAvx2, kAvx512 };

std::string_view gemm_isa_name(GemmIsa isa);
// Whether this build and this CPU (and its OS) can run `isa`. kScalar: always.
bool gemm_isa_supported(GemmIsa isa);
// The instruction set the host entry points use: the widest supported, or the one named by
// the environment variable KVP_GEMM_ISA (scalar, avx2, avx512) when it is supported (else the
// widest; tests use it to run every version through the whole engine). Chosen once.
GemmIsa gemm_isa();

// y[t * out_dim + r] = dot_fma(w + r * in_dim, x + t * in_dim, in_dim) (+ bias[r] when bias
// is not null) for t in [0, n) and r in [row_begin, row_end), with `isa`. W is [out_dim,
// in_dim] row-major, x is [n, in_dim], y is [n, out_dim]; rows outside the range are not
// touched (threads split the rows). Tokens are taken in tiles that stay in cache while each
// block of weight rows is read once per tile.
// REQUIRES: gemm_isa_supported(isa), 0 <= row_begin <= row_end <= out_dim, y aliases neither.
void gemm_rows(GemmIsa isa, const float* w, const float* bias, int64_t out_dim, int64_t in_dim, const float* x,
               int64_t n, float* y, int64_t row_begin, int64_t row_end);

// dot_fma_scalar's bits, with gemm_isa().
float dot_fma(const float* a, const float* b, int64_t n);

// A per-thread buffer of at least n floats (reused: valid until this thread's next call).
float* widened_row_buffer(int64_t n);

// Row r of a projection for n tokens, host or device: y[t * out_dim + r] =
// dot(w row r, x row t) (+ bias[r]) for t in [0, n). What a thread of the CUDA backend's
// projection kernel computes: the device runs the scalar definition token by token; the
// emulated kernel on the host runs gemm_rows on the one row (the same bits, the weight row
// read once for all n tokens). W: float, or BF16Bits (--weight-dtype bf16), whose row is
// widened to fp32 exactly (on the host into a per-thread buffer for gemm_rows): the bits of
// fp32 weights of the same values.
template <typename W>
KVP_HOST_DEVICE inline void projection_row(const W* w, const float* bias, int64_t out_dim, int64_t in_dim,
                                           const float* x, int64_t n, float* y, int64_t r) {
#if defined(__CUDA_ARCH__)
  for (int64_t t = 0; t < n; ++t) {
    float acc = dot_fma_scalar(w + r * in_dim, x + t * in_dim, in_dim);
    if (bias != nullptr) acc += bias[r];
    y[t * out_dim + r] = acc;
  }
#else
  if constexpr (std::is_same_v<W, float>) {
    gemm_rows(gemm_isa(), w, bias, out_dim, in_dim, x, n, y, r, r + 1);
  } else {
    // The widened row as a one-row matrix through gemm_rows (all n tokens at once), its n
    // outputs then moved to column r of y with the bias: gemm_rows' one fp32 add after the dot.
    float* row = widened_row_buffer(in_dim + n);
    float* out = row + in_dim;
    for (int64_t i = 0; i < in_dim; ++i) row[i] = kv_to_float(w[r * in_dim + i]);
    gemm_rows(gemm_isa(), row, nullptr, 1, in_dim, x, n, out, 0, 1);
    for (int64_t t = 0; t < n; ++t) y[t * out_dim + r] = bias != nullptr ? out[t] + bias[r] : out[t];
  }
#endif
}

}  // namespace kvp::kernels
