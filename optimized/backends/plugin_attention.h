// The CPU backend's attention through a plug-in (include/kvproof/attention_plugin.h) instead of
// kernels::paged_attention_head: a plan's batch handed over as kvp_attention_args, over one
// layer's fp32 pools in the kvproof layout. `kvproof verify --attention-plugin` runs the whole
// engine this way.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kvproof/attention_plugin.h"
#include "optimized/backends/batch_plan.h"
#include "optimized/kv/kv_pool_shape.h"

namespace kvp {

// Ok when `plugin` can be the CPU backend's attention: a host plug-in declaring f32 KV and the
// kvproof layout; otherwise why not, naming the plug-in.
Status check_plugin_for_cpu_backend(const kvp_attention_plugin& plugin);

// out[t][h] = attention of plan token t, query head h, through the plan's block tables over
// k_pool/v_pool (one layer, [num_device_blocks, block_size, num_kv_heads, head_dim] f32).
// q and out: [num_tokens][num_heads][head_dim]; seq_of_token: [num_tokens].
// Errors: supports() declines the shape, or run() fails (its message, naming the plug-in).
// REQUIRES: check_plugin_for_cpu_backend(plugin) is ok; the plan passed validate_plan.
Status plugin_attention(const kvp_attention_plugin& plugin, const BatchPlan& plan, const int32_t* seq_of_token,
                        int32_t num_heads, const KvPoolShape& pool, const float* k_pool, const float* v_pool,
                        const float* q, float* out);

}  // namespace kvp
