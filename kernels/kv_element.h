// KV-pool element types. A pool stores K and V as fp32, fp16 or bf16; every kernel converts
// an element to fp32 when it reads it and computes in fp32, and rounds to the pool's type
// (round to nearest even, common/dtype.h) when it writes. The conversions are exact from
// fp16/bf16 to fp32, so a kernel and its CPU counterpart see the same fp32 values.
//
// fp16 and bf16 are distinct wrapper types (both 16-bit patterns) so that overloads and
// templates pick the right conversion; they are layout-compatible with uint16_t.
#pragma once

#include <cstdint>

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

}  // namespace kvp::kernels
