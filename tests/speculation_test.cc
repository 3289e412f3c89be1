// Speculative decoding, unit tests: the n-gram proposer, greedy and rejection-sampling
// acceptance, and the I9 accepted-only cache (its checker and truncate's part in it). The
// engine-level proofs are in speculation_differential_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "optimized/checkers/invariants.h"
#include "optimized/engine/acceptance.h"
#include "optimized/engine/speculation.h"
#include "tests/kv_cache_manager_test_peer.h"

namespace kvp {

namespace {

using V = std::vector<int32_t>;

// ---------------------------------------------------------------- proposers and acceptance

TEST(NgramProposer, ProposesTheContinuationOfTheLongestEarlierMatch) {
  NgramProposer p(3, 1);
  // Suffix [1, 2] (n = 2) last occurred at 4; [4, 1, 2] (n = 3) never did.
  EXPECT_EQ(p.lookup(V{1, 2, 3, 9, 1, 2, 5, 4, 1, 2}, 3), (V{5, 4, 1}));
  EXPECT_EQ(p.lookup(V{7, 8, 9, 7, 8}, 5), (V{9, 7, 8}));  // runs up to the end at most
  EXPECT_TRUE(p.lookup(V{1, 2, 3}, 4).empty());            // no earlier match
  EXPECT_TRUE(p.lookup(V{5}, 4).empty());
}

std::vector<float> one_hot_rows(const V& argmaxes, int64_t vocab) {
  std::vector<float> rows(argmaxes.size() * static_cast<std::size_t>(vocab), 0.0f);
  for (std::size_t j = 0; j < argmaxes.size(); ++j)
    rows[j * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(argmaxes[j])] = 5.0f;
  return rows;
}

TEST(Acceptance, GreedyAcceptsWhileTheTargetAgreesThenTakesTheTargetsToken) {
  const std::vector<float> rows = one_hot_rows({3, 4, 6, 7}, 8);
  const VerifyRows r{rows.data(), 8, 4};
  AcceptResult a = accept_greedy(V{3, 4, 5}, r);
  EXPECT_EQ(a.num_accepted, 2);
  EXPECT_EQ(a.next_token, 6);  // row 2, not row 3
  a = accept_greedy(V{3, 4, 6}, r);
  EXPECT_EQ(a.num_accepted, 3);
  EXPECT_EQ(a.next_token, 7);  // the bonus token, from the last row
  a = accept_greedy(V{1, 4, 6}, r);
  EXPECT_EQ(a.num_accepted, 0);
  EXPECT_EQ(a.next_token, 3);
}

TEST(Acceptance, SamplingDistributionIsWhatSampleTokenDraws) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f, 1.5f};
  const SamplingParams params{0.7f, 4, 0.9f, 11};
  const std::vector<double> p = sampling_distribution(logits, params);
  EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
  std::vector<int> counts(logits.size(), 0);
  Rng rng(3);
  constexpr int kDraws = 40000;
  for (int i = 0; i < kDraws; ++i) ++counts[static_cast<std::size_t>(sample_token(logits, params, rng))];
  for (std::size_t v = 0; v < p.size(); ++v) {
    EXPECT_NEAR(counts[v] / double{kDraws}, p[v], 0.01) << "token " << v;
    if (p[v] == 0) {
      EXPECT_EQ(counts[v], 0);
    }
  }
}

TEST(Acceptance, SampledPointMassProposalIsAcceptedWithTheTargetsProbability) {
  const std::vector<float> rows = {0.0f, std::log(3.0f), 0.0f, 0.0f, 0.0f, 0.0f};  // row 0: p(1) = 0.6
  const VerifyRows r{rows.data(), 3, 2};
  const SamplingParams params{1.0f, 0, 1.0f, 0};
  Rng rng(5);
  int accepted = 0;
  std::vector<int> next(3, 0);
  constexpr int kTrials = 20000;
  for (int i = 0; i < kTrials; ++i) {
    const AcceptResult a = accept_sampled(V{1}, {}, r, params, rng);
    accepted += a.num_accepted;
    if (a.num_accepted == 0) ++next[static_cast<std::size_t>(a.next_token)];
  }
  EXPECT_NEAR(accepted / double{kTrials}, 0.6, 0.015);
  EXPECT_EQ(next[1], 0);  // the residual never gives the rejected token back
  EXPECT_NEAR(next[0] / double{kTrials}, 0.2, 0.015);
}

// ---------------------------------------------------------------- I9

TEST(AcceptedOnlyCache, CheckerReportsACachedBlockThatWasRolledBack) {
  KvCacheConfig c;
  c.pool.block_size = 4;
  c.pool.num_device_blocks = 8;
  c.pool.num_host_blocks = 0;
  KvCacheManager m(c);
  std::vector<int64_t> slots;
  ASSERT_TRUE(m.add_sequence(1, 0, V{1, 2, 3, 4, 5, 6, 7, 8, 9}).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 9, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 9).is_ok());
  ASSERT_TRUE(check_accepted_only_cache(m).is_ok());
  KvCacheManagerTestPeer::mark_rolled_back(m, m.sequence(1)->table()[1]);
  const Status st = check_accepted_only_cache(m);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("I9"), std::string::npos) << st.message();
  EXPECT_FALSE(check_all(m).is_ok());
}

TEST(AcceptedOnlyCache, RollingBackIntoACachedBlockUnregistersIt) {
  KvCacheConfig c;
  c.pool.block_size = 4;
  c.pool.num_device_blocks = 8;
  c.pool.num_host_blocks = 0;
  KvCacheManager m(c);
  std::vector<int64_t> slots;
  ASSERT_TRUE(m.add_sequence(1, 0, V{1, 2, 3, 4, 5, 6, 7, 8, 9}).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 9, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 9).is_ok());
  EXPECT_EQ(m.prefix_cache().size(), 2);
  ASSERT_TRUE(m.truncate(1, 3).is_ok());  // drops positions of both cached blocks
  EXPECT_EQ(m.prefix_cache().size(), 0);
  EXPECT_TRUE(check_all(m).is_ok()) << check_all(m).message();
}

// A block taken out of the cache by a truncate may be rewritten in place (same generation):
// entries chained onto it leave the cache with it.
TEST(AcceptedOnlyCache, TruncateDropsEntriesChainedOntoAnUnregisteredBlock) {
  KvCacheConfig c;
  c.pool.block_size = 4;
  c.pool.num_device_blocks = 8;
  c.pool.num_host_blocks = 0;
  KvCacheManager m(c);
  std::vector<int64_t> slots;
  ASSERT_TRUE(m.add_sequence(1, 0, V{1, 2, 3, 4, 5, 6, 7, 8}).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 8, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 8).is_ok());
  ASSERT_TRUE(m.fork(1, 2).is_ok());
  ASSERT_TRUE(m.append_tokens(2, V{9, 10, 11, 12}).is_ok());
  ASSERT_TRUE(m.allocate_slots(2, 4, slots).is_ok());
  ASSERT_TRUE(m.mark_final(2, 12).is_ok());
  const int32_t child = m.sequence(2)->table()[2];
  ASSERT_TRUE(m.free(2).is_ok());
  EXPECT_TRUE(m.prefix_cache().contains(child));
  ASSERT_TRUE(m.truncate(1, 6).is_ok());
  EXPECT_FALSE(m.prefix_cache().contains(child));
  ASSERT_TRUE(m.append_tokens(1, V{20, 21}).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 2, slots).is_ok());
  EXPECT_TRUE(m.take_plan_ops().block_copies.empty());  // written in place
  ASSERT_TRUE(m.mark_final(1, 8).is_ok());
  EXPECT_TRUE(check_all(m).is_ok()) << check_all(m).message();
}

}  // namespace
}  // namespace kvp
