#include "optimized/kv/block_allocator.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvp {
namespace {

using V = std::vector<int32_t>;

TEST(BlockAllocator, StartsWithAllBlocksFreeInIdOrder) {
  BlockAllocator a(4);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(a.num_in_use(), 0);
  EXPECT_EQ(a.free_list(), (V{0, 1, 2, 3}));
  EXPECT_EQ(a.next_victim(), 0);
}

TEST(BlockAllocator, AllocateTakesTheHeadAndReleaseAppendsToTheTail) {
  BlockAllocator a(4);
  EXPECT_EQ(a.allocate().block, 0);
  EXPECT_EQ(a.allocate().block, 1);
  EXPECT_EQ(a.free_list(), (V{2, 3}));
  EXPECT_TRUE(a.release(0));
  EXPECT_EQ(a.free_list(), (V{2, 3, 0}));
  EXPECT_EQ(a.state(0), BlockState::kFree);
  EXPECT_EQ(a.state(1), BlockState::kInUse);
  EXPECT_EQ(a.num_in_use(), 1);
}

TEST(BlockAllocator, RefcountCountsRetainsAndReleases) {
  BlockAllocator a(2);
  const int32_t b = a.allocate().block;
  a.retain(b);
  EXPECT_EQ(a.refcount(b), 2);
  EXPECT_FALSE(a.release(b));
  EXPECT_EQ(a.refcount(b), 1);
  EXPECT_TRUE(a.release(b));
  EXPECT_EQ(a.refcount(b), 0);
  EXPECT_EQ(a.state(b), BlockState::kFree);
}

TEST(BlockAllocator, GenerationMakesStaleHandlesDetectable) {
  BlockAllocator a(1);
  const int32_t b = a.allocate().block;
  const BlockHandle h = a.handle(b);
  EXPECT_TRUE(a.is_current(h));
  a.release(b);
  EXPECT_TRUE(a.is_current(h));  // not reused yet
  a.allocate();
  EXPECT_FALSE(a.is_current(h));
}

// A handle outlives an eviction: a cached block, released (evictable), revived by a
// prefix-cache hit (retain: same content, the handle stays current), released again, then
// evicted and handed out to a new owner. That last hand-out must change the generation, so
// a (block, generation) handle held across the eviction is refused as stale.
TEST(BlockAllocator, HandleHeldAcrossAnEvictionIsStale) {
  BlockAllocator a(1);
  const int32_t b = a.allocate().block;
  a.mark_cached(b);
  const BlockHandle h = a.handle(b);
  a.release(b);
  ASSERT_EQ(a.state(b), BlockState::kEvictable);
  EXPECT_TRUE(a.is_current(h));
  a.retain(b);  // a prefix-cache hit on the released block: still the same content
  EXPECT_TRUE(a.is_current(h));
  a.release(b);
  const BlockAllocator::Allocation again = a.allocate();
  ASSERT_EQ(again.block, b);
  ASSERT_TRUE(again.evicted);  // the only block: taken from the evictable list
  EXPECT_FALSE(a.is_current(h));
  EXPECT_NE(a.generation(b), h.generation);
}

TEST(BlockAllocator, FreshBlocksAreReusedBeforeEvictableOnes) {
  BlockAllocator a(3);
  const int32_t b0 = a.allocate().block;
  const int32_t b1 = a.allocate().block;
  a.mark_cached(b0);
  a.release(b0);  // evictable
  a.release(b1);  // free
  EXPECT_EQ(a.free_list(), (V{2, 1}));
  EXPECT_EQ(a.evictable_list(), (V{0}));
  EXPECT_EQ(a.allocate().block, 2);
  auto c = a.allocate();
  EXPECT_EQ(c.block, 1);
  EXPECT_FALSE(c.evicted);
  auto d = a.allocate();
  EXPECT_EQ(d.block, 0);
  EXPECT_TRUE(d.evicted);
  EXPECT_FALSE(a.is_cached(0));
}

TEST(BlockAllocator, EvictableBlocksLeaveInLeastRecentlyReleasedOrder) {
  BlockAllocator a(3);
  for (int i = 0; i < 3; ++i) a.mark_cached(a.allocate().block);
  a.release(2);
  a.release(0);
  a.release(1);
  EXPECT_EQ(a.evictable_list(), (V{2, 0, 1}));
  EXPECT_EQ(a.lru_evictable(), 2);
  EXPECT_EQ(a.allocate().block, 2);
  EXPECT_EQ(a.allocate().block, 0);
}

TEST(BlockAllocator, RetainOfAnEvictableBlockRemovesItFromTheMiddle) {
  BlockAllocator a(3);
  for (int i = 0; i < 3; ++i) a.mark_cached(a.allocate().block);
  a.release(0);
  a.release(1);
  a.release(2);
  a.retain(1);
  EXPECT_EQ(a.evictable_list(), (V{0, 2}));
  EXPECT_EQ(a.state(1), BlockState::kInUse);
  EXPECT_TRUE(a.is_cached(1));
  a.release(1);
  EXPECT_EQ(a.evictable_list(), (V{0, 2, 1}));
}

TEST(BlockAllocator, ClearCachedMovesAnEvictableBlockToTheFreeTail) {
  BlockAllocator a(2);
  const int32_t b = a.allocate().block;
  a.mark_cached(b);
  a.release(b);
  a.clear_cached(b);
  EXPECT_EQ(a.free_list(), (V{1, 0}));
  EXPECT_TRUE(a.evictable_list().empty());
  EXPECT_EQ(a.state(b), BlockState::kFree);
}

TEST(BlockAllocator, EmptyPoolHasNoVictim) {
  BlockAllocator a(0);
  EXPECT_EQ(a.num_available(), 0);
  EXPECT_EQ(a.next_victim(), -1);
}

TEST(BlockAllocatorDeathTest, ReleasingAFreeBlockAborts) {
  BlockAllocator a(1);
  EXPECT_DEATH(a.release(0), "KVP_CHECK");
}

}  // namespace
}  // namespace kvp
