// kvproof's own CPU paged attention (kernels::paged_attention_head) as an attention plug-in:
// the kvproof layout, fp32/fp16/bf16 pools, every shape. It passes kernel-check bitwise-stably
// (batch-invariant by construction: each output row is computed alone, in a fixed order).
#include <cstdio>
#include <vector>

#include "kernels/cpu_attention.h"
#include "kernels/kv_element.h"
#include "kvproof/attention_plugin.h"

namespace {

template <typename KvT>
void run_typed(const kvp_attention_args& a) {
  const kvp_attention_shape& s = a.shape;
  const auto* k_pool = static_cast<const KvT*>(a.k_cache);
  const auto* v_pool = static_cast<const KvT*>(a.v_cache);
  const int64_t group = s.num_heads / s.num_kv_heads;
  std::vector<float> scratch(static_cast<std::size_t>(kvp::kernels::attention_scratch_size<KvT>(s.head_dim)));
  for (int32_t t = 0; t < s.num_tokens; ++t) {
    const int32_t* table = a.block_tables + static_cast<int64_t>(a.token_seq[t]) * s.max_blocks_per_seq;
    for (int32_t h = 0; h < s.num_heads; ++h) {
      const int64_t row = (static_cast<int64_t>(t) * s.num_heads + h) * s.head_dim;
      kvp::kernels::paged_attention_head(a.query + row, k_pool, v_pool, table, s.block_size, s.num_kv_heads, h / group,
                                         s.head_dim, a.positions[t], a.scale, kvp::kernels::kDefaultAttentionPartition,
                                         scratch.data(), a.out + row);
    }
  }
}

int supports(const kvp_attention_shape* s) {
  return s->kv_layout == KVP_LAYOUT_KVPROOF && s->num_kv_heads > 0 && s->num_heads % s->num_kv_heads == 0;
}

int run(const kvp_attention_args* a, char* err, size_t err_len) {
  if (!supports(&a->shape)) {
    std::snprintf(err, err_len, "kvproof-cpu: unsupported shape (layout %d, heads %d/%d)", a->shape.kv_layout,
                  a->shape.num_heads, a->shape.num_kv_heads);
    return 1;
  }
  switch (a->shape.kv_dtype) {
    case KVP_KV_F32: run_typed<float>(*a); return 0;
    case KVP_KV_F16: run_typed<kvp::kernels::F16Bits>(*a); return 0;
    case KVP_KV_BF16: run_typed<kvp::kernels::BF16Bits>(*a); return 0;
    default: std::snprintf(err, err_len, "kvproof-cpu: unknown KV dtype %d", a->shape.kv_dtype); return 1;
  }
}

const kvp_attention_plugin kDescriptor = {
    KVP_ATTENTION_PLUGIN_ABI_VERSION,
    "kvproof-cpu",
    KVP_DEVICE_HOST,
    KVP_DTYPE_BIT(KVP_KV_F32) | KVP_DTYPE_BIT(KVP_KV_F16) | KVP_DTYPE_BIT(KVP_KV_BF16),
    KVP_LAYOUT_BIT(KVP_LAYOUT_KVPROOF),
    supports,
    run,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const kvp_attention_plugin* kvp_attention_plugin_v1(void) {
  return &kDescriptor;
}
