// The CUDA backend: the model executor on CUDA kernels (kernels/cuda/model_kernels.cu), in two
// flavours from one source (cuda_backend.cc), both in one program:
//   CudaFlavour::kEmulated, "cuda-emu": the kernels run on the CPU through the SIMT emulation
//     layer; in every build.
//   CudaFlavour::kDevice, "cuda": the nvcc-built kernels on a GPU, through the CUDA runtime
//     linked statically (the driver, libcuda, is loaded at the first call); built when CMake
//     finds nvcc (KVPROOF_HAS_CUDA), else make_cuda_backend says the program was built
//     without CUDA. A program without a GPU or driver starts and runs the other backends.
// The two flavours' classes are kvp::cuda_backend::emu::CudaBackend and ...::dev::CudaBackend
// (cuda_backend.cc, compiled once per flavour); callers see the Backend interface only.
//
// Same contract and same arithmetic as CpuBackend: every output element is reduced in
// kernels/cpu_attention.h's order, attention partitions are fixed in positions and merged in
// order, so a sequence's logits do not depend on the block size, block ids, chunking or
// batch (N1). With an fp32 pool the emulated flavour gives CpuBackend's bits; the GPU flavour
// may differ from it in the last bits (FMA contraction, the device's expf) but not from itself.
// execute: validate_plan and check_plan_read_scope first (nothing changes on an error), then
// the ops (swap_out, block_copies, poison, swap_in), then the model; a CUDA error is a Status
// naming the call or kernel.
//
// Memory: weights (fp32, or bf16 with weight_dtype), the device KV pool and activations in device memory; the host
// (swap) pool in pinned host memory; pools of pool.kv_dtype (f32, f16, bf16, fp8-e4m3 or fp8-e5m2: K/V rounded to it
// when written, read as fp32; fp8 divided by the pool's per-layer, per-KV- head scale when written and multiplied by it
// when read), per layer K and V, each [num_blocks, block_size, num_kv_heads, head_dim].
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "kernels/cpu_attention.h"
#include "kvproof/attention_plugin.h"
#include "model/weights.h"
#include "optimized/backends/backend.h"

namespace kvp {

struct CudaBackendConfig {
  KvPoolShape pool;  // the model's layers, KV heads, head dim; kv_dtype f32, f16, bf16 or fp8 (+ scales)
  // Positions per attention partition (the split-KV size); fixed, never a number of splits.
  int64_t attention_partition = kernels::kDefaultAttentionPartition;
  bool nan_fill_at_start = true;  // both pools start as quiet NaN
  // Attention from a plug-in (optimized/backends/plugin_attention.h) instead of kvproof's kernel;
  // not owned, must outlive the backend; nullptr: kvproof's. The emulated flavour runs host
  // plug-ins (its device memory is host memory), the device flavour CUDA ones, each over the
  // pools' kv_dtype in the kvproof layout. A run() failure fails that step's execute().
  const kvp_attention_plugin* attention_plugin = nullptr;
  PlantedAttentionBug planted = PlantedAttentionBug::kNone;
  // The weight matrices' (and embedding table's) element type in device memory: kF32, or kBF16
  // (half the bytes; each element widened to fp32 exactly as a kernel reads it, so the bits of
  // kF32 weights of the same values). kBF16 REQUIRES every matrix value to be a bf16 value
  // (round_weights_to_bf16): create() refuses one that is not, naming the tensor, rather than
  // run on values the reference does not have. Norms and biases stay fp32.
  DType weight_dtype = DType::kF32;
  // CUDA graphs for decode steps (every sequence one new token and its logits, no attention
  // plug-in): such a step of n tokens runs padded to graph_tokens(n) tokens (1, 2, 4, 8, then
  // multiples of 8; the padded tokens write no slot and their rows are dropped) by replaying
  // a graph captured once per (padded tokens, block-table width, attention partitions), the
  // last two rounded up to powers of two. 0: every step eager. The emulated flavour captures
  // and replays too (kernels/simt/runtime.h), so CI runs the graph path.
  int64_t max_graph_tokens = 64;
  // The pools laid out as the model's KV-cache groups (CpuBackendConfig::kv_groups): a block
  // holds group_size layers' K/V, each layer's kernels take its group's table rows and slots.
  bool kv_groups = false;

  Status validate() const;
};

enum class CudaFlavour { kEmulated, kDevice };

// The padded token count a decode step of n tokens is replayed at: 1, 2, 4, 8, then the next
// multiple of 8 (vLLM's capture sizes), at most max_graph_tokens; 0 when n is over it.
int64_t graph_tokens(int64_t n, int64_t max_graph_tokens);

// Whether the kDevice flavour can run here: ok, or "this kvproof was built without CUDA ..."
// or "no CUDA device: ..." (no GPU, or no driver). The emulated flavour always can.
Status cuda_device_status();

// Errors: invalid configs, a head shape the attention kernel does not take, what
// cuda_device_status says (kDevice), a failed allocation or upload.
Result<std::unique_ptr<Backend>> make_cuda_backend(CudaFlavour flavour, const Model& model,
                                                   const CudaBackendConfig& config);

// Each flavour's entry points, defined by cuda_backend.cc compiled in that flavour (dev only
// when KVPROOF_HAS_CUDA); call make_cuda_backend and cuda_device_status instead.
namespace cuda_backend {
namespace emu {
Result<std::unique_ptr<Backend>> create(const Model& model, const CudaBackendConfig& config);
Status device_status();
}  // namespace emu
namespace dev {
Result<std::unique_ptr<Backend>> create(const Model& model, const CudaBackendConfig& config);
Status device_status();
}  // namespace dev
}  // namespace cuda_backend

}  // namespace kvp
