/* A plain-C attention plug-in, built once correct and once per planted defect.
 *
 * KVP_PLANTED selects the build (plugins/CMakeLists.txt builds each as its own library):
 *   0  naive-c: correct, every layout and dtype (a two-pass softmax in fp32)
 *   1  past-context: reads one position past the row's last (inside the same block)
 *   2  drop-partial: ignores the last block when it is partial
 *   3  head-modulo: maps query head h to KV head h % num_kv_heads
 *   4  outside-table: reads the block after the table's last one (block id + 1)
 *   5  batch-split: splits the softmax into partitions of 4 * num_seqs positions
 *   6  write-past-out: writes one float past the end of `out`
 *   7  no-max: softmax without subtracting the maximum (overflows on large scores)
 *   8  crash: SIGSEGV on batches of more than two sequences
 *   9  hang: never returns when block_size is 1
 *  10  no-entry: exports no entry point
 *  11  abi-v2: declares ABI version 2
 *  12  bad-descriptor: run is NULL
 *  13  run-error: accepts head_dim 80 (and 16, the tiny preset's), then fails on it
 *  14  write-pool: writes into the K pool
 *  15  nondeterministic: every second call changes the last bit of out[0]
 *  16  declines-all: supports() accepts no shape
 *  17  window-off-by-one: (ABI version 3) a sliding window that sees W + 1 positions
 *  18  window-masked: (ABI version 3) reads every block from position 0 and weighs the
 *      positions before the window by 0, where a freed block's NaN makes 0 * NaN = NaN
 *  19  naive-c-v3: correct, ABI version 3 with the sliding window, every layout
 *  20  naive-c-v2: correct, ABI version 2 (its entry point), every layout
 *  21  naive-c-v4: correct, ABI version 4 with the sliding window and the soft-cap, every layout
 *  22  softcap-unscaled: (ABI version 4) caps the raw dot product, then scales:
 *      scale * c * tanh(q.k / c) instead of c * tanh(scale * q.k / c)
 *  23  softcap-ignored: (ABI version 4) declares the soft-cap and never applies it
 *  24  own-scale: uses 1 / sqrt(head_dim) instead of args.scale (right for most models, wrong
 *      for Gemma's query_pre_attn_scalar)
 * This file is C on purpose: it shows the ABI header is plain C.
 *
 * KVP_PLANTED_DEVICE=1 builds it declaring KVP_DEVICE_CUDA while still computing on the host:
 * with kernel-check's CUDA runtime replaced by plugins/fake_cudart.c (host memory), that
 * tests kernel-check's device path (copies, guard zones and pools read back) without a GPU.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvproof/attention_plugin.h"

#ifndef KVP_PLANTED
#define KVP_PLANTED 0
#endif
#ifndef KVP_PLANTED_DEVICE
#define KVP_PLANTED_DEVICE 0
#endif
/* The ABI version a build is for: the builds with a soft-cap, 4; with a sliding window only, 3;
 * naive-c-v2, 2 (a library built before version 3 still loads, and gets no windowed case);
 * the others, 1. */
#define KVP_PLANTED_V4 (KVP_PLANTED == 21 || KVP_PLANTED == 22 || KVP_PLANTED == 23)
#define KVP_PLANTED_V3 (KVP_PLANTED == 17 || KVP_PLANTED == 18 || KVP_PLANTED == 19 || KVP_PLANTED_V4)
#define KVP_PLANTED_ABI (KVP_PLANTED_V4 ? 4 : KVP_PLANTED_V3 ? 3 : KVP_PLANTED == 20 ? 2 : 1)
/* The correct builds take every layout; the planted ones, kvproof's. */
#define KVP_PLANTED_CORRECT (KVP_PLANTED == 0 || KVP_PLANTED == 19 || KVP_PLANTED == 20 || KVP_PLANTED == 21)

static float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = ldexpf((float)mantissa, -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = ldexpf((float)(mantissa | 0x400u), (int)exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

static float load(const void* pool, int32_t dtype, int64_t index) {
  if (dtype == KVP_KV_F32) return ((const float*)pool)[index];
  const uint16_t bits = ((const uint16_t*)pool)[index];
  if (dtype == KVP_KV_F16) return f16_to_f32(bits);
  uint32_t u = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Element index of dimension d of the key (is_value 0) or value (1) at (block, offset, head). */
static int64_t kv_index(const kvp_attention_shape* s, int is_value, int64_t block, int64_t offset, int64_t head,
                        int64_t d) {
  const int64_t bs = s->block_size, nh = s->num_kv_heads, hd = s->head_dim;
  switch (s->kv_layout) {
    case KVP_LAYOUT_KVPROOF: return ((block * bs + offset) * nh + head) * hd + d;
    case KVP_LAYOUT_FLASHINFER_NHD: return block * 2 * bs * nh * hd + (offset * nh + head) * hd + d;
    case KVP_LAYOUT_FLASHINFER_HND: return block * 2 * nh * bs * hd + (head * bs + offset) * hd + d;
    default: {
      const int64_t x = s->kv_dtype == KVP_KV_F32 ? 4 : 8;
      if (is_value) return ((block * nh + head) * hd + d) * bs + offset;
      return (((block * nh + head) * (hd / x) + d / x) * bs + offset) * x + d % x;
    }
  }
}

static int supports(const kvp_attention_shape* s) {
  if (s->num_kv_heads <= 0 || s->num_heads % s->num_kv_heads != 0) return 0;
  if (s->kv_layout == KVP_LAYOUT_VLLM && s->head_dim % (s->kv_dtype == KVP_KV_F32 ? 4 : 8) != 0) return 0;
#if !KVP_PLANTED_CORRECT
  if (s->kv_layout != KVP_LAYOUT_KVPROOF) return 0;
#endif
#if KVP_PLANTED == 16
  return 0;
#endif
  return 1;
}

#if KVP_PLANTED_V3
static int supports_window(const kvp_attention_shape* s, int32_t window) { return supports(s) && window > 0; }
#endif
#if KVP_PLANTED_V4
static int supports_softcap(const kvp_attention_shape* s, float softcap) { return supports(s) && softcap > 0.0f; }
#endif

/* The score of a dot product: scaled, then (version 4) soft-capped. */
static float score_of(const kvp_attention_args* a, float dot) {
#if KVP_PLANTED == 24
  const float x = dot / sqrtf((float)a->shape.head_dim);
#else
  const float x = dot * a->scale;
#endif
#if KVP_PLANTED == 22
  if (a->softcap > 0.0f) return a->scale * a->softcap * tanhf(dot / a->softcap);
#elif KVP_PLANTED_V4 && KVP_PLANTED != 23
  if (a->softcap > 0.0f) return a->softcap * tanhf(x / a->softcap);
#endif
  return x;
}

static int run(const kvp_attention_args* a, char* err, size_t err_len) {
  const kvp_attention_shape* s = &a->shape;
  const int64_t hd = s->head_dim, bs = s->block_size;
  const int64_t group = s->num_heads / s->num_kv_heads;
  (void)group;
  float* scores = (float*)malloc(sizeof(float) * (size_t)(s->max_context_len + 1));
  if (scores == NULL) {
    snprintf(err, err_len, "naive-c: out of memory");
    return 1;
  }
#if KVP_PLANTED == 8
  if (s->num_seqs > 2) raise(SIGSEGV);
#elif KVP_PLANTED == 9
  {
    volatile unsigned spin = 0; /* a side effect, so that the compiler keeps the loop (unsigned: no overflow) */
    while (s->block_size == 1) spin = spin + 1;
  }
#elif KVP_PLANTED == 13
  if (s->head_dim == 80 || s->head_dim == 16) {
    free(scores);
    snprintf(err, err_len, "run-error: head_dim %d is not implemented", (int)s->head_dim);
    return 1;
  }
#elif KVP_PLANTED == 14
  ((float*)(void*)a->k_cache)[0] = 0.0f;
#endif
  for (int32_t t = 0; t < s->num_tokens; ++t) {
    const int32_t seq = a->token_seq[t];
    const int32_t* table = a->block_tables + (int64_t)seq * s->max_blocks_per_seq;
    int64_t last = a->positions[t]; /* attend to positions first..last */
    int64_t first = 0;
#if KVP_PLANTED_V3
    if (a->window > 0 && last - a->window + 1 > 0) first = last - a->window + 1;
#endif
#if KVP_PLANTED == 17
    if (first > 0) first -= 1;
#endif
    /* The positions read: the window's, or (window-masked) all of them, the ones before the
     * window weighed by 0. */
#if KVP_PLANTED == 18
    const int64_t begin = 0;
#else
    const int64_t begin = first;
#endif
#if KVP_PLANTED == 1
    if ((last + 1) % bs != 0) last += 1;
#elif KVP_PLANTED == 2
    {
      const int64_t full = (a->context_lens[seq] / bs) * bs;
      if (last >= full) last = full - 1;
    }
#endif
    for (int32_t h = 0; h < s->num_heads; ++h) {
      const float* q = a->query + ((int64_t)t * s->num_heads + h) * hd;
      float* out = a->out + ((int64_t)t * s->num_heads + h) * hd;
#if KVP_PLANTED == 3
      const int64_t g = h % s->num_kv_heads;
#else
      const int64_t g = h / group;
#endif
      for (int64_t d = 0; d < hd; ++d) out[d] = 0.0f;
      if (last < 0) continue;
      for (int64_t j = begin; j <= last; ++j) {
        int64_t block = table[j / bs];
#if KVP_PLANTED == 4
        if (j / bs == (a->positions[t]) / bs) block = (block + 1) % s->num_blocks;
#endif
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d)
          dot += q[d] * load(a->k_cache, s->kv_dtype, kv_index(s, 0, block, j % bs, g, d));
        scores[j] = score_of(a, dot);
      }
#if KVP_PLANTED == 5
      /* Partitions of 4 * num_seqs positions, merged in order: right on its own, but the
       * rounding depends on what else is in the batch. */
      {
        const int64_t part = 4 * (int64_t)s->num_seqs;
        float run_max = 0.0f, run_sum = 0.0f;
        for (int64_t begin = 0; begin <= last; begin += part) {
          const int64_t end = begin + part <= last + 1 ? begin + part : last + 1;
          float m = scores[begin], sum = 0.0f;
          for (int64_t j = begin; j < end; ++j) m = scores[j] > m ? scores[j] : m;
          float acc[256];
          for (int64_t d = 0; d < hd; ++d) acc[d] = 0.0f;
          for (int64_t j = begin; j < end; ++j) {
            const float p = expf(scores[j] - m);
            const int64_t block = table[j / bs];
            sum += p;
            for (int64_t d = 0; d < hd; ++d)
              acc[d] += p * load(a->v_cache, s->kv_dtype, kv_index(s, 1, block, j % bs, g, d));
          }
          if (begin == 0) {
            run_max = m;
            run_sum = sum;
            for (int64_t d = 0; d < hd; ++d) out[d] = acc[d];
          } else {
            const float nm = m > run_max ? m : run_max;
            const float ca = expf(run_max - nm), cb = expf(m - nm);
            run_sum = run_sum * ca + sum * cb;
            for (int64_t d = 0; d < hd; ++d) out[d] = out[d] * ca + acc[d] * cb;
            run_max = nm;
          }
        }
        for (int64_t d = 0; d < hd; ++d) out[d] /= run_sum;
      }
#else
      {
#if KVP_PLANTED == 7
        const float m = 0.0f;
#else
        float m = scores[first];
        for (int64_t j = first + 1; j <= last; ++j) m = scores[j] > m ? scores[j] : m;
#endif
        float sum = 0.0f;
        for (int64_t j = begin; j <= last; ++j) {
          int64_t block = table[j / bs];
#if KVP_PLANTED == 4
          if (j / bs == (a->positions[t]) / bs) block = (block + 1) % s->num_blocks;
#endif
          const float p = j >= first ? expf(scores[j] - m) : 0.0f;
          sum += p;
          for (int64_t d = 0; d < hd; ++d)
            out[d] += p * load(a->v_cache, s->kv_dtype, kv_index(s, 1, block, j % bs, g, d));
        }
        for (int64_t d = 0; d < hd; ++d) out[d] /= sum;
      }
#endif
    }
  }
#if KVP_PLANTED == 6
  a->out[(int64_t)s->num_tokens * s->num_heads * hd] = 0.0f;
#endif
#if KVP_PLANTED == 15
  {
    static int calls = 0; /* stands for a reduction whose order depends on thread timing */
    if (++calls % 2 == 0) a->out[0] = nextafterf(a->out[0], INFINITY);
  }
#endif
  free(scores);
  return 0;
}

static const char* plugin_name(void) {
  switch (KVP_PLANTED) {
    case 0: return "naive-c";
    case 1: return "planted-past-context";
    case 2: return "planted-drop-partial";
    case 3: return "planted-head-modulo";
    case 4: return "planted-outside-table";
    case 5: return "planted-batch-split";
    case 6: return "planted-write-past-out";
    case 7: return "planted-no-max";
    case 8: return "planted-crash";
    case 9: return "planted-hang";
    case 13: return "planted-run-error";
    case 14: return "planted-write-pool";
    case 15: return "planted-nondeterministic";
    case 16: return "planted-declines-all";
    case 17: return "planted-window-off-by-one";
    case 18: return "planted-window-masked";
    case 19: return "naive-c-v3";
    case 20: return "naive-c-v2";
    case 21: return "naive-c-v4";
    case 22: return "planted-softcap-unscaled";
    case 23: return "planted-softcap-ignored";
    case 24: return "planted-own-scale";
    default: return "planted-loader";
  }
}

static kvp_attention_plugin descriptor = {
/* Built as version-1 plug-ins (the v1 entry point, abi_version 1): they prove that libraries
 * built before ABI version 2 still load and run. abi_v2 declares version 2 behind the v1
 * entry point, a mismatch the loader refuses. The windowed builds (17-19) are version 3,
 * naive-c-v2 (20) version 2, the soft-capped ones (21-23) version 4. */
#if KVP_PLANTED == 11
    2,
#else
    KVP_PLANTED_ABI,
#endif
    NULL,
#if KVP_PLANTED_DEVICE
    KVP_DEVICE_CUDA,
#else
    KVP_DEVICE_HOST,
#endif
    KVP_DTYPE_BIT(KVP_KV_F32) | KVP_DTYPE_BIT(KVP_KV_F16) | KVP_DTYPE_BIT(KVP_KV_BF16),
#if KVP_PLANTED_CORRECT
    KVP_LAYOUT_BIT(KVP_LAYOUT_KVPROOF) | KVP_LAYOUT_BIT(KVP_LAYOUT_FLASHINFER_NHD) |
        KVP_LAYOUT_BIT(KVP_LAYOUT_FLASHINFER_HND) | KVP_LAYOUT_BIT(KVP_LAYOUT_VLLM),
#else
    KVP_LAYOUT_BIT(KVP_LAYOUT_KVPROOF),
#endif
    supports,
#if KVP_PLANTED == 12
    NULL,
#else
    run,
#endif
#if KVP_PLANTED_V3
    supports_window,
#else
    NULL,
#endif
#if KVP_PLANTED_V4
    supports_softcap,
#else
    NULL,
#endif
};

#if KVP_PLANTED == 10
__attribute__((visibility("default"))) const kvp_attention_plugin* kvp_attention_plugin_v0(void) {
#elif KVP_PLANTED_ABI == 4
__attribute__((visibility("default"))) const kvp_attention_plugin* kvp_attention_plugin_v4(void) {
#elif KVP_PLANTED_ABI == 3
__attribute__((visibility("default"))) const kvp_attention_plugin* kvp_attention_plugin_v3(void) {
#elif KVP_PLANTED_ABI == 2
__attribute__((visibility("default"))) const kvp_attention_plugin* kvp_attention_plugin_v2(void) {
#else
__attribute__((visibility("default"))) const kvp_attention_plugin* kvp_attention_plugin_v1(void) {
#endif
  descriptor.name = plugin_name();
  (void)run;
  return &descriptor;
}
