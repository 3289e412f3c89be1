// KvPoolShape: the one description of a KV pool, shared by the KV-cache manager's config
// (which uses the block counts and block size) and every backend's config (which also lays
// out the per-layer K/V arrays). The engine refuses, at construction, a backend whose pool
// shape differs from its manager's, so block ids and slots mean the same thing on both sides.
//
// Layout every backend keeps: per layer, K and V each
// [num_blocks, block_size, num_kv_heads, head_dim] of kv_dtype, for the device pool
// (num_device_blocks) and the host swap pool (num_host_blocks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kvp {

struct KvPoolShape {
  int32_t num_layers = 0;    // 0 where no model is attached (the manager alone)
  int32_t num_kv_heads = 0;  // 0 likewise
  int32_t head_dim = 0;      // 0 likewise
  int32_t block_size = 16;   // token slots per block; > 0
  int32_t num_device_blocks = 0;
  int32_t num_host_blocks = 0;
  DType kv_dtype = DType::kF32;
  // fp8 pools' dequantisation scales, [num_layers][num_kv_heads] row-major, K and V apart: a
  // layer's KV head stores x as fp8(x / scale) and reads code * scale. A per-tensor scale is
  // the same value on every head of its layer. Required (and > 0, finite) for an fp8 pool,
  // empty for any other: scales belong to the pool's shape, so the engine's manager and its
  // backend must agree on them, and the plan validator checks them at every step.
  std::vector<float> k_scales, v_scales;

  // Elements (of kv_dtype) of one block of K (or V) in one layer.
  int64_t elements_per_block() const { return static_cast<int64_t>(block_size) * num_kv_heads * head_dim; }
  // One block of one layer's K (is_k) or V pool, raw elements of kv_dtype, as fp32 (exact from
  // every KV type) times the KV head's scale (fp8): what attention reads. `out` gets
  // elements_per_block() values. Both backends' read_block use it.
  void block_to_float(int64_t layer, bool is_k, const std::byte* raw, std::vector<float>& out) const;
  int64_t num_device_slots() const { return static_cast<int64_t>(num_device_blocks) * block_size; }
  int64_t num_host_slots() const { return static_cast<int64_t>(num_host_blocks) * block_size; }

  // Counts >= 0, block_size > 0; an error names the field.
  Status validate() const;
  // As validate(), and the model dimensions and the device pool are positive: what a
  // backend needs to lay out memory.
  Status validate_for_backend() const;
  // What is wrong with the scales for kv_dtype (see k_scales), naming the first bad entry.
  Status validate_scales() const;
  // The scale of a layer's KV head; 1 for a pool without scales.
  float k_scale(int64_t layer, int64_t kv_head) const { return scale_of(k_scales, layer, kv_head); }
  float v_scale(int64_t layer, int64_t kv_head) const { return scale_of(v_scales, layer, kv_head); }
  // "layers 2, kv heads 2, head dim 16, block size 4, device blocks 48, host blocks 24, f32"
  // (fp8 pools: ", K scales [min, max], V scales [min, max]")
  std::string to_string() const;

  friend bool operator==(const KvPoolShape&, const KvPoolShape&) = default;

 private:
  std::string scales_string() const;
  float scale_of(const std::vector<float>& s, int64_t layer, int64_t kv_head) const {
    return s.empty() ? 1.0f : s[static_cast<std::size_t>(layer * num_kv_heads + kv_head)];
  }
};

}  // namespace kvp
