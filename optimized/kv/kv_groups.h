// KvGroupLayout: how a model's layers share the paged KV pool as KV-cache groups (vLLM v1's
// hybrid allocator, "uniform page size": vllm/v1/core/kv_cache_utils.py).
//
// Layers of one attention type (full, or one sliding window) are cut, in layer order, into
// groups of group_size layers, group_size being the smallest type's layer count: Gemma 3
// 270M (18 layers, every sixth full) has 3 full and 15 sliding layers, so 6 groups of 3 (one
// full, five sliding); a type whose count group_size does not divide ends in a smaller group.
// A pool block holds group_size layers' K and V of block_size positions, so every block is the
// same size whichever group's table holds it, and a layer's K/V live in its group's blocks at
// its slot (its index within the group). Each group has its own block table per sequence
// (KvCacheManager): a sliding group releases what its window has left behind, a full group
// keeps everything. A model whose layers are all of one type has one group of all its layers:
// the layout every backend had before groups.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace kvp {

struct KvGroupLayout {
  std::vector<int64_t> group_windows;  // per group: its layers' window (0: full attention)
  std::vector<int32_t> layer_group;    // per model layer: its group
  std::vector<int32_t> layer_slot;     // per model layer: its K/V array within a pool block
  int32_t group_size = 0;              // layers per group: K/V arrays per pool block

  int64_t num_groups() const { return static_cast<int64_t>(group_windows.size()); }
  // KvCacheConfig::group_windows for this layout: empty for one group (its window is then
  // KvCacheConfig::sliding_window).
  std::vector<int64_t> manager_group_windows() const {
    return num_groups() == 1 ? std::vector<int64_t>{} : group_windows;
  }
  // "6 groups of 3 layers: 1 full, 5 with window 512"
  std::string to_string() const;
};

// The layout of a model whose layer l attends through layer_windows[l] (0: full attention):
// one group of every layer when all windows are equal (its window that one), else the types
// cut into groups as above. REQUIRES: layer_windows not empty.
KvGroupLayout kv_group_layout(const std::vector<int64_t>& layer_windows);
// One group of every layer for a model without hybrid layers (its window: kv_window()); for
// a hybrid model, its layer types cut into groups as above.
KvGroupLayout kv_group_layout(const ModelConfig& model);
// kv_group_layout(model) when `groups`, else one group of every layer (window kv_window()):
// the layout a backend lays its pool out by (CpuBackendConfig::kv_groups).
KvGroupLayout kv_group_layout(const ModelConfig& model, bool groups);

}  // namespace kvp
