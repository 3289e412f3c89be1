#include "common/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
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

// The distribution's definition, written the plain way: stable-sort the ids by descending
// logit (ties keep id order), weight exp(logit / T - max / T) in that order, cut by top-k
// then top-p.
TruncatedDistribution plain_truncated_distribution(const std::vector<float>& logits, const SamplingParams& params) {
  TruncatedDistribution d;
  d.order.resize(logits.size());
  std::iota(d.order.begin(), d.order.end(), 0);
  std::stable_sort(d.order.begin(), d.order.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
  });
  d.keep = d.order.size();
  if (params.top_k > 0) d.keep = std::min(d.keep, static_cast<std::size_t>(params.top_k));
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  const double max_logit = static_cast<double>(logits[static_cast<std::size_t>(d.order[0])]) * inv_t;
  for (std::size_t i = 0; i < d.keep; ++i) {
    d.p.push_back(std::exp(static_cast<double>(logits[static_cast<std::size_t>(d.order[i])]) * inv_t - max_logit));
    d.total += d.p.back();
  }
  if (params.top_p < 1.0f) {
    double mass = 0.0;
    std::size_t cut = d.keep;
    for (std::size_t i = 0; i < d.keep; ++i) {
      mass += d.p[i] / d.total;
      if (mass >= static_cast<double>(params.top_p)) {
        cut = i + 1;
        break;
      }
    }
    d.keep = cut;
    d.total = std::accumulate(d.p.begin(), d.p.begin() + static_cast<std::ptrdiff_t>(d.keep), 0.0);
  }
  return d;
}

uint64_t bits_of(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

TEST(Sampling, TruncatedDistributionIsThePlainDefinitionBitForBit) {
  Rng rng(42);
  int cases = 0;
  for (const std::size_t vocab : {std::size_t{1}, std::size_t{7}, std::size_t{300}, std::size_t{5000}}) {
    for (int draw = 0; draw < 6; ++draw) {
      // Logits from a few distinct values (many ties), with +0 and -0 among them, or spread.
      std::vector<float> logits(vocab);
      for (float& x : logits) {
        const uint64_t pick = rng.below(8);
        x = draw % 2 == 0 ? static_cast<float>(pick) - 4.0f : static_cast<float>(rng.uniform(-20.0, 20.0));
        if (pick == 0) x = -0.0f;
        if (pick == 1) x = 0.0f;
      }
      for (const int32_t top_k : {0, 1, 5, 1000}) {
        for (const float top_p : {1.0f, 0.9f, 0.3f}) {
          SamplingParams params;
          params.temperature = draw < 3 ? 1.0f : 0.7f;
          params.top_k = top_k;
          params.top_p = top_p;
          const TruncatedDistribution want = plain_truncated_distribution(logits, params);
          const TruncatedDistribution got = truncated_distribution(logits, params);
          const std::string what = "vocab " + std::to_string(vocab) + " draw " + std::to_string(draw) + " top_k " +
                                   std::to_string(top_k) + " top_p " + std::to_string(top_p);
          ASSERT_EQ(got.keep, want.keep) << what;
          ASSERT_GE(got.order.size(), got.keep) << what;
          ASSERT_GE(got.p.size(), got.keep) << what;
          for (std::size_t i = 0; i < want.keep; ++i) {
            ASSERT_EQ(got.order[i], want.order[i]) << what << " rank " << i;
            ASSERT_EQ(bits_of(got.p[i]), bits_of(want.p[i])) << what << " rank " << i;
          }
          ASSERT_EQ(bits_of(got.total), bits_of(want.total)) << what;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 6 * 4 * 3);
}

TEST(Sampling, ANanLogitIsNeverPreferred) {
  const std::vector<float> logits = {1.0f, std::nanf(""), 3.0f, -2.0f};
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_k = 3;
  const TruncatedDistribution d = truncated_distribution(logits, params);
  ASSERT_EQ(d.keep, 3u);
  EXPECT_EQ(d.order[0], 2);
  EXPECT_EQ(d.order[1], 0);
  EXPECT_EQ(d.order[2], 3);
}

}  // namespace
}  // namespace kvp
