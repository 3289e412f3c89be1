// Each operation of the reference model against values computed by hand.
#include "reference/ops.h"

#include <cmath>

#include <gtest/gtest.h>

namespace kvp::ref {
namespace {

using V = Vector<double>;
using M = Matrix<double>;

V vec(std::initializer_list<double> xs) {
  V v(static_cast<Eigen::Index>(xs.size()));
  Eigen::Index i = 0;
  for (double x : xs) v(i++) = x;
  return v;
}

TEST(ReferenceOps, RmsNormMatchesHandComputation) {
  // mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5; rms = sqrt(7.5 + 0.5) = sqrt(8).
  const V out = rms_norm<double>(vec({1, 2, 3, 4}), vec({1, 0.5, 2, 1}), 0.5);
  const double r = std::sqrt(8.0);
  EXPECT_NEAR(out(0), 1 / r, 1e-15);
  EXPECT_NEAR(out(1), 2 * 0.5 / r, 1e-15);
  EXPECT_NEAR(out(2), 3 * 2 / r, 1e-15);
  EXPECT_NEAR(out(3), 4 / r, 1e-15);
}

// The unscaled table theta^(-2i/D), written here from the formula.
void rope_with_theta(V& x, int64_t position, double theta) {
  std::vector<double> inv_freq;
  for (Eigen::Index i = 0; i < x.size() / 2; ++i)
    inv_freq.push_back(std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(x.size())));
  apply_rope<double>(x, position, inv_freq);
}

TEST(ReferenceOps, RopeAtPositionZeroIsIdentity) {
  V x = vec({1, 2, 3, 4});
  rope_with_theta(x, 0, 10000.0);
  EXPECT_EQ(x, vec({1, 2, 3, 4}));
}

TEST(ReferenceOps, RopeRotatesHalvesAtKnownPositions) {
  // head_dim 4, theta 100: pair (0, 2) turns at 100^0 = 1 rad per position, pair (1, 3)
  // at 100^(-1/2) = 0.1 rad per position. At position 3 the angles are 3 and 0.3 rad.
  V x = vec({1, 2, 3, 4});
  rope_with_theta(x, 3, 100.0);
  EXPECT_NEAR(x(0), 1 * std::cos(3.0) - 3 * std::sin(3.0), 1e-14);
  EXPECT_NEAR(x(2), 3 * std::cos(3.0) + 1 * std::sin(3.0), 1e-14);
  EXPECT_NEAR(x(1), 2 * std::cos(0.3) - 4 * std::sin(0.3), 1e-14);
  EXPECT_NEAR(x(3), 4 * std::cos(0.3) + 2 * std::sin(0.3), 1e-14);
  // cos(3) = -0.9899924966, sin(3) = 0.1411200081: x0 = -0.9899925 - 0.4233600 = -1.4133525.
  EXPECT_NEAR(x(0), -1.4133525209, 1e-9);
}

TEST(ReferenceOps, RopeDotProductDependsOnlyOnRelativePosition) {
  const V q = vec({0.3, -1.2, 0.7, 2.0, 0.1, -0.4});
  const V k = vec({1.1, 0.2, -0.5, 0.9, -1.3, 0.6});
  auto rotated_dot = [&](int64_t m, int64_t n) {
    V a = q, b = k;
    rope_with_theta(a, m, 10000.0);
    rope_with_theta(b, n, 10000.0);
    return a.dot(b);
  };
  EXPECT_NEAR(rotated_dot(7, 3), rotated_dot(104, 100), 1e-12);
  EXPECT_NEAR(rotated_dot(0, 0), q.dot(k), 1e-12);
}

TEST(ReferenceOps, SoftmaxIsStableForLargeLogits) {
  // softmax([0, 1, 2]) = [1, e, e^2] / (1 + e + e^2).
  const double e = std::exp(1.0);
  const double z = 1 + e + e * e;
  for (double shift : {0.0, 1000.0, -1000.0, 1e30}) {
    const V p = softmax<double>(vec({shift, shift + 1, shift + 2}));
    if (shift == 1e30) {
      // Shifted beyond double's resolution: the three logits are equal.
      EXPECT_NEAR(p(0), 1.0 / 3, 1e-15);
      continue;
    }
    EXPECT_NEAR(p(0), 1 / z, 1e-15) << shift;
    EXPECT_NEAR(p(1), e / z, 1e-15) << shift;
    EXPECT_NEAR(p(2), e * e / z, 1e-15) << shift;
  }
  const Vector<float> pf = softmax<float>(Vector<float>::Constant(4, 88.0f));
  EXPECT_FLOAT_EQ(pf(0), 0.25f);
}

TEST(ReferenceOps, SiluMatchesDefinition) {
  EXPECT_EQ(silu(0.0), 0.0);
  EXPECT_NEAR(silu(1.0), 1.0 / (1.0 + std::exp(-1.0)), 1e-16);
  EXPECT_NEAR(silu(1.0), 0.7310585786, 1e-9);
  EXPECT_NEAR(silu(-20.0), -20.0 * 2.0611536e-9, 1e-12);
}

TEST(ReferenceOps, CausalAttentionNeverReadsFuturePositions) {
  // Row 2's key would dominate (score 100), but at position 1 it is in the future.
  M k(3, 2), v(3, 2);
  k << 0, 0, 0, 0, 100, 0;
  v << 1, 0, 0, 1, 5, 5;
  const V q = vec({1, 0});
  const V at1 = causal_attention<double>(q, k, v, 1);
  EXPECT_NEAR(at1(0), 0.5, 1e-15);
  EXPECT_NEAR(at1(1), 0.5, 1e-15);
  const V at0 = causal_attention<double>(q, k, v, 0);
  EXPECT_EQ(at0, vec({1, 0}));
  // At position 2 the large score (100 / sqrt(2)) takes nearly all the weight.
  const V at2 = causal_attention<double>(q, k, v, 2);
  EXPECT_NEAR(at2(0), 5.0, 1e-12);
  // Scores are scaled by 1/sqrt(head_dim): q.k = 2 over two positions gives weights
  // softmax([0, 2/sqrt(2)]).
  M k2(2, 2), v2(2, 2);
  k2 << 0, 0, 2, 0;
  v2 << 0, 0, 1, 0;
  const double w = std::exp(std::sqrt(2.0)) / (1 + std::exp(std::sqrt(2.0)));
  EXPECT_NEAR(causal_attention<double>(q, k2, v2, 1)(0), w, 1e-15);
}

}  // namespace
}  // namespace kvp::ref
