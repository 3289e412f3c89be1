// The projections' GEMM (kernels/gemm.h): every instruction set, every block shape and every
// row split gives each output element dot_fma_scalar's bits, and dot_fma_scalar is the dot
// product it claims to be.
#include "kernels/gemm.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/rng.h"

namespace kvp::kernels {
namespace {

std::vector<float> random_floats(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.uniform() * 2.0 - 1.0);
  return v;
}

std::vector<GemmIsa> supported_isas() {
  std::vector<GemmIsa> isas;
  for (GemmIsa isa : {GemmIsa::kScalar, GemmIsa::kAvx2, GemmIsa::kAvx512}) {
    if (gemm_isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

TEST(Gemm, ScalarDefinitionIsTheDotProduct) {
  // Against an fp64 sum: the fma chains are the dot product, to fp32 rounding of n terms.
  for (int64_t n : {0, 1, 5, 15, 16, 17, 31, 32, 100, 576, 1537}) {
    const auto a = random_floats(n, 1 + static_cast<uint64_t>(n));
    const auto b = random_floats(n, 1000 + static_cast<uint64_t>(n));
    double exact = 0.0;
    double magnitude = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      exact += static_cast<double>(a[static_cast<std::size_t>(i)]) * b[static_cast<std::size_t>(i)];
      magnitude += std::abs(static_cast<double>(a[static_cast<std::size_t>(i)]) * b[static_cast<std::size_t>(i)]);
    }
    const float got = dot_fma_scalar(a.data(), b.data(), n);
    EXPECT_NEAR(got, exact, 1e-6 * (magnitude + 1.0)) << "n=" << n;
  }
}

TEST(Gemm, ScalarDefinitionFusesEachMultiplyAdd) {
  // 1 + 2^-13 squared is 1 + 2^-12 + 2^-26: the last term is lost by a rounded product and
  // kept by a fused one. With lane 0 holding -(1 + 2^-12) first, its chain gives 2^-26.
  // Two lane-0 terms in one chain: i = 0 (the correction) and i = 16 (the square).
  std::vector<float> a(32, 0.0f), b(32, 0.0f);
  const float x = 1.0f + std::ldexp(1.0f, -13);
  a[0] = -(1.0f + std::ldexp(1.0f, -12));
  b[0] = 1.0f;
  a[16] = x;
  b[16] = x;
  EXPECT_EQ(dot_fma_scalar(a.data(), b.data(), 32), std::ldexp(1.0f, -26));
}

TEST(Gemm, EveryIsaGivesTheScalarBits) {
  const auto isas = supported_isas();
  std::string ran;
  for (GemmIsa isa : isas) ran += std::string(gemm_isa_name(isa)) + " ";
  RecordProperty("isas", ran);
  std::cout << "gemm ISAs on this CPU: " << ran << "(chosen: " << gemm_isa_name(gemm_isa()) << ")\n";
  uint64_t seed = 7;
  for (int64_t in_dim : {1, 7, 15, 16, 17, 33, 64, 100, 576}) {
    for (int64_t out_dim : {1, 5, 6, 7, 13, 64}) {
      for (int64_t n : {1, 2, 3, 4, 5, 7, 16, 67}) {
        const auto w = random_floats(out_dim * in_dim, ++seed);
        const auto x = random_floats(n * in_dim, ++seed);
        const auto bias = random_floats(out_dim, ++seed);
        for (bool with_bias : {false, true}) {
          std::vector<float> want(static_cast<std::size_t>(n * out_dim));
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t r = 0; r < out_dim; ++r) {
              float v = dot_fma_scalar(w.data() + r * in_dim, x.data() + t * in_dim, in_dim);
              if (with_bias) v += bias[static_cast<std::size_t>(r)];
              want[static_cast<std::size_t>(t * out_dim + r)] = v;
            }
          }
          for (GemmIsa isa : isas) {
            // The rows in two ranges, as two threads would split them.
            std::vector<float> got(want.size(), -1.0f);
            const int64_t split = out_dim / 2;
            gemm_rows(isa, w.data(), with_bias ? bias.data() : nullptr, out_dim, in_dim, x.data(), n, got.data(), 0,
                      split);
            gemm_rows(isa, w.data(), with_bias ? bias.data() : nullptr, out_dim, in_dim, x.data(), n, got.data(), split,
                      out_dim);
            for (std::size_t i = 0; i < want.size(); ++i) {
              ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                  << gemm_isa_name(isa) << " in_dim=" << in_dim << " out_dim=" << out_dim << " n=" << n
                  << " bias=" << with_bias << " element " << i;
            }
          }
        }
      }
    }
  }
}

TEST(Gemm, ATokensRowIsTheSameAloneAndInABatch) {
  const int64_t in_dim = 96, out_dim = 40, n = 37;
  const auto w = random_floats(out_dim * in_dim, 1);
  const auto x = random_floats(n * in_dim, 2);
  for (GemmIsa isa : supported_isas()) {
    std::vector<float> batch(static_cast<std::size_t>(n * out_dim));
    gemm_rows(isa, w.data(), nullptr, out_dim, in_dim, x.data(), n, batch.data(), 0, out_dim);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> alone(static_cast<std::size_t>(out_dim));
      gemm_rows(isa, w.data(), nullptr, out_dim, in_dim, x.data() + t * in_dim, 1, alone.data(), 0, out_dim);
      for (int64_t r = 0; r < out_dim; ++r)
        ASSERT_EQ(std::bit_cast<uint32_t>(alone[static_cast<std::size_t>(r)]),
                  std::bit_cast<uint32_t>(batch[static_cast<std::size_t>(t * out_dim + r)]))
            << gemm_isa_name(isa) << " token " << t << " row " << r;
    }
  }
}

TEST(Gemm, RowsOutsideTheRangeAreNotTouched) {
  const int64_t in_dim = 32, out_dim = 20, n = 5;
  const auto w = random_floats(out_dim * in_dim, 3);
  const auto x = random_floats(n * in_dim, 4);
  for (GemmIsa isa : supported_isas()) {
    std::vector<float> y(static_cast<std::size_t>(n * out_dim), 42.0f);
    gemm_rows(isa, w.data(), nullptr, out_dim, in_dim, x.data(), n, y.data(), 7, 13);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < out_dim; ++r) {
        if (r >= 7 && r < 13) continue;
        EXPECT_EQ(y[static_cast<std::size_t>(t * out_dim + r)], 42.0f)
            << gemm_isa_name(isa) << " t=" << t << " r=" << r;
      }
    }
  }
}

TEST(Gemm, HostDotIsTheScalarDefinition) {
  for (int64_t n : {3, 16, 40, 576}) {
    const auto a = random_floats(n, 11);
    const auto b = random_floats(n, 12);
    EXPECT_EQ(std::bit_cast<uint32_t>(dot_fma(a.data(), b.data(), n)),
              std::bit_cast<uint32_t>(dot_fma_scalar(a.data(), b.data(), n)))
        << n;
  }
}

}  // namespace
}  // namespace kvp::kernels
