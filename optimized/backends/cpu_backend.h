// CpuBackend: the default model executor. Runs a Llama-family decoder in fp32 over a
// BatchPlan against its own paged KV pool (device blocks) and host pool (swap blocks).
//
// The math is the engine's own (kernels/cpu_attention.h), written independently of the
// reference oracle, and arranged so that non-interference (N1, docs/architecture.md) holds bitwise:
//   - the projections are a GEMM (kernels/gemm.h) whose every output element is one fused
//     multiply-add chain in a fixed order that depends only on in_dim (not on the batch, the
//     tile, the thread or the instruction set), so a token's result does not depend on the
//     other tokens;
//   - every new token's K/V is written into its slot before any attention reads;
//   - attention walks the block table position by position with split points fixed in
//     positions (CpuBackendConfig::attention_partition), never in blocks;
//   - the thread pool splits work so that each output value is computed by exactly one
//     thread in a fixed order: results do not depend on num_threads.
// So a sequence's logits are bitwise the same whatever the block size, block ids, chunking
// of its prefill, batch composition or thread count.
//
// Pools: per layer K and V, each [num_blocks, block_size, num_kv_heads, head_dim] of the pool's
// kv_dtype (f32, f16, bf16, fp8-e4m3, fp8-e5m2: rounded to nearest even when written, fp8
// divided by its layer's KV head's scale first and saturated; read as fp32, times the scale).
// Every type runs the same kernels as the CUDA backend's (kernels/kv_element.h's conversions),
// so the two give the same bits for every KV dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "kernels/cpu_attention.h"
#include "kernels/gemm.h"
#include "model/weights.h"
#include "optimized/backends/backend.h"
#include "optimized/backends/plan_validation.h"
#include "optimized/backends/plugin_attention.h"
#include "optimized/kv/kv_groups.h"

namespace kvp {

struct CpuBackendConfig {
  // The pools: its layers, KV heads and head dim must be the model's; any KV dtype (fp8
  // with its scales); num_device_blocks > 0.
  KvPoolShape pool;
  int num_threads = 1;  // >= 1; results are bitwise independent of it
  // Positions per attention partition. N1 (bitwise equality across schedules) holds for
  // a fixed value; the CUDA backend's split-KV size plays the same role.
  int64_t attention_partition = kernels::kDefaultAttentionPartition;
  // Fill both pools with quiet NaN at construction, so that a read of a slot no one wrote
  // shows up as NaN logits (I7), as a poisoned block does.
  bool nan_fill_at_start = true;
  // The projections' instruction set (kernels/gemm.h); every supported one gives the same
  // bits. Default: the widest this CPU runs (or KVP_GEMM_ISA's).
  kernels::GemmIsa gemm_isa = kernels::gemm_isa();
  // Attention from a plug-in (optimized/backends/plugin_attention.h) instead of kvproof's own
  // kernel; not owned, must outlive the backend. nullptr: kvproof's. A run() failure makes
  // execute() fail after that step's K/V writes (the pools hold the step's new tokens).
  const kvp_attention_plugin* attention_plugin = nullptr;
  // Lay the pools out as the model's KV-cache groups (optimized/kv/kv_groups.h): a block holds
  // group_size layers' K/V, and each layer reads and writes its group's block tables and
  // slots at its slot in the block. Plans then carry those groups (BatchPlan::num_groups).
  // false: one group of every layer (a block holds every layer's K/V).
  bool kv_groups = false;

  Status validate() const;
};

class CpuBackend final : public Backend {
 public:
  // Copies the model's weights. REQUIRES: model.config.validate() and config.validate() are ok
  // (use create() to get those as a Status instead).
  CpuBackend(const Model& model, const CpuBackendConfig& config);
  // Shares the weights (no copy: every engine of one verify reads the same fp32 weights).
  CpuBackend(std::shared_ptr<const Model> model, const CpuBackendConfig& config);
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  // As the constructor; an invalid model config or backend config is an error naming the field.
  static Result<std::unique_ptr<CpuBackend>> create(const Model& model, const CpuBackendConfig& config);
  static Result<std::unique_ptr<CpuBackend>> create(std::shared_ptr<const Model> model, const CpuBackendConfig& config);

  // Validates the whole plan first (array sizes, token ids, positions consistent with the
  // context lengths, block ids and slots inside the pools, op block ids inside their pools);
  // on an error nothing changes (pools and `out` untouched). Then runs the ops in
  // plan_ops.h's order (swap_out, block_copies, poison, swap_in), then the model: per layer
  // every new token's K/V into slot_mapping[t] (kSkipSlot skipped), then attention through
  // the block tables. `out` receives logit_rows_for(plan, i) rows per sequence i.
  // Validation is what memory safety and the plan's shape need; whether the slot mapping
  // agrees with the block tables and who owns which block (I3-I5) are the invariant
  // checkers' business: a plan that breaks them runs, and shows up as wrong or NaN logits.
  // Not reentrant: one execute at a time per backend (it owns one thread pool and scratch).
  Status execute(const BatchPlan& plan, StepOutput& out) override;
  // Blocks whose tenant scope an audit-mode plan had checked (see BatchPlan::block_tenants),
  // summed over every (sequence, block-table entry) attention read.
  int64_t audited_block_reads() const override { return audited_block_reads_; }
  Status read_block(PoolKind pool, int64_t layer, int32_t block, std::vector<float>& k,
                    std::vector<float>& v) const override;
  const char* name() const override { return "cpu"; }
  const KvPoolShape& pool_shape() const override { return config_.pool; }

  const ModelConfig& model_config() const { return model_->config; }
  const CpuBackendConfig& config() const { return config_; }
  int32_t num_device_blocks() const { return config_.pool.num_device_blocks; }
  int32_t num_host_blocks() const { return config_.pool.num_host_blocks; }
  int32_t block_size() const { return config_.pool.block_size; }
  int64_t num_device_slots() const;
  int64_t num_host_slots() const;

 private:
  class ThreadPool;
  struct Scratch;

  int64_t audited_block_reads_ = 0;
  Status attention_status_ = Status::ok();  // the plug-in's first failure in the current step
  void run_ops(const KvPlanOps& ops);
  void run_model(const BatchPlan& plan, StepOutput& out);
  // One layer's steps of run_model: the plan's new K/V into their slots (before any attention
  // reads), and the MLP with its residual add (scratch h, gate, up, proj; x updated).
  void write_new_kv(const BatchPlan& plan, int64_t layer);
  struct LayerGains;
  void mlp(const LayerWeights& w, const LayerGains& g, int64_t n);
  // Y[t, r] = dot(W[r, :], X[t, :]) (+ bias[r] when bias is not empty: one fp32 add after
  // the dot, as the CUDA kernel does) for t < n, r < out_dim, split over rows r.
  void project(const float* w, const VectorF& bias, int64_t out_dim, int64_t in_dim, const float* x, int64_t n,
               float* y);
  // Several projections of the same X in one pass over the threads (one wake-up instead of
  // one each): their rows laid end to end and split as one range.
  struct Projection {
    const float* w;
    const VectorF* bias;
    int64_t out_dim;
    float* y;
  };
  void project_all(std::span<const Projection> ps, int64_t in_dim, const float* x, int64_t n);
  // fn(begin, end) over [0, rows): on the calling thread alone when the pass is under
  // kMinParallelMacs multiply-adds, else split over the pool's threads.
  void split_rows(int64_t rows, int64_t macs, const std::function<void(int64_t, int64_t)>& fn);
  void attention(const BatchPlan& plan, int64_t layer, const float* q, float* out);

  // Elements and bytes of one block of one layer's K (or V) pool.
  int64_t elements_per_block() const;
  std::size_t bytes_per_block() const;
  // The layer's fp8 scales (num_kv_heads each), or null for the other dtypes.
  const float* k_scales_of(int64_t layer) const;
  const float* v_scales_of(int64_t layer) const;

  std::shared_ptr<const Model> model_;
  CpuBackendConfig config_;
  std::vector<float> inv_freq_;        // [head_dim / 2]
  std::vector<float> local_inv_freq_;  // Gemma 3's sliding layers' (rope_local_inv_freq), or empty
  // Every norm's gain (norm_gain: Gemma's 1 + w), per layer: input, post-attention, Gemma's
  // pre- and post-feedforward and q/k norms (empty elsewhere); then the final norm's.
  struct LayerGains {
    VectorF input, post_attention, pre_feedforward, post_feedforward, q_norm, k_norm;
  };
  std::vector<LayerGains> gains_;
  VectorF final_gain_;
  // Per layer K and V pools, raw elements of config_.pool.kv_dtype.
  // One K and one V array per slot of a block (the layout's group_size: every layer without
  // KV-cache groups); layer l's are at layout_.layer_slot[l].
  std::vector<std::vector<std::byte>> device_k_, device_v_, host_k_, host_v_;
  KvGroupLayout layout_;
  PlanLimits limits_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace kvp
