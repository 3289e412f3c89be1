#include "common/dtype.h"

#include <bit>
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "common/rng.h"

namespace kvp {
namespace {

// GCC's _Float16 (IEEE binary16 with hardware-defined round-to-nearest-even conversions)
// is an independent oracle for our bit-level fp16 conversions.
uint16_t oracle_f16(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
float oracle_f16_to_float(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }

TEST(DType, F16DecodeMatchesCompilerForEveryBitPattern) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float ours = f16_to_float(static_cast<uint16_t>(h));
    const float oracle = oracle_f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(oracle)) {
      EXPECT_TRUE(std::isnan(ours)) << std::hex << h;
    } else {
      ASSERT_EQ(float_bits(ours), float_bits(oracle)) << std::hex << h;
    }
  }
}

TEST(DType, F16EncodeRoundsToNearestEvenLikeCompiler) {
  // Every fp16 value and the midpoints and neighbours around it, plus random floats.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float v = f16_to_float(static_cast<uint16_t>(h));
    const float next = f16_to_float(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(v) + next) / 2.0);
    for (float f : {v, -v, mid, -mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      ASSERT_EQ(float_to_f16(f), oracle_f16(f)) << f;
    }
  }
  Rng rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const float f = bits_float(static_cast<uint32_t>(rng.next_u64()));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    ASSERT_EQ(float_to_f16(f), oracle_f16(f)) << f;
  }
}

TEST(DType, BF16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 0x1.0p-8f), float_to_bf16(1.0f));
  // Just above the midpoint rounds up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::nextafter(1.0f + 0x1.0p-8f, 2.0f))), 1.0f + 0x1.0p-7f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1.0p-8f)), 1.0f + 0x1.0p-6f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
  // Every bf16 value survives a round trip.
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), h);
    }
  }
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_EQ(dtype_from_flag("bf16"), DType::kBF16);
  EXPECT_FALSE(dtype_from_name("f32").has_value());
  EXPECT_FALSE(dtype_from_flag("int8").has_value());
}

}  // namespace
}  // namespace kvp
