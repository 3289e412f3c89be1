// The cost model behind `kvproof simulate`: public model shapes, GPU datasheet numbers, and
// one roofline formula for the time of one engine step. No math runs; a step costs what the
// plan's arithmetic and memory traffic would cost on the named GPU.
//
// The formula (docs/simulate.md repeats it; every constant is a named field below):
//
//   flops(step)   = 2 * P * T  +  4 * Hq * D * sum_layers sum_t (positions t attends to)
//                   (weights: one multiply-add per parameter per new token; attention: QK^T
//                    and AV over the causal context of every new token t: pos_t + 1, or at
//                    most the window in a windowed layer)
//   bytes(step)   = W  +  kv_bytes_per_layer_token * sum_layers (sum_i context_i + T)
//                   (weights read once per step, every sequence's K/V read once per layer,
//                    a windowed layer from its first new token's window on, the T new
//                    tokens' K/V written)
//   compute_s     = flops / (peak_bf16_flops * compute_efficiency)
//   memory_s      = bytes / (memory_bandwidth * bandwidth_efficiency)
//   step_s        = max(compute_s, memory_s) + step_overhead_s
//                 + copy_blocks * block_bytes * 2 / (memory_bandwidth * bandwidth_efficiency)
//                 + swap_blocks * block_bytes / (host_link_bandwidth * bandwidth_efficiency)
//
// with P parameters, W = P * weight_bytes_per_param, T new tokens in the plan, L layers, Hq
// query heads, D head dim, kv_bytes_per_token = 2 * L * Hkv * D * kv_bytes_per_element, and
// block_bytes = block_size * kv_bytes_per_token (with KV-cache groups, a block holds
// kv_layers_per_block layers of L: that share of it). A prefill-heavy step is compute bound, a
// decode step memory bound: the larger of the two is the step's time.
//
// KV pool: kv_pool_bytes = memory * gpu_memory_utilization - W - activation_reserve_bytes;
// the device pool has floor(kv_pool_bytes / block_bytes) blocks; the host (swap) pool
// floor(host_swap_bytes / block_bytes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "optimized/backends/batch_plan.h"
#include "optimized/kv/kv_groups.h"

namespace kvp {

// A decoder-only transformer's public shape (Hugging Face config.json) and size.
struct ModelSpec {
  std::string name;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double num_parameters = 0;  // as published on the model card
  // Every layer's sliding window (config.json's sliding_window; 0: full attention). The
  // engine releases the blocks behind it (KvCacheConfig::sliding_window) and attention reads
  // at most the window.
  int64_t sliding_window = 0;
  // A hybrid's layers that attend to everything beside the windowed ones (Gemma 3's global
  // layers, one in six); 0: every layer through sliding_window. With one block table per
  // sequence a hybrid keeps every block (its full layers read them, kv_window() is 0); with
  // KV-cache groups (kv_groups(true)) its windowed groups release theirs.
  int64_t full_attention_layers = 0;

  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // The window the KV manager may release blocks behind: every layer's, or none.
  int64_t kv_window() const { return full_attention_layers == 0 ? sliding_window : 0; }
  // Layers attending through the window, and to everything.
  int64_t windowed_layers() const { return sliding_window > 0 ? num_layers - full_attention_layers : 0; }
  // Per layer, its window (0: full attention). A hybrid's full layers are every (L / F)-th,
  // from layer L / F - 1 on: Gemma 3's one in six (layers 5, 11, ...); only the counts
  // matter to the KV-cache groups below.
  std::vector<int64_t> layer_windows() const;
  // The KV-cache groups (KvGroupLayout): with `groups`, a hybrid's windowed and full layers
  // cut into groups as vLLM's hybrid allocator does; otherwise, or for a model of one kind,
  // one group of every layer with window kv_window().
  KvGroupLayout kv_groups(bool groups) const;
};

// A GPU's datasheet numbers (dense bf16 Tensor Core rate, no sparsity).
struct GpuSpec {
  std::string name;
  double memory_bytes = 0;
  double memory_bandwidth = 0;     // bytes/s (HBM)
  double peak_bf16_flops = 0;      // FLOP/s
  double host_link_bandwidth = 0;  // bytes/s, one direction (PCIe)
};

// The presets. Names are case-insensitive: llama-2-7b, llama-2-13b, llama-3-8b, mistral-7b,
// qwen2.5-7b, gemma-3-1b, gemma-3-27b; a100-40gb, a100-80gb, h100-80gb, h200-141gb (aliases a100, h100, h200).
std::vector<ModelSpec> model_presets();
std::vector<GpuSpec> gpu_presets();
Result<ModelSpec> find_model_preset(const std::string& name);
Result<GpuSpec> find_gpu_preset(const std::string& name);

struct CostModelConfig {
  ModelSpec model;
  GpuSpec gpu;
  double weight_bytes_per_param = 2;  // bf16 weights
  double kv_bytes_per_element = 2;    // bf16 KV cache
  // Fractions of the datasheet peaks a serving engine reaches: large GEMMs reach about half
  // the dense Tensor Core peak; streaming reads about 80% of HBM and PCIe peak.
  double compute_efficiency = 0.5;
  double bandwidth_efficiency = 0.8;
  // Per step: scheduling, sampling, kernel launches (a CUDA-graph decode step's floor).
  double step_overhead_s = 0.002;
  // GPU memory the engine may use (vLLM's gpu_memory_utilization default).
  double gpu_memory_utilization = 0.9;
  // Activations, CUDA graphs and allocator slack kept out of the KV pool.
  double activation_reserve_bytes = 2.0 * (1ull << 30);
  // Host memory for swapped-out blocks (vLLM's swap_space default, 4 GiB).
  double host_swap_bytes = 4.0 * (1ull << 30);
  // Layers whose K and V one pool block holds: KvGroupLayout::group_size with KV-cache
  // groups; 0: every layer (one block table per sequence).
  int64_t kv_layers_per_block = 0;

  // Every number positive and finite, fractions in (0, 1]; an error names the field.
  Status validate() const;

  double weight_bytes() const { return model.num_parameters * weight_bytes_per_param; }
  double kv_bytes_per_token() const {
    return 2.0 * static_cast<double>(model.num_layers * model.kv_dim()) * kv_bytes_per_element;
  }
  // GPU memory * utilization - weights - activation reserve (may be <= 0: the model does
  // not fit).
  double kv_pool_bytes() const {
    return gpu.memory_bytes * gpu_memory_utilization - weight_bytes() - activation_reserve_bytes;
  }
  // One pool block's bytes: block_size positions of kv_layers_per_block layers (or all).
  double kv_block_bytes(int32_t block_size) const {
    const int64_t layers = kv_layers_per_block > 0 ? kv_layers_per_block : model.num_layers;
    return 2.0 * static_cast<double>(layers * model.kv_dim()) * kv_bytes_per_element * block_size;
  }
  int64_t num_device_blocks(int32_t block_size) const;
  int64_t num_host_blocks(int32_t block_size) const;
};

// What one plan costs.
struct StepCost {
  double flops = 0;
  double bytes = 0;
  double compute_s = 0;
  double memory_s = 0;
  double transfer_s = 0;  // block copies and swaps
  double total_s = 0;     // max(compute_s, memory_s) + overhead + transfer_s
  bool compute_bound() const { return compute_s > memory_s; }
};

// The formula above for one plan. REQUIRES: the plan is valid (validate_plan).
StepCost step_cost(const CostModelConfig& c, const BatchPlan& plan, int32_t block_size);

}  // namespace kvp
