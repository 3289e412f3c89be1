// Storage dtypes for weights and KV caches, and exact conversions between them and fp32.
//
// fp16 (IEEE 754 binary16) and bf16 (the top 16 bits of binary32) are converted with
// round-to-nearest-even, the rounding safetensors writers (PyTorch) use, so a checkpoint
// written here and read by transformers holds the same values. NaN stays NaN, infinities
// stay infinite, fp16 overflow becomes infinity, fp16 underflow goes through subnormals.
//
// fp8 (KV caches only): the OCP 8-bit floating point formats (OCP "8-bit Floating Point
// Specification (OFP8)", rev. 1.0, 2023): E4M3 (bias 7, no infinities, S.1111.111 is NaN, max
// 448, smallest subnormal 2^-9) and E5M2 (bias 15, IEEE-like: infinities and NaNs at exponent
// 31, max 57344, smallest subnormal 2^-16). Encoding rounds to nearest even and saturates:
// a finite value beyond the max, and an infinity, become the max of its sign (the OCP
// specification's saturating conversion; what CUDA's __nv_cvt_float_to_fp8 does with
// __NV_SATFINITE); NaN stays NaN. Decoding is exact.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "common/host_device.h"

namespace kvp {

// kF8E4M3 and kF8E5M2 are KV-pool element types only (no checkpoint holds fp8 weights here).
enum class DType { kF32, kF16, kBF16, kF64, kF8E4M3, kF8E5M2 };

inline bool is_fp8(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }

// Bytes per element.
inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    case DType::kF8E4M3: return 1;
    case DType::kF8E5M2: return 1;
  }
  return 0;
}

// The safetensors spelling: "F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2".
std::string_view dtype_name(DType t);
// The command-line spelling: "f32", "f16", "bf16", "f64", "fp8-e4m3", "fp8-e5m2".
std::string_view dtype_flag_name(DType t);
// Parses the safetensors spelling; nullopt for anything else.
std::optional<DType> dtype_from_name(std::string_view name);
// Parses the command-line spelling: "f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2" (also the
// safetensors spelling).
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

// fp8: one generic encoder and decoder, instantiated for the two OCP formats. kMant mantissa
// bits, kBias exponent bias, kMaxCode the largest finite code (0x7e for E4M3: 448 = 2^8 *
// 1.75; 0x7b for E5M2: 57344 = 2^15 * 1.75), kNanCode the quiet NaN it stores.
struct Fp8E4M3Format {
  static constexpr int kMant = 3;
  static constexpr int kBias = 7;
  static constexpr uint32_t kMaxCode = 0x7eu;
  static constexpr uint32_t kNanCode = 0x7fu;
  static constexpr bool kHasInf = false;
};
struct Fp8E5M2Format {
  static constexpr int kMant = 2;
  static constexpr int kBias = 15;
  static constexpr uint32_t kMaxCode = 0x7bu;
  static constexpr uint32_t kNanCode = 0x7eu;
  static constexpr bool kHasInf = true;
};

template <typename F>
KVP_HOST_DEVICE inline float fp8_to_float(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code & 0x7fu) >> F::kMant;
  const uint32_t mant = code & ((1u << F::kMant) - 1u);
  const uint32_t all_ones = 0x7fu >> F::kMant;
  if (F::kHasInf && exp == all_ones) return bits_float(sign | 0x7f800000u | (mant << (23 - F::kMant)));  // inf/NaN
  if (!F::kHasInf && (code & 0x7fu) == 0x7fu) return bits_float(sign | 0x7fc00000u);  // E4M3's only NaN
  if (exp == 0) {
    // Subnormal: mant * 2^(1 - bias - kMant), exact in fp32.
    const float v = static_cast<float>(mant) * bits_float(static_cast<uint32_t>(127 + 1 - F::kBias - F::kMant) << 23);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 127u - F::kBias) << 23) | (mant << (23 - F::kMant)));
}

template <typename F>
KVP_HOST_DEVICE inline uint8_t float_to_fp8(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | F::kNanCode);
  constexpr int kEmin = 1 - F::kBias;  // the smallest normal exponent
  // Below 2^kEmin: a multiple of the smallest subnormal 2^(kEmin - kMant), rounded to even.
  if (abs < static_cast<uint32_t>(127 + kEmin) << 23) {
    // At most half the smallest subnormal rounds to zero (the half itself: to even, zero).
    if (abs <= static_cast<uint32_t>(127 + kEmin - F::kMant - 1) << 23) return static_cast<uint8_t>(sign);
    const uint32_t exp = abs >> 23;  // a normal fp32 here
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp - 150); in units of 2^(kEmin - kMant): mant >> shift.
    const uint32_t shift = static_cast<uint32_t>(150 + kEmin - F::kMant) - exp;
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);  // q == 2^kMant is the smallest normal's code
  }
  // Normal: rebias the exponent, round the mantissa from 23 bits to kMant (a carry moves
  // into the exponent), saturate.
  const uint32_t rebased = abs - (static_cast<uint32_t>(127 - F::kBias) << 23);
  constexpr uint32_t kShift = 23 - F::kMant;
  const uint32_t lsb = (rebased >> kShift) & 1u;
  const uint32_t code = (rebased + ((1u << (kShift - 1)) - 1u) + lsb) >> kShift;
  return static_cast<uint8_t>(sign | (code > F::kMaxCode ? F::kMaxCode : code));
}

KVP_HOST_DEVICE inline float fp8_e4m3_to_float(uint8_t code) { return fp8_to_float<Fp8E4M3Format>(code); }
KVP_HOST_DEVICE inline float fp8_e5m2_to_float(uint8_t code) { return fp8_to_float<Fp8E5M2Format>(code); }
KVP_HOST_DEVICE inline uint8_t float_to_fp8_e4m3(float f) { return float_to_fp8<Fp8E4M3Format>(f); }
KVP_HOST_DEVICE inline uint8_t float_to_fp8_e5m2(float f) { return float_to_fp8<Fp8E5M2Format>(f); }

// The largest finite value of an fp8 KV dtype (448 or 57344); 0 for the others.
inline float fp8_max(DType t) { return t == DType::kF8E4M3 ? 448.0f : t == DType::kF8E5M2 ? 57344.0f : 0.0f; }

}  // namespace kvp
