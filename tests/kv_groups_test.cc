// KV-cache groups in the paged KV cache (KvCacheConfig::group_windows): one block table per
// group over one pool, each group's window releasing its own table's entries. The numbers
// are worked out by hand from the window's definition (a token at position p attends to
// max(0, p - W + 1) .. p); the four group invariants (I11 per group, I12, I13) are shown
// failing on planted states.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "kernels/kv_index.h"
#include "optimized/checkers/invariants.h"
#include "optimized/kv/kv_cache_manager.h"
#include "tests/kv_cache_manager_test_peer.h"

namespace kvp {
namespace {

using V = std::vector<int32_t>;
using Peer = KvCacheManagerTestPeer;

// Block size 4; group 0 full attention, groups 1 and 2 a window of 6 (Gemma's layout: the
// sliding layers split into groups as large as the full one).
KvCacheConfig groups_config(bool prefix_caching = true, int32_t device_blocks = 48) {
  KvCacheConfig c;
  c.pool.block_size = 4;
  c.pool.num_device_blocks = device_blocks;
  c.pool.num_host_blocks = 24;
  c.enable_prefix_caching = prefix_caching;
  c.poison_on_free = true;
  c.group_windows = {0, 6, 6};
  return c;
}

V prompt(int n, int32_t first = 1) {
  V v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

struct Slots {
  std::vector<std::vector<int64_t>> by_group = std::vector<std::vector<int64_t>>(3);
  std::span<std::vector<int64_t>> span() { return by_group; }
};

AllocStatus allocate(KvCacheManager& m, SeqId s, int64_t n, Slots& slots) {
  return m.allocate_slots(s, n, m.find_prefix(s), slots.span());
}

// Group g's table of sequence s: entries [0, released) are kNoBlock, the rest are blocks.
void expect_released(const KvCacheManager& m, SeqId s, int64_t g, int64_t released, int64_t size) {
  const GroupTable& gt = m.sequence(s)->group(g);
  ASSERT_EQ(gt.table.size(), size) << "group " << g;
  for (int64_t j = 0; j < size; ++j) {
    if (j < released) {
      EXPECT_EQ(gt.table[j], kNoBlock) << "group " << g << " entry " << j;
    } else {
      EXPECT_NE(gt.table[j], kNoBlock) << "group " << g << " entry " << j;
    }
  }
  EXPECT_EQ(gt.num_window_released, released) << "group " << g;
}

#define EXPECT_OK(st)                          \
  do {                                         \
    const Status st_ = (st);                   \
    EXPECT_TRUE(st_.is_ok()) << st_.message(); \
  } while (0)

void expect_fails(const Status& st, const std::string& with) {
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(with), std::string::npos) << st.message();
}

TEST(KvGroups, EachGroupHasItsOwnTableOverOnePoolAndOnlyAWindowedGroupReleases) {
  KvCacheManager m(groups_config(/*prefix_caching=*/false));
  Slots slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(20)).is_ok());
  ASSERT_EQ(allocate(m, 1, 20, slots), AllocStatus::kOk);
  // 20 positions: 5 blocks in each of the 3 tables, 15 distinct blocks of the one pool.
  std::set<int32_t> blocks;
  for (int64_t g = 0; g < 3; ++g) {
    const BlockTable& t = m.sequence(1)->group(g).table;
    ASSERT_EQ(t.size(), 5);
    blocks.insert(t.blocks().begin(), t.blocks().end());
    // Each group's slots are its own table's: position p in block t[p / 4] at offset p % 4.
    ASSERT_EQ(slots.by_group[static_cast<size_t>(g)].size(), 20u);
    for (int64_t p = 0; p < 20; ++p) {
      EXPECT_EQ(slots.by_group[static_cast<size_t>(g)][static_cast<size_t>(p)], int64_t{t[p / 4]} * 4 + p % 4);
    }
  }
  EXPECT_EQ(blocks.size(), 15u);
  EXPECT_EQ(m.device_allocator().num_free(), 48 - 15);
  EXPECT_OK(check_all(m));
  // 20 final: the next token (20) attends from 15, in block 3. The windowed groups release
  // blocks 0..2 each (6 blocks, poisoned); the full group keeps all 5.
  ASSERT_TRUE(m.mark_final(1, 20).is_ok());
  expect_released(m, 1, 0, 0, 5);
  expect_released(m, 1, 1, 3, 5);
  expect_released(m, 1, 2, 3, 5);
  EXPECT_EQ(m.device_allocator().num_free(), 48 - 9);
  EXPECT_EQ(m.take_plan_ops().poison.size(), 6u);
  EXPECT_OK(check_all(m));
  // Decode to 26 final: the next token (26) attends from 21, in block 5: 5 released per
  // windowed group, 7 entries per table; held 7 + 2 + 2.
  for (int32_t t = 20; t < 26; ++t) {
    ASSERT_TRUE(m.append_tokens(1, V{100 + t}).is_ok());
    ASSERT_EQ(allocate(m, 1, 1, slots), AllocStatus::kOk);
    ASSERT_TRUE(m.mark_final(1, t + 1).is_ok());
    EXPECT_OK(check_all(m));
  }
  expect_released(m, 1, 0, 0, 7);
  expect_released(m, 1, 1, 5, 7);
  expect_released(m, 1, 2, 5, 7);
  EXPECT_EQ(m.device_allocator().num_in_use(), 7 + 2 + 2);
  ASSERT_TRUE(m.free(1).is_ok());
  EXPECT_OK(check_all_free(m));
}

TEST(KvGroups, AChunkedPrefillHoldsTheFullTableAndTwoWindowsNotThreeFullTables) {
  // 100 tokens are 25 blocks per table. At once, every table needs all 25 before anything
  // is final: 75 > 48 blocks, never. In chunks of 8, each marked final, a windowed table
  // holds at most the window's blocks and the chunk's: 25 + 2 + 2 = 29 at the end.
  KvCacheManager m(groups_config(/*prefix_caching=*/false));
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(100)).is_ok());
  EXPECT_EQ(m.can_allocate(1, 100), AllocStatus::kNever);
  Slots slots;
  int32_t peak = 0;
  for (int64_t done = 0; done < 100; done += 8) {
    const int64_t n = std::min<int64_t>(8, 100 - done);
    ASSERT_EQ(allocate(m, 1, n, slots), AllocStatus::kOk) << "at " << done;
    peak = std::max(peak, m.device_allocator().num_in_use());
    ASSERT_TRUE(m.mark_final(1, done + n).is_ok());
    EXPECT_OK(check_all(m));
  }
  // 100 final: position 100 attends from 95, in block 23: 23 released per windowed table.
  expect_released(m, 1, 1, 23, 25);
  expect_released(m, 1, 2, 23, 25);
  EXPECT_EQ(m.device_allocator().num_in_use(), 25 + 2 + 2);
  // The peak: the last full chunk (88..96) before its positions were final: 24 full-group
  // blocks; each windowed table released (88 - 5) / 4 = 20 of 24.
  EXPECT_EQ(peak, 24 + 4 + 4);
}

TEST(KvGroups, APrefixHitIsWhatEveryGroupServesAndKeepsOnlyTheWindowsBlocks) {
  KvCacheManager m(groups_config());
  Slots slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(21)).is_ok());
  ASSERT_EQ(allocate(m, 1, 21, slots), AllocStatus::kOk);
  ASSERT_TRUE(m.mark_final(1, 21).is_ok());
  ASSERT_TRUE(m.free(1).is_ok());
  // The same 21 tokens: 5 blocks in every group (the last token is recomputed). The windowed
  // groups' blocks 0..2 were released by the window and stay cached: their chains reach the
  // root. Kept: the full group's 5 and blocks 3, 4 of each windowed group, all refcount 0.
  ASSERT_TRUE(m.add_sequence(2, 0, prompt(21)).is_ok());
  const PrefixHit hit = m.find_prefix(2);
  EXPECT_OK(check_prefix_hit(m, hit));
  ASSERT_EQ(hit.num_tokens, 20);
  ASSERT_EQ(hit.blocks.size(), 3u);
  for (const V& chain : hit.blocks) EXPECT_EQ(chain.size(), 5u);
  EXPECT_EQ(hit.num_evictable, 5 + 2 + 2);
  EXPECT_EQ(hit.num_looked_up, 15);
  ASSERT_EQ(m.allocate_slots(2, 1, hit, slots.span()), AllocStatus::kOk);
  // Position 20 attends from 15: the windowed groups give entries 0..2 straight back.
  expect_released(m, 2, 0, 0, 6);
  expect_released(m, 2, 1, 3, 6);
  expect_released(m, 2, 2, 3, 6);
  EXPECT_OK(check_all(m));
  ASSERT_TRUE(m.free(2).is_ok());

  // The six least recently released blocks are groups 1 and 2's blocks 0..2 (released
  // first, by the windows). Evicted, the hit is still 20 tokens: a windowed group's blocks are
  // registered under the full group's block of the same positions, so its window is found
  // without the blocks before it (vLLM #48435: a hybrid model's hit rate falls to zero when
  // they must chain from the root, as they are the first evicted). Those entries are -1.
  for (int64_t g = 1; g <= 2; ++g) {
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(hit.blocks[static_cast<size_t>(g)][j], kNoBlock);
  }
  const int32_t g1_third = hit.blocks[1][3];
  ASSERT_TRUE(m.add_sequence(9, 0, prompt(13)).is_ok());  // positions 12: a hit of 3 blocks
  const PrefixHit early = m.find_prefix(9);
  ASSERT_EQ(early.num_tokens, 12);
  const std::vector<int32_t> released{early.blocks[1][0], early.blocks[1][1], early.blocks[1][2],
                                      early.blocks[2][0], early.blocks[2][1], early.blocks[2][2]};
  ASSERT_TRUE(m.free(9).is_ok());
  ASSERT_EQ(m.evict_cached(6), 6);
  for (int32_t b : released) EXPECT_FALSE(m.prefix_cache().contains(b)) << b;
  ASSERT_TRUE(m.add_sequence(3, 0, prompt(21)).is_ok());
  const PrefixHit again = m.find_prefix(3);
  EXPECT_OK(check_prefix_hit(m, again));
  EXPECT_EQ(again.num_tokens, 20);
  EXPECT_EQ(again.blocks[1][3], g1_third);
  ASSERT_EQ(m.allocate_slots(3, 1, again, slots.span()), AllocStatus::kOk);
  expect_released(m, 3, 1, 3, 6);
  EXPECT_OK(check_all(m));
  // A shorter prompt needs the evicted blocks (13 tokens: 3 blocks, the window of position
  // 12 starts at 7, in block 1): group 1 serves none of them, nor any shorter hit's.
  ASSERT_TRUE(m.add_sequence(4, 0, prompt(13)).is_ok());
  const PrefixHit none = m.find_prefix(4);
  EXPECT_OK(check_prefix_hit(m, none));
  EXPECT_EQ(none.num_tokens, 0);
}

TEST(KvGroups, AHitShorterInOneGroupIsCutToItInEveryGroup) {
  KvCacheManager m(groups_config());
  Slots slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(21)).is_ok());
  ASSERT_EQ(allocate(m, 1, 21, slots), AllocStatus::kOk);
  ASSERT_TRUE(m.mark_final(1, 21).is_ok());
  // Group 2's block 4 leaves the cache (a rolled-back tail would do the same): group 2
  // serves 4 blocks, so the hit is 4 blocks in every group.
  const int32_t g2_last = m.sequence(1)->group(2).table[4];
  ASSERT_TRUE(m.free(1).is_ok());
  Peer::cache(m).erase(g2_last);
  Peer::device(m).clear_cached(g2_last);
  ASSERT_TRUE(m.add_sequence(2, 0, prompt(21)).is_ok());
  const PrefixHit hit = m.find_prefix(2);
  EXPECT_OK(check_prefix_hit(m, hit));
  EXPECT_EQ(hit.num_tokens, 16);
  for (const V& chain : hit.blocks) EXPECT_EQ(chain.size(), 4u);
}

TEST(KvGroups, SwapForkAndTruncateWorkPerGroup) {
  KvCacheManager m(groups_config());
  Slots slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(22)).is_ok());
  ASSERT_EQ(allocate(m, 1, 22, slots), AllocStatus::kOk);
  ASSERT_TRUE(m.mark_final(1, 22).is_ok());  // 22 attends from 17 (block 4): 4 released
  // Fork: the child shares every group's blocks; its first write copies the shared partial
  // last block (block 5, positions 20..21) in every group: 3 copies.
  ASSERT_TRUE(m.fork(1, 2).is_ok());
  EXPECT_OK(check_all(m));
  (void)m.take_plan_ops();
  ASSERT_TRUE(m.append_tokens(2, V{7}).is_ok());
  ASSERT_EQ(allocate(m, 2, 1, slots), AllocStatus::kOk);
  EXPECT_EQ(m.take_plan_ops().block_copies.size(), 3u);
  EXPECT_OK(check_all(m));
  // A truncate back into a released window is refused, naming the group; one that keeps the
  // released entries released is not.
  const Status back = m.truncate(2, 12);
  expect_fails(back, "group 1");
  EXPECT_TRUE(m.truncate(2, 22).is_ok());
  EXPECT_OK(check_all(m));
  // Swap out: only the live entries move, 6 + 2 + 2 = 10 host blocks; back in, the same.
  ASSERT_TRUE(m.free(2).is_ok());
  ASSERT_TRUE(m.swap_out(1).is_ok());
  EXPECT_EQ(m.host_allocator().num_in_use(), 10);
  expect_released(m, 1, 0, 0, 6);
  expect_released(m, 1, 1, 4, 6);
  EXPECT_OK(check_all(m));
  ASSERT_TRUE(m.can_swap_in(1));
  ASSERT_TRUE(m.swap_in(1).is_ok());
  EXPECT_EQ(m.host_allocator().num_in_use(), 0);
  expect_released(m, 1, 2, 4, 6);
  EXPECT_OK(check_all(m));
  ASSERT_TRUE(m.free(1).is_ok());
  m.flush_prefix_cache();
  EXPECT_OK(check_all_free(m));
}

// --- the invariants, failing on planted states ---

// Sequence 1, 20 positions final, in the groups config (no prefix caching).
KvCacheManager& twenty_final(KvCacheManager& m) {
  Slots slots;
  EXPECT_TRUE(m.add_sequence(1, 0, prompt(20)).is_ok());
  EXPECT_EQ(allocate(m, 1, 20, slots), AllocStatus::kOk);
  EXPECT_TRUE(m.mark_final(1, 20).is_ok());
  EXPECT_TRUE(check_all(m).is_ok());
  return m;
}

TEST(KvGroupsPlanted, AWindowBlockFreedOneBlockEarlyFailsI11ForItsGroup) {
  KvCacheManager m(groups_config(false));
  twenty_final(m);
  // Group 2's entry 3 (positions 12..15), which position 20 reads (from 15), released.
  GroupTable& gt = Peer::seq(m, 1).group(2);
  const int32_t b = gt.table[3];
  gt.table.set(3, kNoBlock);
  gt.num_window_released = 4;
  ASSERT_TRUE(Peer::device(m).release(b));
  expect_fails(check_window_blocks(m), "I11: sequence 1 group 2");
  expect_fails(check_all(m), "I11");
}

TEST(KvGroupsPlanted, AWindowedGroupKeepingABlockNoTokenReadsFailsI11) {
  KvCacheManager m(groups_config(false));
  twenty_final(m);
  // Group 1 says it released 2 entries where the window left 3 behind, and holds entry 2.
  GroupTable& gt = Peer::seq(m, 1).group(1);
  const int32_t b = Peer::device(m).allocate().block;
  gt.table.set(2, b);
  gt.num_window_released = 2;
  expect_fails(check_window_blocks(m), "I11: sequence 1 group 1");
}

TEST(KvGroupsPlanted, AHitThatKeepsTooFewWindowBlocksFailsI11) {
  KvCacheManager m(groups_config());
  Slots slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(21)).is_ok());
  ASSERT_EQ(allocate(m, 1, 21, slots), AllocStatus::kOk);
  ASSERT_TRUE(m.mark_final(1, 21).is_ok());
  ASSERT_TRUE(m.add_sequence(2, 0, prompt(21)).is_ok());
  ASSERT_EQ(allocate(m, 2, 1, slots), AllocStatus::kOk);  // a hit of 20
  ASSERT_TRUE(check_all(m).is_ok());
  // The hit gave back one window block too many in group 1: entry 3 (12..15), which the
  // first new token (20, from 15) reads.
  GroupTable& gt = Peer::seq(m, 2).group(1);
  const int32_t b = gt.table[3];
  gt.table.set(3, kNoBlock);
  gt.num_window_released = 4;
  (void)Peer::device(m).release(b);
  expect_fails(check_all(m), "I11: sequence 2 group 1");
}

TEST(KvGroupsPlanted, AGroupTableLeftOneBlockLongFailsI12) {
  KvCacheManager m(groups_config(false));
  twenty_final(m);
  Peer::seq(m, 1).group(2).table.push_back(Peer::device(m).allocate().block);
  expect_fails(check_group_tables(m), "I12: sequence 1's table in KV-cache group 2 has 6 entries");
  expect_fails(check_all(m), "I12");
  // One group short of the config.
  KvCacheManager m2(groups_config(false));
  twenty_final(m2);
  Peer::seq(m2, 1).groups.pop_back();
  expect_fails(check_group_tables(m2), "2 block tables for 3 KV-cache groups");
}

TEST(KvGroupsPlanted, ABlockInTwoGroupsFailsI12) {
  KvCacheManager m(groups_config(false));
  twenty_final(m);
  ASSERT_TRUE(m.add_sequence(2, 0, prompt(20)).is_ok());
  Slots slots;
  ASSERT_EQ(allocate(m, 2, 4, slots), AllocStatus::kOk);
  // Sequence 2's group 1 table names sequence 1's group 0 block 0 (same index, tokens).
  SequenceState& s2 = Peer::seq(m, 2);
  const int32_t mine = s2.group(1).table[0];
  const int32_t theirs = m.sequence(1)->group(0).table[0];
  s2.group(1).table.set(0, theirs);
  Peer::device(m).retain(theirs);
  (void)Peer::device(m).release(mine);
  expect_fails(check_isolation(m), "I12: block " + std::to_string(theirs));
}

TEST(KvGroupsPlanted, HitsThatAreNotTheRuleFailI13) {
  KvCacheManager m(groups_config());
  Slots slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(21)).is_ok());
  ASSERT_EQ(allocate(m, 1, 21, slots), AllocStatus::kOk);
  ASSERT_TRUE(m.mark_final(1, 21).is_ok());
  ASSERT_TRUE(m.add_sequence(3, 0, prompt(17)).is_ok());
  ASSERT_TRUE(m.add_sequence(2, 0, prompt(21)).is_ok());
  const PrefixHit shorter = m.find_prefix(3);
  const PrefixHit hit = m.find_prefix(2);
  ASSERT_TRUE(check_prefix_hit(m, hit).is_ok());
  ASSERT_TRUE(check_prefix_hit(m, shorter).is_ok());
  ASSERT_EQ(hit.num_tokens, 20);
  ASSERT_EQ(shorter.num_tokens, 16);
  ASSERT_NE(shorter.blocks[2][2], kNoBlock);  // its window (from 11) needs block 2
  // One group's chain a block short.
  PrefixHit short_group = hit;
  short_group.blocks[2].pop_back();
  expect_fails(check_prefix_hit(m, short_group), "group 2's chain has 4 blocks for 20 tokens");
  // A well-formed hit one block shorter (what a 17-token prompt gets): every group serves
  // the longer one, so it is not maximal.
  PrefixHit short_hit = shorter;
  short_hit.seq = 2;
  expect_fails(check_prefix_hit(m, short_hit), "stops at 4 blocks, but every group serves 5");
  // A window's block replaced by the anchor's own: not a block of that group.
  PrefixHit crossed = hit;
  crossed.blocks[1][3] = hit.blocks[0][3];
  expect_fails(check_prefix_hit(m, crossed), "a windowed group's block is not a cached block of that group");
  // A block taken before the window of the first new position (20: the window starts at 15).
  PrefixHit early = hit;
  early.blocks[2][2] = shorter.blocks[2][2];
  expect_fails(check_prefix_hit(m, early), "group 2 takes block " + std::to_string(shorter.blocks[2][2]) +
                                               " at index 2, before the window of position 20");
  // Past the last token: at most (21 - 1) / 4 = 5 blocks.
  PrefixHit too_long = hit;
  too_long.num_tokens = 24;
  expect_fails(check_prefix_hit(m, too_long), "at most 5 whole blocks");
}

}  // namespace
}  // namespace kvp
