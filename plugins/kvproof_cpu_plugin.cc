// kvproof's own CPU paged attention (kernels::paged_attention_head) as an attention plug-in
// (ABI version 4): the kvproof layout, fp32/fp16/bf16/fp8 pools, every shape, every sliding
// window (the kernel skips the partitions and blocks before a window: never read), every
// score soft-cap (kernels::soft_cap after the scale, as the engine's attention does). It passes
// kernel-check bitwise-stably (batch-invariant by construction: each output row is computed
// alone, in a fixed order). fp8 pools are read as code * scale into an fp32 copy of the pool,
// then the fp32 kernel runs: the values the CUDA kernel reads, in the same fp32 arithmetic.
//
// Built a second time with KVP_PLANT_DROP_SCALES (kvp_plugin_kvproof_cpu_drop_scales): the
// fp8 scales never reach the kernel (TensorRT-LLM PR #16916's class), which kernel-check's
// accuracy property must catch on the fp8 cases and only there.
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
                                         scratch.data(), a.out + row, nullptr, nullptr, a.window, a.softcap);
    }
  }
}

int supports(const kvp_attention_shape* s) {
  return s->kv_layout == KVP_LAYOUT_KVPROOF && s->num_kv_heads > 0 && s->num_heads % s->num_kv_heads == 0;
}

int supports_window(const kvp_attention_shape* s, int32_t window) { return supports(s) && window > 0; }

int supports_softcap(const kvp_attention_shape* s, float softcap) { return supports(s) && softcap > 0.0f; }

// An fp8 pool ([blocks][bs][H][D] codes) as fp32 values code * scale[head], and the fp32 kernel
// over them.
template <typename F8>
void run_fp8(const kvp_attention_args& a) {
  const kvp_attention_shape& s = a.shape;
  const int64_t n = s.num_blocks * s.block_size * s.num_kv_heads * s.head_dim;
  std::vector<float> k(static_cast<std::size_t>(n)), v(k.size());
  const auto* kc = static_cast<const F8*>(a.k_cache);
  const auto* vc = static_cast<const F8*>(a.v_cache);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t head = i / s.head_dim % s.num_kv_heads;
#if defined(KVP_PLANT_DROP_SCALES)
    const float ks = 1.0f, vs = 1.0f;
    (void)head;
#else
    const float ks = a.k_scale[head], vs = a.v_scale[head];
#endif
    k[static_cast<std::size_t>(i)] = kvp::kernels::kv_to_float(kc[i]) * ks;
    v[static_cast<std::size_t>(i)] = kvp::kernels::kv_to_float(vc[i]) * vs;
  }
  kvp_attention_args f32 = a;
  f32.k_cache = k.data();
  f32.v_cache = v.data();
  run_typed<float>(f32);
}

int run(const kvp_attention_args* a, char* err, size_t err_len) {
  if (!supports(&a->shape) || a->window < 0 || !(a->softcap >= 0.0f)) {
    std::snprintf(err, err_len, "kvproof-cpu: unsupported shape (layout %d, heads %d/%d)", a->shape.kv_layout,
                  a->shape.num_heads, a->shape.num_kv_heads);
    return 1;
  }
  switch (a->shape.kv_dtype) {
    case KVP_KV_F32: run_typed<float>(*a); return 0;
    case KVP_KV_F16: run_typed<kvp::kernels::F16Bits>(*a); return 0;
    case KVP_KV_BF16: run_typed<kvp::kernels::BF16Bits>(*a); return 0;
    case KVP_KV_FP8_E4M3:
    case KVP_KV_FP8_E5M2:
      if (a->k_scale == nullptr || a->v_scale == nullptr) {
        std::snprintf(err, err_len, "kvproof-cpu: an fp8 pool without k_scale/v_scale");
        return 1;
      }
      if (a->shape.kv_dtype == KVP_KV_FP8_E4M3) {
        run_fp8<kvp::kernels::F8E4M3Bits>(*a);
      } else {
        run_fp8<kvp::kernels::F8E5M2Bits>(*a);
      }
      return 0;
    default: std::snprintf(err, err_len, "kvproof-cpu: unknown KV dtype %d", a->shape.kv_dtype); return 1;
  }
}

const kvp_attention_plugin kDescriptor = {
    KVP_ATTENTION_PLUGIN_ABI_VERSION,
#if defined(KVP_PLANT_DROP_SCALES)
    "kvproof-cpu-drop-scales",
#else
    "kvproof-cpu",
#endif
    KVP_DEVICE_HOST,
    KVP_DTYPE_BIT(KVP_KV_F32) | KVP_DTYPE_BIT(KVP_KV_F16) | KVP_DTYPE_BIT(KVP_KV_BF16) |
        KVP_DTYPE_BIT(KVP_KV_FP8_E4M3) | KVP_DTYPE_BIT(KVP_KV_FP8_E5M2),
    KVP_LAYOUT_BIT(KVP_LAYOUT_KVPROOF),
    supports,
    run,
    supports_window,
    supports_softcap,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const kvp_attention_plugin* kvp_attention_plugin_v4(void) {
  return &kDescriptor;
}
