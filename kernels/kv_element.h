// KV-pool element types. A pool stores K and V as fp32, fp16, bf16 or OCP fp8 (E4M3, E5M2);
// every kernel converts an element to fp32 when it reads it and computes in fp32, and rounds
// to the pool's type (round to nearest even; fp8 saturating; common/dtype.h) when it writes.
// The conversions are exact from each type to fp32, so a kernel and its CPU counterpart see
// the same fp32 values. (fp8's per-head scales are applied by the kernels, around these.)
//
// The narrow types are distinct wrapper types so that overloads and templates pick the right
// conversion; they are layout-compatible with uint16_t (fp16, bf16) and uint8_t (fp8).
#pragma once

#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/host_device.h"

namespace kvp::kernels {

struct F16Bits {
  uint16_t bits;
};
struct BF16Bits {
  uint16_t bits;
};
struct F8E4M3Bits {
  uint8_t bits;
};
struct F8E5M2Bits {
  uint8_t bits;
};

KVP_HOST_DEVICE inline float kv_to_float(float x) { return x; }
KVP_HOST_DEVICE inline float kv_to_float(F16Bits x) { return f16_to_float(x.bits); }
KVP_HOST_DEVICE inline float kv_to_float(BF16Bits x) { return bf16_to_float(x.bits); }
KVP_HOST_DEVICE inline float kv_to_float(F8E4M3Bits x) { return fp8_e4m3_to_float(x.bits); }
KVP_HOST_DEVICE inline float kv_to_float(F8E5M2Bits x) { return fp8_e5m2_to_float(x.bits); }

KVP_HOST_DEVICE inline void kv_store(float* p, float x) { *p = x; }
KVP_HOST_DEVICE inline void kv_store(F16Bits* p, float x) { p->bits = float_to_f16(x); }
KVP_HOST_DEVICE inline void kv_store(BF16Bits* p, float x) { p->bits = float_to_bf16(x); }
KVP_HOST_DEVICE inline void kv_store(F8E4M3Bits* p, float x) { p->bits = float_to_fp8_e4m3(x); }
KVP_HOST_DEVICE inline void kv_store(F8E5M2Bits* p, float x) { p->bits = float_to_fp8_e5m2(x); }

// The quiet NaN a poisoned (freed) slot holds, in each type.
KVP_HOST_DEVICE inline void kv_store_nan(float* p) { *p = bits_float(0x7fc00000u); }
KVP_HOST_DEVICE inline void kv_store_nan(F16Bits* p) { p->bits = 0x7e00u; }
KVP_HOST_DEVICE inline void kv_store_nan(BF16Bits* p) { p->bits = 0x7fc0u; }
KVP_HOST_DEVICE inline void kv_store_nan(F8E4M3Bits* p) { p->bits = static_cast<uint8_t>(Fp8E4M3Format::kNanCode); }
KVP_HOST_DEVICE inline void kv_store_nan(F8E5M2Bits* p) { p->bits = static_cast<uint8_t>(Fp8E5M2Format::kNanCode); }

// Host-side views of one element of a pool of `dtype` held as raw bytes, for copies of a pool
// on the host (the swap pool, read_block, tests): the stored value, before any scale.
inline float kv_element_to_float(DType dtype, const void* element) {
  float f = 0;
  uint16_t b16 = 0;
  uint8_t b8 = 0;
  switch (dtype) {
    case DType::kF32: std::memcpy(&f, element, sizeof f); return f;
    case DType::kF16: std::memcpy(&b16, element, sizeof b16); return kv_to_float(F16Bits{b16});
    case DType::kBF16: std::memcpy(&b16, element, sizeof b16); return kv_to_float(BF16Bits{b16});
    case DType::kF8E4M3: std::memcpy(&b8, element, sizeof b8); return kv_to_float(F8E4M3Bits{b8});
    case DType::kF8E5M2: std::memcpy(&b8, element, sizeof b8); return kv_to_float(F8E5M2Bits{b8});
    case DType::kF64: break;
  }
  return bits_float(0x7fc00000u);
}
inline void kv_element_store_nan(DType dtype, void* element) {
  float f32;
  F16Bits f16;
  BF16Bits bf16;
  F8E4M3Bits e4m3;
  F8E5M2Bits e5m2;
  kv_store_nan(&f32);
  kv_store_nan(&f16);
  kv_store_nan(&bf16);
  kv_store_nan(&e4m3);
  kv_store_nan(&e5m2);
  if (dtype == DType::kF32) std::memcpy(element, &f32, sizeof f32);
  if (dtype == DType::kF16) std::memcpy(element, &f16.bits, sizeof f16.bits);
  if (dtype == DType::kBF16) std::memcpy(element, &bf16.bits, sizeof bf16.bits);
  if (dtype == DType::kF8E4M3) std::memcpy(element, &e4m3.bits, sizeof e4m3.bits);
  if (dtype == DType::kF8E5M2) std::memcpy(element, &e5m2.bits, sizeof e5m2.bits);
}

}  // namespace kvp::kernels
