// The flavour-neutral part of the CUDA backend (cuda_backend.h), compiled once: the config's
// validation and the choice of flavour. KVP_HAS_CUDA_DEVICE: this build has the nvcc-built
// flavour (cuda_backend_device.cc).
#include <string>

#include "kernels/cuda/model_kernels.h"
#include "optimized/backends/cuda_backend.h"

namespace kvp {

Status CudaBackendConfig::validate() const {
  KVP_RETURN_IF_ERROR(pool.validate_for_backend());
  // Both flavours' kernels are one source: the emulated ones take the dtypes the GPU's take.
  if (!cuda_kernels::emu::kv_dtype_supported(pool.kv_dtype))
    return Status::error("kv_dtype must be F32, F16, BF16, F8_E4M3 or F8_E5M2, got " +
                         std::string(dtype_name(pool.kv_dtype)));
  if (attention_partition <= 0) return Status::error("attention_partition must be > 0");
  if (weight_dtype != DType::kF32 && weight_dtype != DType::kBF16)
    return Status::error("weight_dtype must be F32 or BF16, got " + std::string(dtype_name(weight_dtype)));
  if (max_graph_tokens < 0 || max_graph_tokens > 4096)
    return Status::error("max_graph_tokens must be in [0, 4096], got " + std::to_string(max_graph_tokens));
  // The plug-in ABI passes one block table per sequence and one K/V array per layer.
  if (attention_plugin != nullptr && kv_groups)
    return Status::error("kv_groups: an attention plug-in takes one block table per sequence (no KV-cache groups)");
  return Status::ok();
}

int64_t graph_tokens(int64_t n, int64_t max_graph_tokens) {
  if (n <= 0 || n > max_graph_tokens) return 0;
  int64_t padded = 8;
  if (n <= 8) {
    padded = 1;
    while (padded < n) padded *= 2;
  } else {
    padded = (n + 7) / 8 * 8;
  }
  return padded < max_graph_tokens ? padded : max_graph_tokens;
}

Status cuda_device_status() {
#if defined(KVP_HAS_CUDA_DEVICE)
  return cuda_backend::dev::device_status();
#else
  return Status::error(
      "this kvproof was built without CUDA (CMake found no nvcc, or KVPROOF_CUDA=OFF): backend cuda is not in it; "
      "cuda-emu runs the same kernels on the CPU");
#endif
}

Result<std::unique_ptr<Backend>> make_cuda_backend(CudaFlavour flavour, const Model& model,
                                                   const CudaBackendConfig& config) {
  if (flavour == CudaFlavour::kEmulated) return cuda_backend::emu::create(model, config);
#if defined(KVP_HAS_CUDA_DEVICE)
  return cuda_backend::dev::create(model, config);
#else
  return cuda_device_status();
#endif
}

}  // namespace kvp
