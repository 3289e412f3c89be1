// Storage dtypes for weights and KV caches, and exact conversions between them and fp32.
//
// fp16 (IEEE 754 binary16) and bf16 (the top 16 bits of binary32) are converted with
// round-to-nearest-even, the rounding safetensors writers (PyTorch) use, so a checkpoint
// written here and read by transformers holds the same values. NaN stays NaN, infinities
// stay infinite, fp16 overflow becomes infinity, fp16 underflow goes through subnormals.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "common/host_device.h"

namespace kvp {

enum class DType { kF32, kF16, kBF16, kF64 };

// Bytes per element.
inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
  }
  return 0;
}

// The safetensors spelling: "F32", "F16", "BF16", "F64".
std::string_view dtype_name(DType t);
// Parses the safetensors spelling; nullopt for anything else.
std::optional<DType> dtype_from_name(std::string_view name);
// Parses the command-line spelling: "f32", "f16", "bf16" (also the safetensors spelling).
std::optional<DType> dtype_from_flag(std::string_view name);

KVP_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
KVP_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

KVP_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
KVP_HOST_DEVICE inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

KVP_HOST_DEVICE inline uint16_t float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in fp16: value = m * 2^-24, m in [0, 1024).
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp;  // 14 + (127 - 1 - exp) ... aligns to 2^-24 units
    // value = mant * 2^(exp-150); in units of 2^-24: mant * 2^(exp-126) = mant >> (126-exp)
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent from 127 to 15 and round the mantissa from 23 to 10 bits.
  uint32_t rebased = abs - 0x38000000u;  // (127-15) << 23
  uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

KVP_HOST_DEVICE inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: mant * 2^-24.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace kvp
