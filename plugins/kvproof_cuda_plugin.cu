// kvproof's CUDA paged attention (kernels/cuda/model_kernels.cu: one thread block per (token,
// KV head, partition), then the partitions merged in order) as a CUDA attention plug-in: the
// kvproof layout, f32/f16/bf16/fp8 pools (ABI version 2: fp8 scaled per KV head), every shape check_attention_shape
// accepts (supports() asks it), every sliding window (version 3: the partitions wholly before
// a window are not launched into, their blocks never read), every score soft-cap (version 4).
// The kernels are compiled into this library by nvcc (sm_80,
// sm_90).
//
// Streams: the kernels launch on the default stream and run() synchronises the device before
// it returns, so the work is done whatever stream the harness passed (the ABI lets a plug-in
// finish early; it must not finish late).
#include <cstdio>
#include <string>

#include "kernels/cuda/model_kernels.cu"  // NOLINT(bugprone-suspicious-include): the kernels, built here
#include "kvproof/attention_plugin.h"

namespace {

namespace ck = kvp::cuda_kernels::dev;

bool dtype_of(int32_t kv_dtype, kvp::DType& out) {
  switch (kv_dtype) {
    case KVP_KV_F32: out = kvp::DType::kF32; return true;
    case KVP_KV_F16: out = kvp::DType::kF16; return true;
    case KVP_KV_BF16: out = kvp::DType::kBF16; return true;
    case KVP_KV_FP8_E4M3: out = kvp::DType::kF8E4M3; return true;
    case KVP_KV_FP8_E5M2: out = kvp::DType::kF8E5M2; return true;
    default: return false;
  }
}

int supports(const kvp_attention_shape* s) {
  kvp::DType dtype;
  return s->kv_layout == KVP_LAYOUT_KVPROOF && dtype_of(s->kv_dtype, dtype) &&
         ck::check_attention_shape(s->num_heads, s->num_kv_heads, s->head_dim).empty();
}

int supports_window(const kvp_attention_shape* s, int32_t window) { return supports(s) && window > 0; }

int supports_softcap(const kvp_attention_shape* s, float softcap) { return supports(s) && softcap > 0.0f; }

int run(const kvp_attention_args* a, char* err, size_t err_len) {
  const kvp_attention_shape& s = a->shape;
  kvp::DType dtype;
  if (s.kv_layout != KVP_LAYOUT_KVPROOF || !dtype_of(s.kv_dtype, dtype)) {
    std::snprintf(err, err_len, "kvproof-cuda: layout %d or KV dtype %d not taken", s.kv_layout, s.kv_dtype);
    return 1;
  }
  if (kvp::is_fp8(dtype) && (a->k_scale == nullptr || a->v_scale == nullptr)) {
    std::snprintf(err, err_len, "kvproof-cuda: an fp8 pool without k_scale/v_scale");
    return 1;
  }
  const int64_t partition = kvp::kernels::kDefaultAttentionPartition;
  // Partitions for the longest context; a token with fewer positions skips the rest.
  const int64_t parts = ck::attention_partitions(s.max_context_len > 0 ? s.max_context_len - 1 : 0, partition);
  void* workspace = nullptr;
  std::string e = ck::device_alloc(
      &workspace,
      static_cast<std::size_t>(ck::attention_workspace_floats(s.num_tokens, s.num_heads, s.head_dim, parts)) * 4);
  if (e.empty())
    e = ck::attention(a->query, dtype, a->k_cache, a->v_cache, a->block_tables, s.max_blocks_per_seq, a->token_seq,
                      a->positions, s.num_tokens, s.num_heads, s.num_kv_heads, s.head_dim, s.block_size, a->scale,
                      partition, parts, static_cast<float*>(workspace), a->out, a->k_scale, a->v_scale,
                      ck::AttentionVariant::kExact, a->window, a->softcap);
  if (e.empty()) e = ck::synchronize();
  ck::device_free(workspace);
  if (!e.empty()) {
    std::snprintf(err, err_len, "kvproof-cuda: %s", e.c_str());
    return 1;
  }
  return 0;
}

const kvp_attention_plugin kDescriptor = {
    KVP_ATTENTION_PLUGIN_ABI_VERSION,
    "kvproof-cuda",
    KVP_DEVICE_CUDA,
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
