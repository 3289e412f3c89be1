// Host projections (kernels/gemm.h): the scalar definition, and AVX2+FMA and AVX-512 loops
// compiled with per-function target attributes, chosen at run time.
//
// Register blocking. Each output element keeps its 16 lanes in registers: one zmm (AVX-512)
// or two ymm (AVX2). A micro-kernel computes a block of R weight rows times T tokens; per
// 16 elements of in_dim it loads the T token vectors once and each weight row once, and runs
// R * T fused multiply-adds (one per lane vector). AVX-512 has 32 registers: R = 6, T = 4 (24
// accumulators, 4 token vectors, 1 weight row). AVX2 has 16: R = 2, T = 3 (per half of the
// lanes 6 accumulators live, 2 weight rows, 1 token vector). One token (a GEMV: decode at
// batch 1) has nothing to share, and only streams: its blocks of 8 rows read each row start
// to end before the next (avx512_gemv, avx2_gemv), so the loads go in address order. Edge
// blocks use smaller R and T. None of this changes any element's chain, only which elements
// share loads and in which order they are read. The AVX-512 block ends with
// the halving trees of its 24 elements run 16 at a time (tree16_many): the same additions,
// with shuffles in place of a horizontal reduction per element, 1.25-1.35x faster on the
// small preset's 256-wide projections (gemm_bench BM_GemmShortInDim, medians of 5, old and
// new interleaved) and about 1.1x at in_dim 576.
// gemm_bench measures it against one core's measured FMA peak and read bandwidth (the
// ratios it prints; this machine's figures vary run to run, see the issue notes).
#include "kernels/gemm.h"

#include <vector>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVP_GEMM_X86 1
#include <immintrin.h>

#include "kernels/lane_trees.h"
#endif

namespace kvp::kernels {
namespace {

// Tokens per cache tile: a tile's activations (64 x in_dim floats) stay in L2 while every
// weight block of the thread's rows streams past them once.
constexpr int64_t kTokenTile = 64;

using BlockFn = void (*)(const float* w, int64_t in_dim, const float* x, float* y, int64_t ldy, const float* bias);

void scalar_block(int64_t rows, int64_t tokens, const float* w, int64_t in_dim, const float* x, float* y, int64_t ldy,
                  const float* bias) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      float v = dot_fma_scalar(w + r * in_dim, x + t * in_dim, in_dim);
      if (bias != nullptr) v += bias[r];
      y[t * ldy + r] = v;
    }
  }
}

#if defined(KVP_GEMM_X86)
#define KVP_AVX2 __attribute__((target("avx2,fma")))
#define KVP_AVX512 __attribute__((target("avx512f,avx2,fma")))

// The GEMVs prefetch the weights this many rows ahead of the row they read: one token's
// product only streams, and a core's hardware prefetchers alone left BM_Gemv at 0.65-0.69 of a
// plain read's bandwidth on AVX-512 (Zen 4, 2 vCPUs) against 0.82-0.83 with it (gemm_bench,
// old and new alternated). A prefetch past the matrix's end is harmless (it never faults).
constexpr int64_t kGemvPrefetchRows = 4;

// The tail of an element (dot_fma_scalar's last n mod 16 terms) and the final sum.
KVP_AVX2 inline float finish(float tree, const float* a, const float* b, int64_t from, int64_t n) {
  __m128 tail = _mm_setzero_ps();
  for (int64_t i = from; i < n; ++i) tail = _mm_fmadd_ss(_mm_load_ss(a + i), _mm_load_ss(b + i), tail);
  return tree + _mm_cvtss_f32(tail);
}

template <int R, int T>
KVP_AVX2 void avx2_block(const float* w, int64_t in_dim, const float* x, float* y, int64_t ldy, const float* bias) {
  __m256 lo[R][T];
  __m256 hi[R][T];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 16 <= in_dim; k += 16) {
    __m256 wv[R];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w + r * in_dim + k);
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * in_dim + k);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) lo[r][t] = _mm256_fmadd_ps(wv[r], xv, lo[r][t]);
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w + r * in_dim + k + 8);
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * in_dim + k + 8);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) hi[r][t] = _mm256_fmadd_ps(wv[r], xv, hi[r][t]);
    }
  }
  static_assert(R * T <= 8);
  __m256 u[8];  // width 8 (lane l + lane l + 8 is lo + hi) of element (r, t) at r * T + t
#pragma GCC unroll 8
  for (int e = 0; e < 8; ++e)
    u[e] = e < R * T ? _mm256_add_ps(lo[e / T][e % T], hi[e / T][e % T]) : _mm256_setzero_ps();
  float tree[8];
  tree8_many(u, tree);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      float v = finish(tree[r * T + t], w + r * in_dim, x + t * in_dim, k, in_dim);
      if (bias != nullptr) v += bias[r];
      y[t * ldy + r] = v;
    }
  }
}

// GCC 12's unmasked shuffles read an "undefined" register that -Werror=uninitialized
// rejects: the masked forms with every lane selected and an explicit source are the same
// instructions.
template <int kImm>
KVP_AVX512 inline __m512 shuffle_f32x4(__m512 a, __m512 b) {
  return _mm512_mask_shuffle_f32x4(_mm512_setzero_ps(), 0xFFFF, a, b, kImm);
}
template <int kImm>
KVP_AVX512 inline __m512 shuffle_ps(__m512 a, __m512 b) {
  return _mm512_mask_shuffle_ps(_mm512_setzero_ps(), 0xFFFF, a, b, kImm);
}

// The halving tree of up to 16 elements at once, each element's 16 lanes in one vector:
// out[k] = tree(v[k]) (widths 8, 4, 2, 1: lane l += lane l + w, as dot_fma_scalar) for k <
// N; vectors past N count as zero and their results are dropped. Each step adds the same
// pairs of lanes in the same order as the one-element tree; the shuffles only gather the
// pairs of two (then four, eight, sixteen) elements into one vector, so that one add does a
// step for all of them. After the last step lane 4c + m holds element 4m + c; the final
// permute puts element k in lane k. 45 shuffles and adds for 16 elements, where one
// element's tree takes about 10.
template <int N>
KVP_AVX512 inline void tree16_many(const __m512* v, float* out) {
  static_assert(N >= 1 && N <= 16);
  __m512 in[16];
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) in[k] = k < N ? v[k] : _mm512_setzero_ps();
  __m512 x8[8];  // width 8: quarters [A0 + A2, A1 + A3, B0 + B2, B1 + B3] of elements 2i, 2i + 1
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    x8[i] = _mm512_add_ps(shuffle_f32x4<0x44>(in[2 * i], in[2 * i + 1]), shuffle_f32x4<0xEE>(in[2 * i], in[2 * i + 1]));
  __m512 x4[4];  // width 4: quarter c holds the 4 lanes of element 4g + c
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g)
    x4[g] = _mm512_add_ps(shuffle_f32x4<0x88>(x8[2 * g], x8[2 * g + 1]), shuffle_f32x4<0xDD>(x8[2 * g], x8[2 * g + 1]));
  __m512 x2[2];  // width 2: quarter c holds 2 lanes each of elements 8h + c and 8h + 4 + c
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
    x2[h] = _mm512_add_ps(shuffle_ps<0x44>(x4[2 * h], x4[2 * h + 1]), shuffle_ps<0xEE>(x4[2 * h], x4[2 * h + 1]));
  // width 1: lane 4c + m holds element 4m + c
  const __m512 x1 = _mm512_add_ps(shuffle_ps<0x88>(x2[0], x2[1]), shuffle_ps<0xDD>(x2[0], x2[1]));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_mask_permutexvar_ps(_mm512_setzero_ps(), 0xFFFF, order, x1));
#pragma GCC unroll 16
  for (int k = 0; k < N; ++k) out[k] = lanes[k];
}

template <int R, int T>
KVP_AVX512 void avx512_block(const float* w, int64_t in_dim, const float* x, float* y, int64_t ldy, const float* bias) {
  __m512 acc[R * T];  // element (r, t) at t * R + r
#pragma GCC unroll 24
  for (int e = 0; e < R * T; ++e) acc[e] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= in_dim; k += 16) {
    __m512 xv[T];
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x + t * in_dim + k);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 wv = _mm512_loadu_ps(w + r * in_dim + k);
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) acc[t * R + r] = _mm512_fmadd_ps(wv, xv[t], acc[t * R + r]);
    }
  }
  float tree[R * T];
  tree16_many<(R * T < 16 ? R * T : 16)>(acc, tree);
  if constexpr (R * T > 16) tree16_many<R * T - 16>(acc + 16, tree + 16);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      float v = finish(tree[t * R + r], w + r * in_dim, x + t * in_dim, k, in_dim);
      if (bias != nullptr) v += bias[r];
      y[t * ldy + r] = v;
    }
  }
}

// One token (a GEMV): the same chains as avx2_block<R, 1> and avx512_block<R, 1>, but each
// weight row is read start to end before the next, so the block's loads go in address order
// (rows are contiguous). The row-interleaved order (all R rows at k, then at k + 16) reads R
// streams 4 * in_dim bytes apart, which this machine's prefetchers kept at ~60% of one
// core's read bandwidth; in address order, ~87-100% (gemm_bench BM_Gemv, see the issue
// notes; 4.9-6.0 ms against 8.0-10.0 for the LM head's 113 MB, interleaved runs). The rows'
// chains do not depend on each other, so the core still overlaps the next rows' loads with
// this row's multiply-adds.
template <int R, int T>
KVP_AVX2 void avx2_gemv(const float* w, int64_t in_dim, const float* x, float* y, int64_t ldy, const float* bias) {
  static_assert(T == 1 && R <= 8);
  (void)ldy;
  const int64_t k_end = in_dim / 16 * 16;
  __m256 u[8];  // width 8 (lane l + lane l + 8 is lo + hi) of row r
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    if (r >= R) {
      u[r] = _mm256_setzero_ps();
      continue;
    }
    const float* row = w + r * in_dim;
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    for (int64_t k = 0; k < k_end; k += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(row + k + kGemvPrefetchRows * in_dim), _MM_HINT_T0);
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(row + k), _mm256_loadu_ps(x + k), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(row + k + 8), _mm256_loadu_ps(x + k + 8), hi);
    }
    u[r] = _mm256_add_ps(lo, hi);
  }
  float tree[8];
  tree8_many(u, tree);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float v = finish(tree[r], w + r * in_dim, x, k_end, in_dim);
    if (bias != nullptr) v += bias[r];
    y[r] = v;
  }
}

template <int R, int T>
KVP_AVX512 void avx512_gemv(const float* w, int64_t in_dim, const float* x, float* y, int64_t ldy, const float* bias) {
  static_assert(T == 1 && R <= 16);
  (void)ldy;
  const int64_t k_end = in_dim / 16 * 16;
  __m512 acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const float* row = w + r * in_dim;
    __m512 a = _mm512_setzero_ps();
    for (int64_t k = 0; k < k_end; k += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(row + k + kGemvPrefetchRows * in_dim), _MM_HINT_T0);
      a = _mm512_fmadd_ps(_mm512_loadu_ps(row + k), _mm512_loadu_ps(x + k), a);
    }
    acc[r] = a;
  }
  float tree[R];
  tree16_many<R>(acc, tree);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float v = finish(tree[r], w + r * in_dim, x, k_end, in_dim);
    if (bias != nullptr) v += bias[r];
    y[r] = v;
  }
}

// table[r - 1][t - 1] = Block<r, t>, for r <= R, t <= T.
template <template <int, int> class, int R, int T>
struct BlockTable;

template <int R, int T>
struct Avx2Block {
  static constexpr BlockFn fn = &avx2_block<R, T>;
};
template <int R, int T>
struct Avx512Block {
  static constexpr BlockFn fn = &avx512_block<R, T>;
};

template <int R, int T>
struct Avx2Gemv {
  static constexpr BlockFn fn = &avx2_gemv<R, T>;
};
template <int R, int T>
struct Avx512Gemv {
  static constexpr BlockFn fn = &avx512_gemv<R, T>;
};

template <template <int, int> class Block, int R, int T>
struct BlockTable {
  BlockFn table[R][T];
  constexpr BlockTable() : table{} { fill(std::make_integer_sequence<int, R * T>{}); }
  template <int... I>
  constexpr void fill(std::integer_sequence<int, I...>) {
    ((table[I / T][I % T] = Block<I / T + 1, I % T + 1>::fn), ...);
  }
};

constexpr int kAvx2Rows = 2, kAvx2Tokens = 3;
constexpr int kAvx512Rows = 6, kAvx512Tokens = 4;
constexpr BlockTable<Avx2Block, kAvx2Rows, kAvx2Tokens> kAvx2Table{};
constexpr BlockTable<Avx512Block, kAvx512Rows, kAvx512Tokens> kAvx512Table{};
// One token (decode at batch 1, the LM head of one row).
constexpr int kGemvRows = 8;
constexpr BlockTable<Avx2Gemv, kGemvRows, 1> kAvx2GemvTable{};
constexpr BlockTable<Avx512Gemv, kGemvRows, 1> kAvx512GemvTable{};

template <int R, int T, template <int, int> class Block>
void blocked_rows(const BlockTable<Block, R, T>& blocks, const float* w, const float* bias, int64_t out_dim,
                  int64_t in_dim, const float* x, int64_t n, float* y, int64_t row_begin, int64_t row_end) {
  for (int64_t t0 = 0; t0 < n; t0 += kTokenTile) {
    const int64_t t1 = t0 + kTokenTile < n ? t0 + kTokenTile : n;
    const int64_t sub_blocks = (t1 - t0 + T - 1) / T;
    for (int64_t r = row_begin; r < row_end; r += R) {
      const int64_t rows = row_end - r < R ? row_end - r : R;
      // The next block's weight rows (contiguous), a share before each token block. With
      // several tokens a block computes long enough that the hardware's stream prefetch, a
      // few lines ahead, leaves most of the next block's rows to arrive after they are
      // needed: gemm_bench BM_GemmFromMemory/32 (the LM head's 113 MB at 32 tokens) 30.9-33.9
      // -> 22.5-23.5 ms. One token (a GEMV) only streams, and gained nothing (8.6-9.6 ms
      // both ways). A prefetch reads no value: the bits are the same.
      const int64_t next_rows = r + R < row_end ? (row_end - r - R < R ? row_end - r - R : R) : 0;
      const char* next = next_rows > 0 ? reinterpret_cast<const char*>(w + (r + R) * in_dim) : nullptr;
      const int64_t lines = (next_rows * in_dim * static_cast<int64_t>(sizeof(float)) + 63) / 64;
      int64_t sub = 0;
      for (int64_t t = t0; t < t1; t += T, ++sub) {
        if constexpr (T > 1) {
          for (int64_t l = sub * lines / sub_blocks; l < (sub + 1) * lines / sub_blocks; ++l)
            __builtin_prefetch(next + l * 64, 0, 2);
        }
        const int64_t tokens = t1 - t < T ? t1 - t : T;
        blocks.table[rows - 1][tokens - 1](w + r * in_dim, in_dim, x + t * in_dim, y + t * out_dim + r, out_dim,
                                           bias == nullptr ? nullptr : bias + r);
      }
    }
  }
}

bool cpu_has(GemmIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case GemmIsa::kScalar: return true;
    case GemmIsa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case GemmIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  return false;
}
#else
bool cpu_has(GemmIsa isa) { return isa == GemmIsa::kScalar; }
#endif

GemmIsa choose_isa() {
  GemmIsa widest = GemmIsa::kScalar;
  for (GemmIsa isa : {GemmIsa::kAvx2, GemmIsa::kAvx512}) {
    if (cpu_has(isa)) widest = isa;
  }
  if (const char* env = std::getenv("KVP_GEMM_ISA"); env != nullptr) {
    for (GemmIsa isa : {GemmIsa::kScalar, GemmIsa::kAvx2, GemmIsa::kAvx512}) {
      if (gemm_isa_name(isa) == env && cpu_has(isa)) return isa;
    }
  }
  return widest;
}

}  // namespace

std::string_view gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kScalar: return "scalar";
    case GemmIsa::kAvx2: return "avx2";
    case GemmIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

bool gemm_isa_supported(GemmIsa isa) { return cpu_has(isa); }

GemmIsa gemm_isa() {
  static const GemmIsa chosen = choose_isa();
  return chosen;
}

void gemm_rows(GemmIsa isa, const float* w, const float* bias, int64_t out_dim, int64_t in_dim, const float* x,
               int64_t n, float* y, int64_t row_begin, int64_t row_end) {
  switch (isa) {
#if defined(KVP_GEMM_X86)
    case GemmIsa::kAvx512:
      if (n == 1) {
        blocked_rows(kAvx512GemvTable, w, bias, out_dim, in_dim, x, n, y, row_begin, row_end);
      } else {
        blocked_rows(kAvx512Table, w, bias, out_dim, in_dim, x, n, y, row_begin, row_end);
      }
      return;
    case GemmIsa::kAvx2:
      if (n == 1) {
        blocked_rows(kAvx2GemvTable, w, bias, out_dim, in_dim, x, n, y, row_begin, row_end);
      } else {
        blocked_rows(kAvx2Table, w, bias, out_dim, in_dim, x, n, y, row_begin, row_end);
      }
      return;
#endif
    default:
      for (int64_t t0 = 0; t0 < n; t0 += kTokenTile) {
        const int64_t tokens = n - t0 < kTokenTile ? n - t0 : kTokenTile;
        scalar_block(row_end - row_begin, tokens, w + row_begin * in_dim, in_dim, x + t0 * in_dim,
                     y + t0 * out_dim + row_begin, out_dim, bias == nullptr ? nullptr : bias + row_begin);
      }
      return;
  }
}

float dot_fma(const float* a, const float* b, int64_t n) {
  float y = 0.0f;
  gemm_rows(gemm_isa(), a, nullptr, 1, n, b, 1, &y, 0, 1);
  return y;
}

float* widened_row_buffer(int64_t n) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<std::size_t>(n));
  return buffer.data();
}

}  // namespace kvp::kernels
