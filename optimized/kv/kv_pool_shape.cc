#include "optimized/kv/kv_pool_shape.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "kernels/kv_element.h"

namespace kvp {

Status KvPoolShape::validate() const {
  if (num_layers < 0) return Status::error("num_layers must be >= 0");
  if (num_kv_heads < 0) return Status::error("num_kv_heads must be >= 0");
  if (head_dim < 0) return Status::error("head_dim must be >= 0");
  if (block_size <= 0) return Status::error("block_size must be > 0");
  if (num_device_blocks < 0) return Status::error("num_device_blocks must be >= 0");
  if (num_host_blocks < 0) return Status::error("num_host_blocks must be >= 0");
  return validate_scales();
}

Status KvPoolShape::validate_scales() const {
  if (!is_fp8(kv_dtype)) {
    if (!k_scales.empty() || !v_scales.empty())
      return Status::error("KV scales are for fp8 pools; this pool is " + std::string(dtype_flag_name(kv_dtype)));
    return Status::ok();
  }
  const int64_t want = static_cast<int64_t>(num_layers) * num_kv_heads;
  for (const auto& [name, s] : {std::pair{"k_scales", &k_scales}, std::pair{"v_scales", &v_scales}}) {
    if (static_cast<int64_t>(s->size()) != want)
      return Status::error(std::string(name) + " has " + std::to_string(s->size()) +
                           " entries, expected layers x kv heads = " + std::to_string(want) +
                           " (an fp8 pool needs a scale per layer and KV head)");
    for (std::size_t i = 0; i < s->size(); ++i) {
      const float x = (*s)[i];
      if (!(x > 0.0f) || !std::isfinite(x))
        return Status::error(std::string(name) + "[layer " +
                             std::to_string(static_cast<int64_t>(i) / std::max(num_kv_heads, 1)) + ", kv head " +
                             std::to_string(static_cast<int64_t>(i) % std::max(num_kv_heads, 1)) +
                             "] = " + std::to_string(x) + ": a scale must be finite and > 0");
    }
  }
  return Status::ok();
}

Status KvPoolShape::validate_for_backend() const {
  KVP_RETURN_IF_ERROR(validate());
  if (num_layers <= 0) return Status::error("num_layers must be > 0");
  if (num_kv_heads <= 0) return Status::error("num_kv_heads must be > 0");
  if (head_dim <= 0) return Status::error("head_dim must be > 0");
  if (num_device_blocks <= 0) return Status::error("num_device_blocks must be > 0");
  return Status::ok();
}

void KvPoolShape::block_to_float(int64_t layer, bool is_k, const std::byte* raw, std::vector<float>& out) const {
  const std::size_t element = dtype_size(kv_dtype);
  out.resize(static_cast<std::size_t>(elements_per_block()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int64_t head = static_cast<int64_t>(i) / head_dim % num_kv_heads;
    const float s = is_k ? k_scale(layer, head) : v_scale(layer, head);
    out[i] = kernels::kv_element_to_float(kv_dtype, raw + i * element) * s;
  }
}

std::string KvPoolShape::to_string() const {
  return "layers " + std::to_string(num_layers) + ", kv heads " + std::to_string(num_kv_heads) + ", head dim " +
         std::to_string(head_dim) + ", block size " + std::to_string(block_size) + ", device blocks " +
         std::to_string(num_device_blocks) + ", host blocks " + std::to_string(num_host_blocks) + ", " +
         std::string(dtype_name(kv_dtype)) + scales_string();
}

std::string KvPoolShape::scales_string() const {
  if (k_scales.empty() && v_scales.empty()) return "";
  const auto range = [](const std::vector<float>& s) {
    if (s.empty()) return std::string("none");
    const auto [lo, hi] = std::minmax_element(s.begin(), s.end());
    char buf[64];
    std::snprintf(buf, sizeof buf, "[%.4g, %.4g]", static_cast<double>(*lo), static_cast<double>(*hi));
    return std::string(buf);
  };
  return ", K scales " + range(k_scales) + ", V scales " + range(v_scales);
}

}  // namespace kvp
