// The one place a backend is chosen and made: BackendKind names the model executors this
// program has (cpu, cuda-emu, cuda), make_backend builds one over a pool. verify, audit and
// generate all come here; nothing else compares backend names.
#pragma once

#include <array>
#include <memory>
#include <string_view>

#include "common/dtype.h"
#include "common/status.h"
#include "kvproof/attention_plugin.h"
#include "model/weights.h"
#include "optimized/backends/backend.h"

namespace kvp {

enum class BackendKind {
  kCpu,      // CpuBackend (cpu_backend.h)
  kCudaEmu,  // the CUDA backend's kernels on the CPU through the SIMT emulation
  kCuda,     // the CUDA backend on a GPU ("no CUDA device" without one)
};
inline constexpr std::array<BackendKind, 3> kBackendKinds = {BackendKind::kCpu, BackendKind::kCudaEmu,
                                                             BackendKind::kCuda};

// "cpu", "cuda-emu", "cuda": the --backend flag's spelling.
const char* backend_name(BackendKind kind);
// The kind `name` spells; an error names it and the names there are.
Result<BackendKind> parse_backend_kind(std::string_view name);
// The memory an attention plug-in for `kind` works in (a kvp_device): host for cpu and
// cuda-emu (emulated device memory is host memory), CUDA for cuda.
int32_t plugin_device_for(BackendKind kind);
// Whether `kind` can run here: ok, or why not (cuda: no device, or a build without CUDA).
Status backend_runs_here(BackendKind kind);

struct BackendSpec {
  BackendKind kind = BackendKind::kCpu;
  // The pools: the model's layers, KV heads and head dim; kv_dtype f32, f16, bf16,
  // fp8-e4m3 or fp8-e5m2 with its scales (every backend).
  KvPoolShape pool;
  int num_threads = 1;  // the cpu backend's threads; results do not depend on it
  // The attention from this plug-in (not owned, must outlive the backend); nullptr: kvproof's
  // kernel. It must be for plugin_device_for(kind) and take the pool's kv_dtype.
  const kvp_attention_plugin* attention_plugin = nullptr;
  // A planted bug in the CUDA backends' attention kernel (tests; kNone for any real run).
  PlantedAttentionBug planted = PlantedAttentionBug::kNone;
  // The CUDA backends' weight storage (CudaBackendConfig::weight_dtype): kF32, or kBF16 for a
  // model whose matrices are bf16 values (round_weights_to_bf16). The cpu backend computes
  // with the model's fp32 values whatever this says (the same values, widened).
  DType weight_dtype = DType::kF32;
  // The CUDA backends' decode graphs (CudaBackendConfig::max_graph_tokens; 0: eager).
  int64_t max_graph_tokens = 64;
  // The pool laid out as the model's KV-cache groups (CpuBackendConfig::kv_groups): only
  // where backend_has_kv_groups(kind).
  bool kv_groups = false;
};

// Whether the backend lays its pool out as KV-cache groups (optimized/kv/kv_groups.h): every
// backend does (cpu, cuda-emu, cuda).
bool backend_has_kv_groups(BackendKind kind);

// The backend `spec` describes, reading `model`'s weights: the cpu backend in place (no copy;
// a verify builds several engines over one model), the CUDA ones uploaded.
// REQUIRES: model outlives the backend.
// Errors: what the backend's config validation says (naming the backend), a plug-in that
// does not fit, what backend_runs_here says.
Result<std::unique_ptr<Backend>> make_backend(const BackendSpec& spec, const Model& model);

}  // namespace kvp
