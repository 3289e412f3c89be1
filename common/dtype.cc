#include "common/dtype.h"

namespace kvp {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
  }
  return "?";
}

std::string_view dtype_flag_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "f64";
    case DType::kF8E4M3: return "fp8-e4m3";
    case DType::kF8E5M2: return "fp8-e5m2";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F64") return DType::kF64;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "F8_E5M2") return DType::kF8E5M2;
  return std::nullopt;
}

std::optional<DType> dtype_from_flag(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::kF32;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f64" || name == "fp64" || name == "float64") return DType::kF64;
  if (name == "fp8-e4m3" || name == "fp8_e4m3" || name == "f8e4m3") return DType::kF8E4M3;
  if (name == "fp8-e5m2" || name == "fp8_e5m2" || name == "f8e5m2") return DType::kF8E5M2;
  return dtype_from_name(name);
}

}  // namespace kvp
