// CudaBackend: the model executor on CUDA kernels (kernels/cuda/model_kernels.cu), in two
// flavours from one source: "cuda-emu" (kernels run on the CPU through the SIMT emulation
// layer; library kvp_cuda_emu_backend, always built) and "cuda" (nvcc-built kernels on a
// GPU; library kvp_cuda_dev_backend, built when KVPROOF_HAS_CUDA). A program links one
// flavour (see kernels/cuda/model_kernels.h).
//
// Same contract and same arithmetic as CpuBackend: every output element is reduced in
// kernels/cpu_attention.h's order, attention partitions are fixed in positions and merged in
// order, so a sequence's logits do not depend on the block size, block ids, chunking or
// batch (N1). With an fp32 pool the emulated flavour gives CpuBackend's bits; the GPU flavour
// may differ from it in the last bits (FMA contraction, the device's expf) but not from itself.
//
// Memory: weights, the device KV pool and activations in device memory; the host (swap)
// pool in pinned host memory; pools of pool.kv_dtype (f32, f16 or bf16: K/V rounded to it
// when written, read as fp32), per layer K and V, each
// [num_blocks, block_size, num_kv_heads, head_dim].
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/cpu_attention.h"
#include "model/weights.h"
#include "optimized/backends/backend.h"

namespace kvp {

struct CudaBackendConfig {
  KvPoolShape pool;  // the model's layers, KV heads, head dim; kv_dtype f32, f16 or bf16
  // Positions per attention partition (the split-KV size); fixed, never a number of splits.
  int64_t attention_partition = kernels::kDefaultAttentionPartition;
  bool nan_fill_at_start = true;  // both pools start as quiet NaN

  Status validate() const;
};

class CudaBackend final : public Backend {
 public:
  // Errors: invalid configs, a head shape the attention kernel does not take, no CUDA device ("cuda"
  // flavour), a failed allocation or upload.
  static Result<std::unique_ptr<CudaBackend>> create(const Model& model, const CudaBackendConfig& config);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // validate_plan and check_plan_read_scope first (nothing changes on an error), then the
  // ops (swap_out, block_copies, poison, swap_in), then the model. A CUDA error is a Status
  // naming the call or kernel.
  Status execute(const BatchPlan& plan, StepOutput& out) override;
  const char* name() const override;
  const KvPoolShape& pool_shape() const override { return config_.pool; }
  Status read_block(PoolKind pool, int64_t layer, int32_t block, std::vector<float>& k,
                    std::vector<float>& v) const override;
  int64_t audited_block_reads() const override { return audited_block_reads_; }

 private:
  struct Device;
  CudaBackend(const Model& model, const CudaBackendConfig& config);
  Status init();
  Status run_ops(const KvPlanOps& ops);
  Status run_model(const BatchPlan& plan, StepOutput& out);

  ModelConfig model_config_;
  const Model* model_for_init_ = nullptr;  // only during create()
  CudaBackendConfig config_;
  int64_t audited_block_reads_ = 0;
  std::unique_ptr<Device> dev_;
};

}  // namespace kvp
