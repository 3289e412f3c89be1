#include "kernels/kv_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

namespace kvp::kernels {
namespace {

TEST(KvIndex, BlocksForTokensIsCeilingDivision) {
  EXPECT_EQ(blocks_for_tokens(0, 16), 0);
  EXPECT_EQ(blocks_for_tokens(1, 16), 1);
  EXPECT_EQ(blocks_for_tokens(16, 16), 1);
  EXPECT_EQ(blocks_for_tokens(17, 16), 2);
  EXPECT_EQ(blocks_for_tokens(5, 1), 5);
}

TEST(KvIndex, PositionSplitsIntoBlockIndexAndOffset) {
  EXPECT_EQ(block_index_of(0, 4), 0);
  EXPECT_EQ(offset_in_block(0, 4), 0);
  EXPECT_EQ(block_index_of(3, 4), 0);
  EXPECT_EQ(offset_in_block(3, 4), 3);
  EXPECT_EQ(block_index_of(4, 4), 1);
  EXPECT_EQ(offset_in_block(4, 4), 0);
}

TEST(KvIndex, SlotFollowsTheTableFormula) {
  const std::vector<int32_t> table = {7, 2, 9};
  EXPECT_EQ(slot_of(table.data(), 0, 4), 28);
  EXPECT_EQ(slot_of(table.data(), 3, 4), 31);
  EXPECT_EQ(slot_of(table.data(), 4, 4), 8);
  EXPECT_EQ(slot_of(table.data(), 9, 4), 37);
  EXPECT_EQ(block_of_slot(37, 4), 9);
}

TEST(KvIndex, DistinctBlocksGiveDistinctSlotsForEveryPosition) {
  const std::vector<int32_t> table = {3, 0, 5, 1};
  std::set<int64_t> slots;
  for (int64_t p = 0; p < 4 * 8; ++p) {
    const int64_t s = slot_of(table.data(), p, 8);
    EXPECT_TRUE(slots.insert(s).second) << "position " << p;
    EXPECT_EQ(block_of_slot(s, 8), table[static_cast<size_t>(p / 8)]);
    EXPECT_EQ(s % 8, p % 8);
  }
}

static_assert(slot_of_block(3, 1, 16) == 49);
static_assert(kSkipSlot == -1);

}  // namespace
}  // namespace kvp::kernels
