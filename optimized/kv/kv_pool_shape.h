// KvPoolShape: the one description of a KV pool, shared by the KV-cache manager's config
// (which uses the block counts and block size) and every backend's config (which also lays
// out the per-layer K/V arrays). The engine refuses, at construction, a backend whose pool
// shape differs from its manager's, so block ids and slots mean the same thing on both sides.
//
// Layout every backend keeps: per layer, K and V each
// [num_blocks, block_size, num_kv_heads, head_dim] of kv_dtype, for the device pool
// (num_device_blocks) and the host swap pool (num_host_blocks).
#pragma once

#include <cstdint>
#include <string>

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

  // Elements (of kv_dtype) of one block of K (or V) in one layer.
  int64_t elements_per_block() const { return static_cast<int64_t>(block_size) * num_kv_heads * head_dim; }
  int64_t num_device_slots() const { return static_cast<int64_t>(num_device_blocks) * block_size; }
  int64_t num_host_slots() const { return static_cast<int64_t>(num_host_blocks) * block_size; }

  // Counts >= 0, block_size > 0; an error names the field.
  Status validate() const;
  // As validate(), and the model dimensions and the device pool are positive: what a
  // backend needs to lay out memory.
  Status validate_for_backend() const;
  // "layers 2, kv heads 2, head dim 16, block size 4, device blocks 48, host blocks 24, f32"
  std::string to_string() const;

  friend bool operator==(const KvPoolShape&, const KvPoolShape&) = default;
};

}  // namespace kvp
