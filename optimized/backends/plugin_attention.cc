#include "optimized/backends/plugin_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace kvp {

Status check_plugin_for_cpu_backend(const kvp_attention_plugin& plugin) {
  const std::string who = std::string("attention plug-in ") + plugin.name;
  if (plugin.device != KVP_DEVICE_HOST)
    return Status::error(who + ": not a host plug-in (the cpu backend runs host ones)");
  if ((plugin.kv_dtypes & KVP_DTYPE_BIT(KVP_KV_F32)) == 0)
    return Status::error(who + ": does not take f32 KV (the cpu backend's pools are f32)");
  if ((plugin.kv_layouts & KVP_LAYOUT_BIT(KVP_LAYOUT_KVPROOF)) == 0)
    return Status::error(who + ": does not take the kvproof layout (the cpu backend's pools are kvproof's)");
  return Status::ok();
}

Status plugin_attention(const kvp_attention_plugin& plugin, const BatchPlan& plan, const int32_t* seq_of_token,
                        int32_t num_heads, const KvPoolShape& pool, const float* k_pool, const float* v_pool,
                        const float* q, float* out) {
  kvp_attention_args args{};
  kvp_attention_shape& s = args.shape;
  s.num_heads = num_heads;
  s.num_kv_heads = pool.num_kv_heads;
  s.head_dim = pool.head_dim;
  s.block_size = pool.block_size;
  s.kv_dtype = KVP_KV_F32;
  s.kv_layout = KVP_LAYOUT_KVPROOF;
  s.num_seqs = static_cast<int32_t>(plan.num_seqs());
  s.num_tokens = static_cast<int32_t>(plan.num_tokens());
  s.max_context_len =
      plan.context_lens.empty() ? 0 : *std::max_element(plan.context_lens.begin(), plan.context_lens.end());
  s.max_blocks_per_seq = plan.max_blocks_per_seq;
  s.num_blocks = pool.num_device_blocks;
  const std::string who = std::string("attention plug-in ") + plugin.name;
  if (plugin.supports != nullptr && plugin.supports(&s) == 0)
    return Status::error(who + " declines the shape (heads " + std::to_string(s.num_heads) + "/" +
                         std::to_string(s.num_kv_heads) + ", head_dim " + std::to_string(s.head_dim) + ", block size " +
                         std::to_string(s.block_size) + ")");
  args.query = q;
  args.out = out;
  args.query_start = plan.query_start.data();
  args.token_seq = seq_of_token;
  args.positions = plan.positions.data();
  args.context_lens = plan.context_lens.data();
  args.block_tables = plan.block_tables.data();
  args.k_cache = k_pool;
  args.v_cache = v_pool;
  args.scale = 1.0f / std::sqrt(static_cast<float>(pool.head_dim));
  args.stream = nullptr;
  char err[512] = {};
  if (plugin.run(&args, err, sizeof err) != 0)
    return Status::error(who + ": run() failed: " + std::string(err, strnlen(err, sizeof err)));
  return Status::ok();
}

}  // namespace kvp
