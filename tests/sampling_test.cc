#include "common/sampling.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

namespace kvp {
namespace {

TEST(Sampling, GreedyTakesArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  Rng rng(1);
  EXPECT_EQ(sample_token(logits, SamplingParams{}, rng), 1);
  EXPECT_EQ(argmax(logits), 1);
}

TEST(Sampling, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> logits(64);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(static_cast<double>(i)));
  SamplingParams p{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 42};
  auto draw = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(sample_token(logits, p, rng));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampling, TopKOneAndTinyTopPAreGreedy) {
  const std::vector<float> logits = {0.1f, 0.3f, 0.2f, 0.29f};
  Rng rng(5);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(sample_token(logits, {.temperature = 5.0f, .top_k = 1, .top_p = 1.0f, .seed = 0}, rng), 1);
    EXPECT_EQ(sample_token(logits, {.temperature = 5.0f, .top_k = 0, .top_p = 1e-6f, .seed = 0}, rng), 1);
  }
}

TEST(Sampling, TopKNeverReturnsTokensOutsideTheTopK) {
  const std::vector<float> logits = {3.0f, 1.0f, 2.9f, 0.0f, 2.8f};
  Rng rng(9);
  for (int i = 0; i < 2000; ++i) {
    const int32_t t = sample_token(logits, {.temperature = 10.0f, .top_k = 3, .top_p = 1.0f, .seed = 0}, rng);
    EXPECT_TRUE(t == 0 || t == 2 || t == 4) << t;
  }
}

TEST(Sampling, FrequenciesMatchSoftmaxAtTemperatureOne) {
  const std::vector<double> p = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> logits;
  for (double x : p) logits.push_back(static_cast<float>(std::log(x)));
  Rng rng(11);
  const int n = 40000;
  std::vector<int> counts(p.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[static_cast<std::size_t>(sample_token(logits, {.temperature = 1.0f}, rng))];
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double sigma = std::sqrt(p[i] * (1 - p[i]) / n);
    EXPECT_NEAR(static_cast<double>(counts[i]) / n, p[i], 5 * sigma) << "token " << i;
  }
}

TEST(Sampling, ValidateRejectsBadParameters) {
  EXPECT_FALSE(SamplingParams{.temperature = -1.0f}.validate().is_ok());
  EXPECT_FALSE(SamplingParams{.temperature = INFINITY}.validate().is_ok());
  EXPECT_FALSE(SamplingParams{.top_k = -2}.validate().is_ok());
  EXPECT_FALSE(SamplingParams{.top_p = 0.0f}.validate().is_ok());
  EXPECT_FALSE(SamplingParams{.top_p = 1.5f}.validate().is_ok());
  const SamplingParams ok{.temperature = 0.7f, .top_k = 40, .top_p = 0.9f};
  EXPECT_TRUE(ok.validate().is_ok());
}

}  // namespace
}  // namespace kvp
