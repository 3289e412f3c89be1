/* kvproof attention plug-in ABI, version 4 (docs/plugins.md).
 *
 * A paged-attention kernel that kvproof did not write, in a shared library, so that
 * `kvproof kernel-check --plugin lib.so` can run kvproof's adversarial grid on it against
 * an fp64 reference. Plain C (C99 and C++ alike), no kvproof header needed.
 *
 * The library exports one function, kvp_attention_plugin_v4(), returning a descriptor that
 * lives as long as the library is loaded (a library built for an earlier version exports
 * kvp_attention_plugin_v3(), _v2() or _v1() instead, and still loads: kvproof looks for v4,
 * then v3, v2, v1). kvproof reads the descriptor, asks supports() for every shape of its grid
 * (and supports_window() for the windowed ones, supports_softcap() for the soft-capped ones),
 * and calls run() on the shapes accepted. A kernel must report a failure by returning nonzero
 * from run() with a message in `err`, never by aborting.
 *
 * One call computes, for every new token t of a batch and every query head h:
 *   out[t][h] = sum_j softmax_j(cap(scale * q[t][h] . K[s][j][g])) V[s][j][g],  j = first[t]..positions[t]
 * where cap(x) = x, or with a soft-cap c (version 4, args.softcap = c > 0) c * tanh(x / c)
 * (Gemma 2's attn_logit_softcapping, FlashAttention's softcap: applied after the scale); scale
 * is any positive float (1 / sqrt(head_dim) for most models, query_pre_attn_scalar^-1/2 for
 * Gemma's; kernel-check varies it, so a kernel that computes its own fails); first[t] = 0, or with a sliding window of
 * W positions (version 3, args.window = W > 0) first[t] = max(0, positions[t] - W + 1): the token sees W positions,
 * itself included (transformers' sliding-window mask, kv_idx > q_idx - W). where s = token_seq[t], g = h / (num_heads /
 * num_kv_heads) (grouped-query attention: query heads are grouped consecutively), and K[s][j][g] is the key of logical
 * position j of sequence s, found through its block table: block block_tables[s * max_blocks_per_seq + j / block_size],
 * offset j % block_size. Positions past positions[t] exist in the cache (a prefill chunk) and
 * must not be read into the softmax; slots past context_lens[s] and blocks outside the tables
 * may hold anything (kvproof fills them with NaN). With a window, the table entries of the
 * blocks wholly before the window of sequence s's first new token (entries j with
 * (j + 1) * block_size <= first[t0]) may be -1 or name any block, the same one several times
 * or another sequence's: a serving engine frees them (kvproof points them at a block of NaN).
 * A kernel must skip them, not read and mask them.
 *
 * Everything is row-major and densely packed unless stated. Queries and outputs are fp32; the
 * KV pool is fp32, fp16 or bf16 (IEEE binary16 / the top half of binary32), and from version 2
 * also OCP fp8 E4M3 or E5M2, scaled per KV head (k_scale, v_scale below).
 *
 * Version 2 over version 1: the fp8 dtypes, and k_scale/v_scale appended to
 * kvp_attention_args (the fields before them are unchanged, so a version-1 plug-in reads the
 * same struct). kvproof gives a version-1 plug-in only the dtypes version 1 names.
 *
 * Version 3 over version 2: the sliding window, args.window appended to kvp_attention_args and
 * supports_window appended to the descriptor. kvproof reads supports_window only from a
 * version-3 descriptor and gives earlier plug-ins no windowed call.
 *
 * Version 4 over version 3: the score soft-cap, args.softcap appended to kvp_attention_args and
 * supports_softcap appended to the descriptor. kvproof reads supports_softcap only from a
 * version-4 descriptor and gives earlier plug-ins no soft-capped call.
 */
#ifndef KVPROOF_ATTENTION_PLUGIN_H_
#define KVPROOF_ATTENTION_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_ATTENTION_PLUGIN_ABI_VERSION 4

/* The entry point's name; kvproof looks this symbol up with dlsym (then, for a library built
 * for an earlier version, KVP_ATTENTION_PLUGIN_ENTRY_V3, _V2 and _V1, whose descriptors say
 * abi_version 3, 2 and 1). */
#define KVP_ATTENTION_PLUGIN_ENTRY "kvp_attention_plugin_v4"
#define KVP_ATTENTION_PLUGIN_ENTRY_V3 "kvp_attention_plugin_v3"
#define KVP_ATTENTION_PLUGIN_ENTRY_V2 "kvp_attention_plugin_v2"
#define KVP_ATTENTION_PLUGIN_ENTRY_V1 "kvp_attention_plugin_v1"

/* Where run() expects its pointers. */
typedef enum kvp_device {
  KVP_DEVICE_HOST = 0, /* host memory; run() is called on the host, args->stream is NULL */
  KVP_DEVICE_CUDA = 1  /* CUDA device memory; args->stream is the cudaStream_t to launch on */
} kvp_device;

/* KV-pool element types. A descriptor's kv_dtypes is a bitmask of KVP_DTYPE_BIT(dtype).
 * FP8 (version 2): the OCP 8-bit formats (OFP8 rev. 1.0): E4M3 (bias 7, max 448, no
 * infinities, S.1111.111 NaN) and E5M2 (bias 15, max 57344, IEEE-like). An element of KV
 * head g means code * k_scale[g] (K) or code * v_scale[g] (V). */
typedef enum kvp_kv_dtype {
  KVP_KV_F32 = 0,
  KVP_KV_F16 = 1,
  KVP_KV_BF16 = 2,
  KVP_KV_FP8_E4M3 = 3,
  KVP_KV_FP8_E5M2 = 4
} kvp_kv_dtype;

/* KV-pool layouts, with E the element type, nb num_blocks, bs block_size, H num_kv_heads,
 * D head_dim. A descriptor's kv_layouts is a bitmask of KVP_LAYOUT_BIT(layout).
 *
 * KVP_LAYOUT_KVPROOF: k_cache and v_cache are separate arrays, each E[nb][bs][H][D]
 *   (kvproof's own layout; also FlashInfer's NHD when K and V are passed as two tensors).
 * KVP_LAYOUT_FLASHINFER_NHD: one array E[nb][2][bs][H][D] (index 0: K, 1: V);
 *   k_cache points at its start, v_cache = k_cache + bs*H*D elements.
 * KVP_LAYOUT_FLASHINFER_HND: one array E[nb][2][H][bs][D]; k_cache at its start,
 *   v_cache = k_cache + H*bs*D elements.
 * KVP_LAYOUT_VLLM: vLLM's paged-attention layout, x = 16 / sizeof(E) elements (16 bytes):
 *   k_cache E[nb][H][D/x][bs][x] (dimension d of the key at offset o is [d/x][o][d%x]),
 *   v_cache E[nb][H][D][bs]. REQUIRES D % x == 0 (kvproof asks supports() only for such D).
 */
typedef enum kvp_kv_layout {
  KVP_LAYOUT_KVPROOF = 0,
  KVP_LAYOUT_FLASHINFER_NHD = 1,
  KVP_LAYOUT_FLASHINFER_HND = 2,
  KVP_LAYOUT_VLLM = 3
} kvp_kv_layout;

#define KVP_DTYPE_BIT(dtype) (1u << (unsigned)(dtype))
#define KVP_LAYOUT_BIT(layout) (1u << (unsigned)(layout))

/* The shape of one call: what supports() is asked and run() receives. */
typedef struct kvp_attention_shape {
  int32_t num_heads;          /* query heads; a multiple of num_kv_heads */
  int32_t num_kv_heads;       /* KV heads (1: multi-query attention) */
  int32_t head_dim;           /* D */
  int32_t block_size;         /* token slots per block, >= 1 */
  int32_t kv_dtype;           /* a kvp_kv_dtype the descriptor declares */
  int32_t kv_layout;          /* a kvp_kv_layout the descriptor declares */
  int32_t num_seqs;           /* sequences in the batch, >= 1 */
  int32_t num_tokens;         /* new tokens (query rows), >= 1 */
  int32_t max_context_len;    /* the largest context_lens entry */
  int32_t max_blocks_per_seq; /* the block-table row stride, >= ceil(max_context_len / block_size) */
  int64_t num_blocks;         /* blocks in the pool */
} kvp_attention_shape;

/* One batch, laid out as kvproof's BatchPlan lays it out (flat arrays, CSR over tokens). */
typedef struct kvp_attention_args {
  kvp_attention_shape shape;
  /* float[num_tokens][num_heads][head_dim], read only. */
  const float* query;
  /* float[num_tokens][num_heads][head_dim], written in full; nothing outside it may be written. */
  float* out;
  /* int32[num_seqs + 1]: sequence s's new tokens are [query_start[s], query_start[s+1]). */
  const int32_t* query_start;
  /* int32[num_tokens]: the sequence of token t (agrees with query_start). */
  const int32_t* token_seq;
  /* int32[num_tokens]: the position of token t; it attends to positions 0..positions[t].
   * A sequence's new tokens are its last ones: positions context_lens[s] - n .. context_lens[s] - 1. */
  const int32_t* positions;
  /* int32[num_seqs]: positions each sequence holds, new tokens included, >= 1. */
  const int32_t* context_lens;
  /* int32[num_seqs][max_blocks_per_seq]: block ids in logical order; entries past
   * ceil(context_lens[s] / block_size) are -1. Ids are distinct and < num_blocks, except the
   * entries a window leaves behind (see the top: -1 or any id). */
  const int32_t* block_tables;
  /* The pool of one layer in shape.kv_layout (see kvp_kv_layout), read only. */
  const void* k_cache;
  const void* v_cache;
  /* The score scale, > 0: 1 / sqrt(head_dim) for most models, query_pre_attn_scalar^-1/2 for
   * Gemma's (kernel-check varies it). */
  float scale;
  /* KVP_DEVICE_CUDA: the cudaStream_t to run on (kvproof synchronises it); host: NULL. */
  void* stream;
  /* Version 2. fp8 pools: the layer's dequantisation scales, float[num_kv_heads] each, in the
   * plug-in's memory (device memory for a CUDA plug-in), read only: key dimension d of
   * position j in KV head g is code * k_scale[g]. NULL for the other dtypes. */
  const float* k_scale;
  const float* v_scale;
  /* Version 3. The sliding window in positions: 0, none (every token sees positions
   * 0..positions[t]); W > 0, token t sees positions max(0, positions[t] - W + 1)..positions[t].
   * Nonzero only in a call whose shape and window supports_window() accepted. */
  int32_t window;
  /* Version 4. The score soft-cap: 0, none; c > 0, every score x = scale * q . k becomes
   * c * tanh(x / c) before the softmax (Gemma 2's attn_logit_softcapping, 50 in its configs).
   * Nonzero only in a call whose shape and cap supports_softcap() accepted. */
  float softcap;
} kvp_attention_args;

typedef struct kvp_attention_plugin {
  uint32_t abi_version; /* KVP_ATTENTION_PLUGIN_ABI_VERSION the library was built with (1 to 4) */
  const char* name;     /* non-empty, for reports */
  int32_t device;       /* a kvp_device */
  uint32_t kv_dtypes;   /* bitmask of KVP_DTYPE_BIT(kvp_kv_dtype), nonzero */
  uint32_t kv_layouts;  /* bitmask of KVP_LAYOUT_BIT(kvp_kv_layout), nonzero */
  /* Nonzero when run() computes this shape. A shape declined is skipped and reported as
   * skipped; a shape accepted and then failed by run() is the kernel's failure. May be NULL
   * (every shape of the declared dtypes and layouts is accepted). */
  int (*supports)(const kvp_attention_shape* shape);
  /* Computes `out`. Returns 0 on success; otherwise nonzero with a NUL-terminated message of
   * at most err_len bytes (err_len > 0) in err. Must not keep pointers past the call. */
  int (*run)(const kvp_attention_args* args, char* err, size_t err_len);
  /* Version 3. Nonzero when run() computes this shape with a sliding window of `window`
   * positions (window > 0; supports() is asked first and must accept the shape too). NULL: the
   * plug-in has no sliding window, and every windowed shape is declined. */
  int (*supports_window)(const kvp_attention_shape* shape, int32_t window);
  /* Version 4. Nonzero when run() computes this shape with scores soft-capped at `softcap`
   * (softcap > 0; supports() is asked first and must accept the shape too, and a windowed call
   * needs supports_window() as well). NULL: the plug-in has no soft-cap, and every soft-capped
   * shape is declined. */
  int (*supports_softcap)(const kvp_attention_shape* shape, float softcap);
} kvp_attention_plugin;

/* The entry point every plug-in exports (KVP_ATTENTION_PLUGIN_ENTRY). */
typedef const kvp_attention_plugin* (*kvp_attention_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KVPROOF_ATTENTION_PLUGIN_H_ */
