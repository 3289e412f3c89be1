#include "common/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

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
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kF8E4M3, DType::kF8E5M2}) {
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
    EXPECT_EQ(dtype_from_flag(dtype_flag_name(t)), t);
  }
  EXPECT_EQ(dtype_name(DType::kF8E4M3), "F8_E4M3");  // the safetensors spelling
  EXPECT_EQ(dtype_size(DType::kF8E5M2), 1u);
  EXPECT_EQ(dtype_from_flag("bf16"), DType::kBF16);
  EXPECT_FALSE(dtype_from_name("f32").has_value());
  EXPECT_FALSE(dtype_from_flag("int8").has_value());
}

// fp8: the values the OCP 8-bit floating point specification (OFP8 rev. 1.0, 2023, section
// 5.3, tables 1 and 2) defines for every code, computed here from its formulas in double,
// independently of common/dtype.h:
//   E4M3: bias 7; exponent 0: (-1)^s 2^-6 (m/8); else (-1)^s 2^(e-7) (1 + m/8); S.1111.111 NaN.
//   E5M2: bias 15; exponent 0: (-1)^s 2^-14 (m/4); exponent 31: m == 0 inf, else NaN; else
//         (-1)^s 2^(e-15) (1 + m/4).
// All ints, no padding: gtest prints a parameter without a PrintTo byte by byte (valgrind
// flags padding bytes as uninitialised); PrintTo below names it anyway.
struct Ocp {
  int exp_bits, mant_bits, bias;
  int e4m3;  // 1: E4M3 (no infinities), 0: E5M2
};
void PrintTo(const Ocp& f, std::ostream* os) { *os << (f.e4m3 ? "E4M3" : "E5M2"); }
constexpr Ocp kE4M3{4, 3, 7, 1};
constexpr Ocp kE5M2{5, 2, 15, 0};

double ocp_value(const Ocp& f, uint32_t code) {
  const double sign = (code & 0x80u) ? -1.0 : 1.0;
  const uint32_t e = (code >> f.mant_bits) & ((1u << f.exp_bits) - 1u);
  const uint32_t m = code & ((1u << f.mant_bits) - 1u);
  const double frac = static_cast<double>(m) / static_cast<double>(1u << f.mant_bits);
  if (f.e4m3 && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (!f.e4m3 && e == 31)
    return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(frac, 1 - f.bias);
  return sign * std::ldexp(1.0 + frac, static_cast<int>(e) - f.bias);
}

float decode(const Ocp& f, uint8_t c) { return f.e4m3 ? fp8_e4m3_to_float(c) : fp8_e5m2_to_float(c); }
uint8_t encode(const Ocp& f, float x) { return f.e4m3 ? float_to_fp8_e4m3(x) : float_to_fp8_e5m2(x); }

// Round to nearest even with saturation, by search over the specification's 256 values
// (`values`: ocp_value of every code): the nearest finite value; a tie goes to the code with
// an even mantissa; beyond the largest finite value (and infinities): the largest, of its
// sign; NaN: NaN (nullopt).
std::optional<uint8_t> brute_force_encode(const std::vector<double>& values, float x) {
  if (std::isnan(x)) return std::nullopt;
  const double xd = x;
  double max_finite = 0;
  for (uint32_t c = 0; c < 0x80; ++c)
    if (std::isfinite(values[c])) max_finite = std::max(max_finite, values[c]);
  const double clamped = std::clamp(xd, -max_finite, max_finite);
  int best = -1;
  double best_err = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const double v = values[c];
    if (!std::isfinite(v)) continue;
    if (v == 0 && (c & 0x80u) != (std::signbit(xd) ? 0x80u : 0u)) continue;  // zero keeps x's sign
    if ((v > 0 && xd < 0) || (v < 0 && xd > 0)) continue;
    const double err = std::abs(v - clamped);
    if (best < 0 || err < best_err || (err == best_err && (c & 1u) == 0)) {
      best = static_cast<int>(c);
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

class Fp8 : public ::testing::TestWithParam<Ocp> {};

TEST_P(Fp8, EveryCodeDecodesToTheSpecificationsValue) {
  const Ocp f = GetParam();
  int nans = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const double want = ocp_value(f, c);
    const float got = decode(f, static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << c;
      ++nans;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << std::hex << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80u) != 0) << std::hex << c;  // -0 included
    }
  }
  EXPECT_EQ(nans, f.e4m3 ? 2 : 6);  // E4M3: 0x7f, 0xff; E5M2: 0x7d-0x7f, 0xfd-0xff
}

TEST_P(Fp8, SpecificationsLandmarks) {
  const Ocp f = GetParam();
  if (f.e4m3) {
    EXPECT_EQ(decode(f, 0x7e), 448.0f);              // max normal S.1111.110
    EXPECT_EQ(decode(f, 0x08), 0x1.0p-6f);           // min normal
    EXPECT_EQ(decode(f, 0x07), 0.875f * 0x1.0p-6f);  // max subnormal
    EXPECT_EQ(decode(f, 0x01), 0x1.0p-9f);           // min subnormal
    EXPECT_EQ(encode(f, 448.0f), 0x7e);
  } else {
    EXPECT_EQ(decode(f, 0x7b), 57344.0f);            // max normal S.11110.11
    EXPECT_EQ(decode(f, 0x04), 0x1.0p-14f);          // min normal
    EXPECT_EQ(decode(f, 0x03), 0.75f * 0x1.0p-14f);  // max subnormal
    EXPECT_EQ(decode(f, 0x01), 0x1.0p-16f);          // min subnormal
    EXPECT_EQ(decode(f, 0x7c), std::numeric_limits<float>::infinity());
  }
}

TEST_P(Fp8, EncodingRoundsToNearestEvenAndSaturates) {
  const Ocp f = GetParam();
  std::vector<float> probes = {0.0f,
                               -0.0f,
                               1e30f,
                               -1e30f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::max()};
  // Every finite value, the midpoints between neighbours and the floats either side of them.
  std::vector<double> values;
  for (uint32_t c = 0; c < 0x80; ++c)
    if (std::isfinite(ocp_value(f, c))) values.push_back(ocp_value(f, c));
  std::sort(values.begin(), values.end());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto v = static_cast<float>(values[i]);
    for (float x : {v, std::nextafter(v, 0.0f), std::nextafter(v, 1e38f)}) {
      probes.push_back(x);
      probes.push_back(-x);
    }
    const auto mid = static_cast<float>(i + 1 < values.size() ? (values[i] + values[i + 1]) / 2 : values[i] * 1.0625);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e38f)}) {
      probes.push_back(x);
      probes.push_back(-x);
    }
  }
  Rng rng(11);
  for (int i = 0; i < 100000; ++i) {
    // Uniform in log scale over the format's range and a little beyond.
    const double e =
        (static_cast<double>(rng.next_u64() >> 11) * 0x1.0p-53) * (f.e4m3 ? 20.0 : 36.0) - (f.e4m3 ? 11 : 18);
    const float x = static_cast<float>(std::ldexp(1.0, 0) * std::exp2(e));
    probes.push_back((rng.next_u64() & 1) ? x : -x);
  }
  std::vector<double> table(256);
  for (uint32_t c = 0; c < 256; ++c) table[c] = ocp_value(f, c);
  for (float x : probes) {
    const auto want = brute_force_encode(table, x);
    ASSERT_TRUE(want.has_value());
    ASSERT_EQ(encode(f, x), *want) << f.exp_bits << "-bit exponent, x = " << x;
  }
  EXPECT_TRUE(std::isnan(decode(f, encode(f, std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(decode(f, encode(f, -std::numeric_limits<float>::quiet_NaN()))));
  // Every finite code survives a round trip.
  for (uint32_t c = 0; c < 256; ++c) {
    const float v = decode(f, static_cast<uint8_t>(c));
    if (std::isfinite(v)) {
      ASSERT_EQ(encode(f, v), c) << std::hex << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ocp, Fp8, ::testing::Values(kE4M3, kE5M2), [](const ::testing::TestParamInfo<Ocp>& p) {
  return std::string(p.param.e4m3 ? "E4M3" : "E5M2");
});

}  // namespace
}  // namespace kvp
