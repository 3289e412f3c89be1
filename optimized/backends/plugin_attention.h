// A backend's attention through a plug-in (include/kvproof/attention_plugin.h) instead of
// kvproof's own kernel: a plan's batch handed over as kvp_attention_args, over one layer's
// pools in the kvproof layout. The CPU backend calls host plug-ins with host pointers; the
// CUDA backend calls host plug-ins in its emulated flavour (emulated device memory is host
// memory) and CUDA plug-ins in its device flavour, with device pointers and the stream its
// own kernels run on. `kvproof verify --attention-plugin` runs the whole engine this way.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kvproof/attention_plugin.h"
#include "model/model_config.h"
#include "optimized/backends/batch_plan.h"
#include "optimized/kv/kv_pool_shape.h"

namespace kvp {

// Ok when `plugin` can be the attention of a backend whose pools are `kv_dtype`, in kvproof's
// layout, in memory of `device` (a kvp_device); otherwise why not, naming the plug-in and
// `backend` (the backend's name, for the message).
Status check_plugin_for_backend(const kvp_attention_plugin& plugin, const char* backend, int32_t device,
                                DType kv_dtype);

// Ok when `plugin` can be the attention of a model whose layers attend through a sliding
// window of `sliding_window` positions (0: none): ABI version 3 with supports_window. An
// earlier plug-in, or one without supports_window, is refused for a windowed model, naming
// it, rather than attended to over the whole past.
Status check_plugin_for_window(const kvp_attention_plugin& plugin, int64_t sliding_window);

// Ok when `plugin` can soft-cap scores at `softcap` (0: no cap): ABI version 4 with
// supports_softcap. An earlier plug-in, or one without supports_softcap, is refused for a
// soft-capped model, naming it, rather than run on uncapped scores.
Status check_plugin_for_softcap(const kvp_attention_plugin& plugin, double softcap);

// check_plugin_for_window and check_plugin_for_softcap for the model's window and attention
// soft-cap (Gemma 2's attn_logit_softcapping). The score scale needs nothing: every ABI version
// passes it (args.scale, the model's attention_scale(): Gemma's query_pre_attn_scalar^-1/2).
Status check_plugin_for_model(const kvp_attention_plugin& plugin, const ModelConfig& model);

// The ABI's name for a pool element type (f32, f16, bf16, fp8-e4m3, fp8-e5m2); REQUIRES one
// of those. A version-1 plug-in is refused fp8 pools (its ABI has no name for them).
kvp_kv_dtype plugin_kv_dtype(DType kv_dtype);

// Where the plug-in reads and writes, every pointer in the plug-in's memory (host, or CUDA
// device memory for a CUDA plug-in): the plan's arrays (query_start, token_seq = the plan
// token's sequence index, positions, context_lens, block_tables), one layer's pools
// ([num_device_blocks, block_size, num_kv_heads, head_dim] of the pool's kv_dtype), the
// queries and the output ([num_tokens][num_heads][head_dim] f32), and the stream (nullptr for
// host plug-ins; for CUDA ones the cudaStream_t, where nullptr is the legacy default stream).
struct PluginBatch {
  const float* query = nullptr;
  float* out = nullptr;
  const int32_t* query_start = nullptr;
  const int32_t* token_seq = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* block_tables = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  void* stream = nullptr;
  // fp8 pools: the layer's scales, float[num_kv_heads] each; null for the other dtypes.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  // The layer's sliding window in positions (0: none); nonzero only for a plug-in that
  // check_plugin_for_window accepted.
  int32_t window = 0;
  // The score scale (ModelConfig::attention_scale()) and soft-cap (0: none; nonzero only for
  // a plug-in that check_plugin_for_softcap accepted).
  float scale = 0.0f;
  float softcap = 0.0f;
};

// out = attention of every plan token and query head, through `plugin`. The shape comes from
// the (host-side) plan and pool; the data from `batch`.
// Errors: supports() (or, with a window, supports_window(); with a cap, supports_softcap())
// declines the shape, or run() fails (its message, naming the plug-in).
// REQUIRES: batch.scale > 0.
// REQUIRES: check_plugin_for_backend(plugin, ..., pool.kv_dtype) is ok; the plan passed
// validate_plan.
Status plugin_attention(const kvp_attention_plugin& plugin, const BatchPlan& plan, int32_t num_heads,
                        const KvPoolShape& pool, const PluginBatch& batch);

}  // namespace kvp
