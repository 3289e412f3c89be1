#include "optimized/backends/backend_factory.h"

#include <string>

#include "optimized/backends/cpu_backend.h"
#include "optimized/backends/cuda_backend.h"

namespace kvp {

const char* backend_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCudaEmu: return "cuda-emu";
    case BackendKind::kCuda: return "cuda";
  }
  return "?";
}

Result<BackendKind> parse_backend_kind(std::string_view name) {
  std::string names;
  for (const BackendKind k : kBackendKinds) {
    if (name == backend_name(k)) return k;
    names += std::string(names.empty() ? "" : ", ") + backend_name(k);
  }
  return Status::error("unknown backend '" + std::string(name) + "' (" + names + ")");
}

int32_t plugin_device_for(BackendKind kind) { return kind == BackendKind::kCuda ? KVP_DEVICE_CUDA : KVP_DEVICE_HOST; }

Status backend_runs_here(BackendKind kind) { return kind == BackendKind::kCuda ? cuda_device_status() : Status::ok(); }

bool backend_has_kv_groups(BackendKind /*kind*/) { return true; }

Result<std::unique_ptr<Backend>> make_backend(const BackendSpec& spec, const Model& model) {
  if (spec.kv_groups && !backend_has_kv_groups(spec.kind))
    return Status::error(std::string(backend_name(spec.kind)) + " backend: no KV-cache groups yet");
  if (spec.kind == BackendKind::kCpu) {
    if (spec.planted != PlantedAttentionBug::kNone)
      return Status::error("cpu backend: planted attention bugs live in the CUDA backends' kernel");
    CpuBackendConfig bc;
    bc.pool = spec.pool;
    bc.num_threads = spec.num_threads;
    bc.attention_plugin = spec.attention_plugin;
    bc.kv_groups = spec.kv_groups;
    // An aliasing shared_ptr that owns nothing: the backend reads the caller's weights.
    auto backend = CpuBackend::create(std::shared_ptr<const Model>(std::shared_ptr<const Model>(), &model), bc);
    if (!backend) return backend.status();
    return std::unique_ptr<Backend>(std::move(*backend));
  }
  CudaBackendConfig bc;
  bc.pool = spec.pool;
  bc.attention_plugin = spec.attention_plugin;
  bc.planted = spec.planted;
  bc.weight_dtype = spec.weight_dtype;
  bc.max_graph_tokens = spec.max_graph_tokens;
  bc.kv_groups = spec.kv_groups;
  return make_cuda_backend(spec.kind == BackendKind::kCuda ? CudaFlavour::kDevice : CudaFlavour::kEmulated, model, bc);
}

}  // namespace kvp
