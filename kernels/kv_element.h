// KV-pool element types. A pool stores K and V as fp32, fp16 or bf16; every kernel converts
// an element to fp32 when it reads it and computes in fp32, and rounds to the pool's type
// (round to nearest even, common/dtype.h) when it writes. The conversions are exact from
// fp16/bf16 to fp32, so a kernel and its CPU counterpart see the same fp32 values.
//
// fp16 and bf16 are distinct wrapper types (both 16-bit patterns) so that overloads and
// templates pick the right conversion; they are layout-compatible with uint16_t.
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

KVP_HOST_DEVICE inline float kv_to_float(float x) { return x; }
KVP_HOST_DEVICE inline float kv_to_float(F16Bits x) { return f16_to_float(x.bits); }
KVP_HOST_DEVICE inline float kv_to_float(BF16Bits x) { return bf16_to_float(x.bits); }

KVP_HOST_DEVICE inline void kv_store(float* p, float x) { *p = x; }
KVP_HOST_DEVICE inline void kv_store(F16Bits* p, float x) { p->bits = float_to_f16(x); }
KVP_HOST_DEVICE inline void kv_store(BF16Bits* p, float x) { p->bits = float_to_bf16(x); }

// The quiet NaN a poisoned (freed) slot holds, in each type.
KVP_HOST_DEVICE inline void kv_store_nan(float* p) { *p = bits_float(0x7fc00000u); }
KVP_HOST_DEVICE inline void kv_store_nan(F16Bits* p) { p->bits = 0x7e00u; }
KVP_HOST_DEVICE inline void kv_store_nan(BF16Bits* p) { p->bits = 0x7fc0u; }

// Host-side views of one element of a pool of `dtype` (F32, F16 or BF16) held as raw bytes,
// for copies of a pool on the host (the swap pool, read_block, tests).
inline float kv_element_to_float(DType dtype, const void* element) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, element, sizeof f);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, element, sizeof bits);
  return dtype == DType::kF16 ? kv_to_float(F16Bits{bits}) : kv_to_float(BF16Bits{bits});
}
inline void kv_element_store_nan(DType dtype, void* element) {
  float f32;
  F16Bits f16;
  BF16Bits bf16;
  kv_store_nan(&f32);
  kv_store_nan(&f16);
  kv_store_nan(&bf16);
  if (dtype == DType::kF32) std::memcpy(element, &f32, sizeof f32);
  if (dtype == DType::kF16) std::memcpy(element, &f16.bits, sizeof f16.bits);
  if (dtype == DType::kBF16) std::memcpy(element, &bf16.bits, sizeof bf16.bits);
}

}  // namespace kvp::kernels
