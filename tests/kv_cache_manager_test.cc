#include "optimized/kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <span>
#include <vector>

#include "optimized/checkers/invariants.h"

namespace kvp {
namespace {

using V = std::vector<int32_t>;
using Slots = std::vector<int64_t>;

#define EXPECT_INVARIANTS(m)                   \
  do {                                         \
    const Status st_ = check_all(m);           \
    EXPECT_TRUE(st_.is_ok()) << st_.message(); \
  } while (0)

KvCacheConfig small_config() {
  KvCacheConfig c;
  c.pool.num_device_blocks = 8;
  c.pool.num_host_blocks = 4;
  c.pool.block_size = 4;
  return c;
}

V iota(int n, int start = 100) {
  V v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

const V& table(const KvCacheManager& m, SeqId s) { return m.sequence(s)->table().blocks(); }

// Adds a sequence and computes its whole prompt (minus the cached prefix); marks it final.
Slots prefill(KvCacheManager& m, SeqId s, const V& prompt, int64_t tenant = 0) {
  EXPECT_TRUE(m.add_sequence(s, tenant, prompt).is_ok());
  const int64_t skip = m.cached_prefix_tokens(s);
  Slots slots;
  const Status st = m.allocate_slots(s, static_cast<int64_t>(prompt.size()) - skip, slots);
  EXPECT_TRUE(st.is_ok()) << st.message();
  EXPECT_TRUE(m.mark_final(s, static_cast<int64_t>(prompt.size())).is_ok());
  return slots;
}

TEST(KvCacheManager, PrefillTakesBlocksInFreeListOrderAndMapsSlotsByTheFormula) {
  KvCacheManager m(small_config());
  const Slots slots = prefill(m, 1, iota(6));
  EXPECT_EQ(table(m, 1), (V{0, 1}));
  EXPECT_EQ(slots, (Slots{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(m.sequence(1)->num_slots, 6);
  EXPECT_TRUE(check_slot_mapping(m, 1, 0, slots).is_ok());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, DecodeAppendUsesTheLastBlockUntilItIsFull) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(3));
  Slots slots;
  ASSERT_TRUE(m.append_tokens(1, V{7}).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 1, slots).is_ok());
  EXPECT_EQ(slots, (Slots{3}));
  EXPECT_EQ(m.device_allocator().num_in_use(), 1);
  ASSERT_TRUE(m.append_tokens(1, V{8}).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 1, slots).is_ok());
  EXPECT_EQ(slots, (Slots{3, 4}));
  EXPECT_EQ(table(m, 1), (V{0, 1}));
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, AllocateNeedsTheTokensToBeKnown) {
  KvCacheManager m(small_config());
  ASSERT_TRUE(m.add_sequence(1, 0, iota(3)).is_ok());
  Slots slots;
  EXPECT_EQ(m.can_allocate(1, 4), AllocStatus::kNever);
  EXPECT_FALSE(m.allocate_slots(1, 4, slots).is_ok());
  EXPECT_TRUE(slots.empty());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, FreeReleasesTailFirst) {
  KvCacheConfig c = small_config();
  c.enable_prefix_caching = false;
  KvCacheManager m(c);
  prefill(m, 1, iota(12));
  ASSERT_TRUE(m.free(1).is_ok());
  EXPECT_EQ(m.device_allocator().free_list(), (V{3, 4, 5, 6, 7, 2, 1, 0}));
  EXPECT_TRUE(check_all_free(m).is_ok());
}

TEST(KvCacheManager, FreedCachedChainsAreEvictedTailFirst) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(12));
  ASSERT_TRUE(m.free(1).is_ok());
  EXPECT_EQ(m.device_allocator().evictable_list(), (V{2, 1, 0}));
  EXPECT_EQ(m.evict_cached(1), 1);
  EXPECT_FALSE(m.prefix_cache().contains(2));
  EXPECT_TRUE(m.prefix_cache().contains(0));
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, PrefixHitSharesCachedBlocksAndRecomputesTheLastToken) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(9));
  EXPECT_EQ(m.prefix_cache().size(), 2);  // blocks 0 and 1 full; block 2 partial
  ASSERT_TRUE(m.add_sequence(2, 0, iota(9)).is_ok());
  EXPECT_EQ(m.cached_prefix_tokens(2), 8);
  Slots slots;
  ASSERT_TRUE(m.allocate_slots(2, 1, slots).is_ok());
  EXPECT_EQ(table(m, 2), (V{0, 1, 3}));
  EXPECT_EQ(slots, (Slots{12}));
  EXPECT_EQ(m.device_allocator().refcount(0), 2);
  EXPECT_EQ(m.prefix_cache().stats().hits, 2);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, AWholeBlockPromptStillRecomputesItsLastToken) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(8));
  ASSERT_TRUE(m.add_sequence(2, 0, iota(8)).is_ok());
  EXPECT_EQ(m.cached_prefix_tokens(2), 4);
}

TEST(KvCacheManager, PrefixHitOnFreedBlocksRevivesThemFromTheEvictableList) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(9));
  ASSERT_TRUE(m.free(1).is_ok());
  EXPECT_EQ(m.device_allocator().num_evictable(), 2);
  prefill(m, 2, iota(9));
  EXPECT_EQ(table(m, 2), (V{0, 1, 3}));
  EXPECT_EQ(m.device_allocator().num_evictable(), 0);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, PrefixSharingIsScopedToTheTenant) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(9), /*tenant=*/1);
  ASSERT_TRUE(m.add_sequence(2, 2, iota(9)).is_ok());
  EXPECT_EQ(m.cached_prefix_tokens(2), 0);
  ASSERT_TRUE(m.add_sequence(3, 1, iota(9)).is_ok());
  EXPECT_EQ(m.cached_prefix_tokens(3), 8);
}

TEST(KvCacheManager, GlobalSharingCrossesTenants) {
  KvCacheConfig c = small_config();
  c.global_prefix_sharing = true;
  KvCacheManager m(c);
  prefill(m, 1, iota(9), 1);
  ASSERT_TRUE(m.add_sequence(2, 2, iota(9)).is_ok());
  EXPECT_EQ(m.cached_prefix_tokens(2), 8);
}

TEST(KvCacheManager, OnlyFinalTokensEnterThePrefixCache) {
  KvCacheManager m(small_config());
  ASSERT_TRUE(m.add_sequence(1, 0, iota(9)).is_ok());
  Slots slots;
  ASSERT_TRUE(m.allocate_slots(1, 9, slots).is_ok());
  EXPECT_EQ(m.prefix_cache().size(), 0);
  ASSERT_TRUE(m.mark_final(1, 5).is_ok());
  EXPECT_EQ(m.prefix_cache().blocks(), (V{0}));
  EXPECT_FALSE(m.mark_final(1, 4).is_ok());   // finality never goes back
  EXPECT_FALSE(m.mark_final(1, 10).is_ok());  // beyond the slots
  ASSERT_TRUE(m.mark_final(1, 8).is_ok());
  EXPECT_EQ(m.prefix_cache().blocks(), (V{0, 1}));
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, DivergentPromptsShareOnlyTheCommonPrefix) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(9));
  V other = iota(9);
  other[5] = 0;  // differs in block 1
  ASSERT_TRUE(m.add_sequence(2, 0, other).is_ok());
  EXPECT_EQ(m.cached_prefix_tokens(2), 4);
}

TEST(KvCacheManager, ForkSharesEveryBlockAndTheFirstWriteCopies) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(6));
  m.take_plan_ops();
  ASSERT_TRUE(m.fork(1, 2).is_ok());
  EXPECT_EQ(table(m, 2), (V{0, 1}));
  EXPECT_EQ(m.device_allocator().refcount(1), 2);
  ASSERT_TRUE(m.append_tokens(2, V{55}).is_ok());
  Slots slots;
  ASSERT_TRUE(m.allocate_slots(2, 1, slots).is_ok());
  EXPECT_EQ(table(m, 2), (V{0, 2}));
  EXPECT_EQ(table(m, 1), (V{0, 1}));
  EXPECT_EQ(slots, (Slots{10}));
  EXPECT_TRUE(check_exclusive_write(m, 2, slots).is_ok());
  const KvPlanOps ops = m.take_plan_ops();
  EXPECT_EQ(ops.block_copies, (std::vector<BlockCopy>{{1, 2}}));
  // The parent now holds block 1 alone and writes in place.
  ASSERT_TRUE(m.append_tokens(1, V{66}).is_ok());
  slots.clear();
  ASSERT_TRUE(m.allocate_slots(1, 1, slots).is_ok());
  EXPECT_EQ(slots, (Slots{6}));
  EXPECT_TRUE(m.take_plan_ops().block_copies.empty());
  EXPECT_INVARIANTS(m);
}

// I9 accepted-only cache: a truncate that drops a position of a cached block takes the block
// out of the prefix cache, so the sequence then writes its new tail in place.
TEST(KvCacheManager, TruncatingIntoACachedBlockUnregistersIt) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(8));
  EXPECT_TRUE(m.prefix_cache().contains(1));
  const int64_t generation = m.device_allocator().generation(1);
  ASSERT_TRUE(m.truncate(1, 6).is_ok());  // block 1 held positions 6 and 7
  EXPECT_FALSE(m.prefix_cache().contains(1));
  EXPECT_TRUE(m.prefix_cache().contains(0));
  EXPECT_EQ(m.rolled_back_generation(1), generation);
  ASSERT_TRUE(m.append_tokens(1, V{1, 2}).is_ok());
  Slots slots;
  ASSERT_TRUE(m.allocate_slots(1, 2, slots).is_ok());
  EXPECT_EQ(table(m, 1), (V{0, 1}));
  EXPECT_TRUE(m.take_plan_ops().block_copies.empty());
  ASSERT_TRUE(m.mark_final(1, 8).is_ok());  // final again, with the new tokens
  EXPECT_TRUE(m.prefix_cache().contains(1));
  EXPECT_EQ(m.rolled_back_generation(1), -1);
  EXPECT_INVARIANTS(m);
}

// A cached block shared with another sequence is still copied on write after the
// truncate took it out of the cache.
TEST(KvCacheManager, WritingIntoASharedBlockAfterATruncateCopiesIt) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(8));
  ASSERT_TRUE(m.fork(1, 2).is_ok());
  ASSERT_TRUE(m.truncate(1, 6).is_ok());
  EXPECT_FALSE(m.prefix_cache().contains(1));
  ASSERT_TRUE(m.append_tokens(1, V{1, 2}).is_ok());
  Slots slots;
  ASSERT_TRUE(m.allocate_slots(1, 2, slots).is_ok());
  EXPECT_EQ(table(m, 1), (V{0, 2}));
  EXPECT_EQ(m.take_plan_ops().block_copies, (std::vector<BlockCopy>{{1, 2}}));
  EXPECT_EQ(table(m, 2), (V{0, 1}));
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, TruncateReleasesOnlyWholeBlocksPastTheEnd) {
  KvCacheConfig c = small_config();
  c.enable_prefix_caching = false;
  KvCacheManager m(c);
  prefill(m, 1, iota(9));
  ASSERT_TRUE(m.truncate(1, 5).is_ok());
  EXPECT_EQ(table(m, 1), (V{0, 1}));
  ASSERT_TRUE(m.truncate(1, 4).is_ok());
  EXPECT_EQ(table(m, 1), (V{0}));
  EXPECT_EQ(m.sequence(1)->num_slots, 4);
  EXPECT_EQ(m.device_allocator().free_list(), (V{3, 4, 5, 6, 7, 2, 1}));
  ASSERT_TRUE(m.truncate(1, 0).is_ok());
  EXPECT_TRUE(table(m, 1).empty());
  EXPECT_FALSE(m.truncate(1, 1).is_ok());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, TruncatedFinalTokensAreNoLongerFinal) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(9));
  ASSERT_TRUE(m.truncate(1, 3).is_ok());
  EXPECT_EQ(m.sequence(1)->num_final, 3);
  EXPECT_EQ(m.sequence(1)->tokens.size(), 3u);
}

TEST(KvCacheManager, FailedAllocationChangesNothing) {
  KvCacheConfig c = small_config();
  c.pool.num_device_blocks = 3;
  KvCacheManager m(c);
  prefill(m, 1, iota(5));  // blocks 0, 1
  ASSERT_TRUE(m.add_sequence(2, 0, iota(8, 500)).is_ok());
  const V free_before = m.device_allocator().free_list();
  Slots slots = {42};
  EXPECT_EQ(m.can_allocate(2, 8), AllocStatus::kLater);
  const Status st = m.allocate_slots(2, 8, slots);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("LATER"), std::string::npos);
  EXPECT_EQ(slots, (Slots{42}));
  EXPECT_TRUE(table(m, 2).empty());
  EXPECT_EQ(m.sequence(2)->num_slots, 0);
  EXPECT_EQ(m.device_allocator().free_list(), free_before);
  EXPECT_TRUE(m.pending_plan_ops().empty());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, FailedCopyOnWriteChangesNothing) {
  KvCacheConfig c = small_config();
  c.pool.num_device_blocks = 2;
  KvCacheManager m(c);
  prefill(m, 1, iota(6));  // blocks 0, 1: pool full
  ASSERT_TRUE(m.fork(1, 2).is_ok());
  ASSERT_TRUE(m.append_tokens(2, V{1}).is_ok());
  Slots slots;
  EXPECT_EQ(m.can_allocate(2, 1), AllocStatus::kLater);
  EXPECT_FALSE(m.allocate_slots(2, 1, slots).is_ok());
  EXPECT_EQ(table(m, 2), (V{0, 1}));
  EXPECT_EQ(m.device_allocator().refcount(1), 2);
  EXPECT_TRUE(m.pending_plan_ops().empty());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, AllocateSlotsActsOnTheHitFindPrefixReturned) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(10));  // blocks 0, 1 full and cached, block 2 partial
  ASSERT_TRUE(m.free(1).is_ok());
  ASSERT_TRUE(m.add_sequence(2, 0, iota(10)).is_ok());
  const PrefixHit hit = m.find_prefix(2);
  EXPECT_EQ(hit.blocks, (std::vector<V>{{0, 1}}));
  EXPECT_EQ(hit.num_tokens, 8);
  EXPECT_EQ(hit.num_evictable, 2);
  EXPECT_EQ(hit.num_looked_up, 2);
  EXPECT_EQ(m.can_allocate(2, 2, hit), AllocStatus::kOk);
  EXPECT_EQ(m.can_allocate(2, 3, hit), AllocStatus::kNever);  // past the sequence's tokens
  Slots slots;
  ASSERT_EQ(m.allocate_slots(2, 2, hit, slots), AllocStatus::kOk);
  EXPECT_EQ(table(m, 2), (V{0, 1, 3}));
  EXPECT_EQ(slots, (Slots{12, 13}));
  EXPECT_EQ(m.sequence(2)->num_slots, 10);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, LookaheadTokensAreAppendedWithTheirSlotsOrNotAtAll) {
  KvCacheConfig c = small_config();
  c.pool.num_device_blocks = 4;
  c.enable_prefix_caching = false;
  KvCacheManager m(c);
  prefill(m, 9, iota(4, 900));  // block 0
  prefill(m, 1, iota(6));       // blocks 1, 2: one block left
  ASSERT_TRUE(m.append_tokens(1, V{7}).is_ok());
  const V drafts{8, 9, 10, 11, 12, 13};
  // 1 + 6 tokens are positions 6..12: two more blocks, and one is left.
  Slots slots;
  const uint64_t version = m.version();
  EXPECT_EQ(m.can_allocate(1, 1, m.find_prefix(1), 6), AllocStatus::kLater);
  EXPECT_EQ(m.allocate_slots(1, 1, m.find_prefix(1), slots, drafts), AllocStatus::kLater);
  EXPECT_TRUE(slots.empty());
  EXPECT_EQ(m.sequence(1)->tokens.size(), 7u);
  EXPECT_EQ(m.sequence(1)->num_slots, 6);
  EXPECT_EQ(table(m, 1), (V{1, 2}));
  EXPECT_EQ(m.version(), version);
  // Four drafts fit: positions 6..10, blocks 2 and 3.
  ASSERT_EQ(m.allocate_slots(1, 1, m.find_prefix(1), slots, std::span(drafts).first(4)), AllocStatus::kOk);
  EXPECT_EQ(slots, (Slots{10, 11, 12, 13, 14}));
  EXPECT_EQ(table(m, 1), (V{1, 2, 3}));
  EXPECT_EQ(m.sequence(1)->tokens, (V{100, 101, 102, 103, 104, 105, 7, 8, 9, 10, 11}));
  EXPECT_EQ(m.sequence(1)->num_slots, 11);
  EXPECT_EQ(m.sequence(1)->num_final, 6);  // drafts are never final until marked so
  EXPECT_GT(m.version(), version);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManagerDeathTest, AHitFromBeforeAStateChangeIsRefused) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(10));
  ASSERT_TRUE(m.add_sequence(2, 0, iota(10)).is_ok());
  const PrefixHit hit = m.find_prefix(2);
  ASSERT_EQ(hit.blocks[0].size(), 2u);
  ASSERT_TRUE(m.free(1).is_ok());  // the hit's blocks became evictable: its count is stale
  Slots slots;
  EXPECT_FALSE(m.is_current(hit, 2));
  EXPECT_DEATH((void)m.allocate_slots(2, 2, hit, slots), "KVP_CHECK");
  EXPECT_DEATH((void)m.can_allocate(2, 2, hit), "KVP_CHECK");
  EXPECT_TRUE(m.is_current(m.find_prefix(2), 2));
  EXPECT_DEATH((void)m.can_allocate(3, 2, m.find_prefix(2)), "KVP_CHECK");  // another sequence's hit
}

TEST(KvCacheManager, ARequestLargerThanThePoolIsNever) {
  KvCacheManager m(small_config());
  ASSERT_TRUE(m.add_sequence(1, 0, iota(33)).is_ok());
  EXPECT_EQ(m.can_allocate(1, 33), AllocStatus::kNever);
  EXPECT_EQ(m.can_allocate(1, 32), AllocStatus::kOk);
  EXPECT_EQ(m.can_allocate(99, 1), AllocStatus::kNever);
}

TEST(KvCacheManager, WatermarkAppliesToAdmissionOnly) {
  KvCacheConfig c = small_config();
  c.watermark_blocks = 2;
  KvCacheManager m(c);
  prefill(m, 1, iota(16));  // 4 of 8 blocks
  ASSERT_TRUE(m.add_sequence(2, 0, iota(9, 500)).is_ok());
  EXPECT_EQ(m.can_allocate(2, 9), AllocStatus::kLater);  // would leave 1 < 2 free
  EXPECT_EQ(m.can_allocate(2, 8), AllocStatus::kOk);
  // A running sequence may grow into the watermark.
  ASSERT_TRUE(m.append_tokens(1, iota(12)).is_ok());
  EXPECT_EQ(m.can_allocate(1, 12), AllocStatus::kOk);
  // Admission that could never respect the watermark is NEVER.
  ASSERT_TRUE(m.add_sequence(3, 0, iota(25)).is_ok());
  EXPECT_EQ(m.can_allocate(3, 25), AllocStatus::kNever);
}

TEST(KvCacheManager, SwapOutAndInMoveTheTableBetweenPools) {
  KvCacheConfig c = small_config();
  c.enable_prefix_caching = false;
  KvCacheManager m(c);
  prefill(m, 1, iota(6));
  m.take_plan_ops();
  ASSERT_TRUE(m.swap_out(1).is_ok());
  EXPECT_TRUE(m.sequence(1)->swapped);
  EXPECT_EQ(table(m, 1), (V{0, 1}));  // host blocks 0, 1
  EXPECT_EQ(m.device_allocator().num_in_use(), 0);
  EXPECT_EQ(m.host_allocator().num_in_use(), 2);
  EXPECT_EQ(m.take_plan_ops().swap_out, (std::vector<BlockCopy>{{0, 0}, {1, 1}}));
  EXPECT_INVARIANTS(m);
  Slots slots;
  EXPECT_EQ(m.can_allocate(1, 0), AllocStatus::kNever);
  EXPECT_FALSE(m.allocate_slots(1, 0, slots).is_ok());
  EXPECT_FALSE(m.swap_out(1).is_ok());
  prefill(m, 2, iota(4));  // takes device block 2
  ASSERT_TRUE(m.can_swap_in(1));
  ASSERT_TRUE(m.swap_in(1).is_ok());
  EXPECT_EQ(table(m, 1), (V{3, 4}));
  EXPECT_EQ(m.take_plan_ops().swap_in, (std::vector<BlockCopy>{{0, 3}, {1, 4}}));
  EXPECT_EQ(m.host_allocator().num_in_use(), 0);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, SwapOutWithoutHostRoomChangesNothing) {
  KvCacheConfig c = small_config();
  c.pool.num_host_blocks = 1;
  KvCacheManager m(c);
  prefill(m, 1, iota(6));
  m.take_plan_ops();
  EXPECT_FALSE(m.swap_out(1).is_ok());
  EXPECT_FALSE(m.sequence(1)->swapped);
  EXPECT_EQ(table(m, 1), (V{0, 1}));
  EXPECT_TRUE(m.pending_plan_ops().empty());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, SharedBlocksSurviveOneHoldersSwapOut) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(6));
  ASSERT_TRUE(m.fork(1, 2).is_ok());
  ASSERT_TRUE(m.swap_out(2).is_ok());
  EXPECT_EQ(m.device_allocator().refcount(0), 1);
  EXPECT_EQ(m.device_allocator().refcount(1), 1);
  EXPECT_INVARIANTS(m);
  ASSERT_TRUE(m.free(2).is_ok());
  EXPECT_EQ(m.host_allocator().num_in_use(), 0);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, PoisonOnFreeListsFreedButNotCachedBlocks) {
  KvCacheConfig c = small_config();
  c.poison_on_free = true;
  KvCacheManager m(c);
  prefill(m, 1, iota(6));  // block 0 cached (full, final), block 1 partial
  m.take_plan_ops();
  ASSERT_TRUE(m.free(1).is_ok());
  EXPECT_EQ(m.take_plan_ops().poison, (V{1}));
  m.flush_prefix_cache();
  EXPECT_EQ(m.take_plan_ops().poison, (V{0}));
  EXPECT_TRUE(check_all_free(m).is_ok());
}

TEST(KvCacheManager, ACopyDestinationIsNotPoisonedInTheSameStep) {
  KvCacheConfig c = small_config();
  c.pool.num_device_blocks = 3;
  c.poison_on_free = true;
  c.enable_prefix_caching = false;
  KvCacheManager m(c);
  prefill(m, 1, iota(6));  // blocks 0, 1
  prefill(m, 3, iota(1));  // block 2
  ASSERT_TRUE(m.fork(1, 2).is_ok());
  m.take_plan_ops();
  ASSERT_TRUE(m.free(3).is_ok());  // poison 2
  ASSERT_TRUE(m.append_tokens(2, V{9}).is_ok());
  Slots slots;
  ASSERT_TRUE(m.allocate_slots(2, 1, slots).is_ok());  // copy 1 -> 2
  const KvPlanOps ops = m.take_plan_ops();
  EXPECT_EQ(ops.block_copies, (std::vector<BlockCopy>{{1, 2}}));
  EXPECT_TRUE(ops.poison.empty());
}

TEST(KvCacheManager, TinyHashCollisionsNeverShareForeignBlocks) {
  KvCacheConfig c = small_config();
  c.pool.num_device_blocks = 64;
  c.hash_bits = 1;
  KvCacheManager m(c);
  for (int s = 0; s < 8; ++s) prefill(m, s, iota(9, 1000 * s));
  for (int s = 0; s < 8; ++s) {
    ASSERT_TRUE(m.add_sequence(100 + s, 0, iota(9, 1000 * s)).is_ok());
    EXPECT_EQ(m.cached_prefix_tokens(100 + s), 8);
    Slots slots;
    ASSERT_TRUE(m.allocate_slots(100 + s, 1, slots).is_ok());
    EXPECT_EQ(table(m, 100 + s)[0], table(m, s)[0]);
    EXPECT_EQ(table(m, 100 + s)[1], table(m, s)[1]);
  }
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, ErrorsNameTheSequenceAndChangeNothing) {
  KvCacheManager m(small_config());
  ASSERT_TRUE(m.add_sequence(1, 0, iota(2)).is_ok());
  const Status dup = m.add_sequence(1, 0, iota(2));
  ASSERT_FALSE(dup.is_ok());
  EXPECT_NE(dup.message().find("seq 1"), std::string::npos);
  EXPECT_FALSE(m.free(2).is_ok());
  EXPECT_FALSE(m.fork(2, 3).is_ok());
  EXPECT_FALSE(m.fork(1, 1).is_ok());
  EXPECT_FALSE(m.swap_in(1).is_ok());
  EXPECT_FALSE(m.append_tokens(9, V{1}).is_ok());
  EXPECT_EQ(m.num_sequences(), 1);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, ConfigValidationNamesTheField) {
  KvCacheConfig c = small_config();
  c.pool.block_size = 0;
  EXPECT_NE(validate(c).message().find("block_size"), std::string::npos);
  c = small_config();
  c.hash_bits = 0;
  EXPECT_NE(validate(c).message().find("hash_bits"), std::string::npos);
  c = small_config();
  c.watermark_blocks = 9;
  EXPECT_FALSE(validate(c).is_ok());
}

TEST(KvCacheManager, EverythingFreedAndFlushedLeavesAnEmptyPool) {
  KvCacheManager m(small_config());
  prefill(m, 1, iota(9));
  prefill(m, 2, iota(9));
  ASSERT_TRUE(m.fork(2, 3).is_ok());
  ASSERT_TRUE(m.swap_out(3).is_ok());
  for (SeqId s : {1, 2, 3}) ASSERT_TRUE(m.free(s).is_ok());
  EXPECT_TRUE(check_no_leak(m).is_ok());
  EXPECT_FALSE(check_all_free(m).is_ok());  // cached blocks remain evictable
  m.flush_prefix_cache();
  const Status st = check_all_free(m);
  EXPECT_TRUE(st.is_ok()) << st.message();
}

}  // namespace
}  // namespace kvp
