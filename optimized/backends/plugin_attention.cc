#include "optimized/backends/plugin_attention.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>

namespace kvp {

kvp_kv_dtype plugin_kv_dtype(DType kv_dtype) {
  switch (kv_dtype) {
    case DType::kF16: return KVP_KV_F16;
    case DType::kBF16: return KVP_KV_BF16;
    case DType::kF8E4M3: return KVP_KV_FP8_E4M3;
    case DType::kF8E5M2: return KVP_KV_FP8_E5M2;
    default: return KVP_KV_F32;
  }
}

Status check_plugin_for_backend(const kvp_attention_plugin& plugin, const char* backend, int32_t device,
                                DType kv_dtype) {
  const std::string who = std::string("attention plug-in ") + plugin.name;
  const std::string under = std::string(" (backend ") + backend + ")";
  if (plugin.device != device)
    return Status::error(who +
                         (device == KVP_DEVICE_HOST ? ": not a host plug-in; this backend runs host ones"
                                                    : ": not a CUDA plug-in; this backend runs CUDA ones") +
                         under);
  if (kv_dtype != DType::kF32 && kv_dtype != DType::kF16 && kv_dtype != DType::kBF16 && !is_fp8(kv_dtype))
    return Status::error(who + ": the pools are " + std::string(dtype_name(kv_dtype)) +
                         ", which the plug-in ABI has no name for" + under);
  if (is_fp8(kv_dtype) && plugin.abi_version < 2)
    return Status::error(who + ": the pools are " + std::string(dtype_name(kv_dtype)) + ", which plug-in ABI version " +
                         std::to_string(plugin.abi_version) + " has no name for (fp8 came with version 2)" + under);
  if ((plugin.kv_dtypes & KVP_DTYPE_BIT(plugin_kv_dtype(kv_dtype))) == 0)
    return Status::error(who + ": does not take " + std::string(dtype_name(kv_dtype)) + " KV, the pools' element type" +
                         under);
  if ((plugin.kv_layouts & KVP_LAYOUT_BIT(KVP_LAYOUT_KVPROOF)) == 0)
    return Status::error(who + ": does not take the kvproof layout, the pools' layout" + under);
  return Status::ok();
}

Status check_plugin_for_window(const kvp_attention_plugin& plugin, int64_t sliding_window) {
  if (sliding_window == 0) return Status::ok();
  const std::string why = std::string("attention plug-in ") + plugin.name +
                          ": the model attends through a sliding window of " + std::to_string(sliding_window) +
                          " positions, ";
  if (plugin.abi_version < 3)
    return Status::error(why + "which plug-in ABI version " + std::to_string(plugin.abi_version) +
                         " cannot pass (the window came with version 3)");
  if (plugin.supports_window == nullptr)
    return Status::error(why + "and the plug-in has no sliding window (its supports_window is NULL)");
  if (sliding_window > INT32_MAX) return Status::error(why + "more than the plug-in ABI's int32 window holds");
  return Status::ok();
}

Status check_plugin_for_softcap(const kvp_attention_plugin& plugin, double softcap) {
  if (softcap == 0.0) return Status::ok();
  const std::string why = std::string("attention plug-in ") + plugin.name +
                          ": the model soft-caps its attention scores at " + std::to_string(softcap) + ", ";
  if (plugin.abi_version < 4)
    return Status::error(why + "which plug-in ABI version " + std::to_string(plugin.abi_version) +
                         " cannot pass (the soft-cap came with version 4)");
  if (plugin.supports_softcap == nullptr)
    return Status::error(why + "and the plug-in has no soft-cap (its supports_softcap is NULL)");
  return Status::ok();
}

Status check_plugin_for_model(const kvp_attention_plugin& plugin, const ModelConfig& model) {
  KVP_RETURN_IF_ERROR(check_plugin_for_window(plugin, model.sliding_window));
  return check_plugin_for_softcap(plugin, model.attn_logit_softcapping);
}

Status plugin_attention(const kvp_attention_plugin& plugin, const BatchPlan& plan, int32_t num_heads,
                        const KvPoolShape& pool, const PluginBatch& batch) {
  kvp_attention_args args{};
  kvp_attention_shape& s = args.shape;
  s.num_heads = num_heads;
  s.num_kv_heads = pool.num_kv_heads;
  s.head_dim = pool.head_dim;
  s.block_size = pool.block_size;
  s.kv_dtype = plugin_kv_dtype(pool.kv_dtype);
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
                         std::to_string(s.block_size) + ", " + std::string(dtype_name(pool.kv_dtype)) + " KV)");
  if (batch.window != 0 &&
      (plugin.abi_version < 3 || plugin.supports_window == nullptr || plugin.supports_window(&s, batch.window) == 0))
    return Status::error(who + " declines a sliding window of " + std::to_string(batch.window) +
                         " positions (head_dim " + std::to_string(s.head_dim) + ", block size " +
                         std::to_string(s.block_size) + ")");
  if (batch.softcap != 0.0f &&
      (plugin.abi_version < 4 || plugin.supports_softcap == nullptr || plugin.supports_softcap(&s, batch.softcap) == 0))
    return Status::error(who + " declines a score soft-cap of " + std::to_string(batch.softcap) + " (head_dim " +
                         std::to_string(s.head_dim) + ", block size " + std::to_string(s.block_size) + ")");
  KVP_CHECK(batch.scale > 0.0f);
  args.query = batch.query;
  args.out = batch.out;
  args.query_start = batch.query_start;
  args.token_seq = batch.token_seq;
  args.positions = batch.positions;
  args.context_lens = batch.context_lens;
  args.block_tables = batch.block_tables;
  args.k_cache = batch.k_cache;
  args.v_cache = batch.v_cache;
  args.scale = batch.scale;
  args.stream = batch.stream;
  if (plugin.abi_version >= 2) {  // version 1's struct ends before the scales
    args.k_scale = batch.k_scale;
    args.v_scale = batch.v_scale;
  }
  if (plugin.abi_version >= 3) args.window = batch.window;    // version 2's struct ends before it
  if (plugin.abi_version >= 4) args.softcap = batch.softcap;  // version 3's struct ends before it
  char err[512] = {};
  if (plugin.run(&args, err, sizeof err) != 0)
    return Status::error(who + ": run() failed: " + std::string(err, strnlen(err, sizeof err)));
  return Status::ok();
}

}  // namespace kvp
