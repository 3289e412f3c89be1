// The sliding window in the paged KV cache (KvCacheConfig::sliding_window): which table
// entries are released and when, stated from the window's definition with the numbers worked
// out by hand; I11 (check_window_blocks, check_plan) failing on planted states; the event-log
// replayer's window_release.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "optimized/checkers/event_log_replay.h"
#include "optimized/checkers/invariants.h"
#include "optimized/kv/kv_cache_manager.h"
#include "tests/kv_cache_manager_test_peer.h"

namespace kvp {
namespace {

using V = std::vector<int32_t>;

// Block size 4, window 6: a token at position p attends to max(0, p - 5) .. p.
KvCacheConfig window_config(bool prefix_caching) {
  KvCacheConfig c;
  c.pool.block_size = 4;
  c.pool.num_device_blocks = 16;
  c.pool.num_host_blocks = 8;
  c.enable_prefix_caching = prefix_caching;
  c.poison_on_free = true;
  c.sliding_window = 6;
  return c;
}

V prompt(int n, int32_t first = 1) {
  V v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

void expect_released(const KvCacheManager& m, SeqId s, int64_t n) {
  const SequenceState* st = m.sequence(s);
  ASSERT_NE(st, nullptr);
  for (int64_t j = 0; j < st->table().size(); ++j) {
    if (j < n) {
      EXPECT_EQ(st->table()[j], kNoBlock) << "entry " << j;
    } else {
      EXPECT_NE(st->table()[j], kNoBlock) << "entry " << j;
    }
  }
  EXPECT_EQ(st->group(0).num_window_released, n);
}

TEST(KvWindow, EntriesWhollyBeforeTheNextTokensWindowAreReleasedAsPositionsTurnFinal) {
  KvCacheManager m(window_config(/*prefix_caching=*/false));
  std::vector<int64_t> slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(20)).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 20, slots).is_ok());
  // Slots alone release nothing: no position is final yet.
  expect_released(m, 1, 0);
  EXPECT_EQ(m.device_allocator().num_free(), 16 - 5);
  // 20 final: the next token (position 20) attends from 15, in block 3: blocks 0, 1, 2
  // (positions 0..11) are released and poisoned.
  ASSERT_TRUE(m.mark_final(1, 20).is_ok());
  expect_released(m, 1, 3);
  EXPECT_EQ(m.device_allocator().num_free(), 16 - 2);
  EXPECT_EQ(m.take_plan_ops().poison.size(), 3u);
  EXPECT_TRUE(check_all(m).is_ok()) << check_all(m).message();
  // Position 20 decoded and final: 21 attends from 16, block 4's first position: block 3
  // (12..15) goes too.
  ASSERT_TRUE(m.append_tokens(1, V{99}).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 1, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 21).is_ok());
  expect_released(m, 1, 4);
  EXPECT_TRUE(check_all(m).is_ok()) << check_all(m).message();
  // A truncate that would need released positions back is refused, changing nothing; one
  // that keeps them released is not (n-best trimming, speculative rollback).
  EXPECT_FALSE(m.truncate(1, 15).is_ok());
  EXPECT_EQ(m.sequence(1)->tokens.size(), 21u);
  EXPECT_TRUE(m.truncate(1, 21).is_ok());
  // Swapped out and in: only the live entries move.
  ASSERT_TRUE(m.swap_out(1).is_ok());
  expect_released(m, 1, 4);
  EXPECT_EQ(m.host_allocator().num_free(), 8 - 2);
  ASSERT_TRUE(m.swap_in(1).is_ok());
  expect_released(m, 1, 4);
  EXPECT_TRUE(check_all(m).is_ok()) << check_all(m).message();
  ASSERT_TRUE(m.free(1).is_ok());
  EXPECT_TRUE(check_all_free(m).is_ok()) << check_all_free(m).message();
}

TEST(KvWindow, APrefixHitKeepsOnlyTheBlocksTheWindowOfItsFirstNewTokenNeeds) {
  KvCacheManager m(window_config(/*prefix_caching=*/true));
  std::vector<int64_t> slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(21)).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 21, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 21).is_ok());
  // The same 21 tokens again: a hit of 5 blocks (20 tokens; the last is recomputed). Its
  // first new token, position 20, attends from 15: the hit's blocks 0..2 go straight back
  // (still cached), the sequence keeps blocks 3 and 4.
  ASSERT_TRUE(m.add_sequence(2, 0, prompt(21)).is_ok());
  const PrefixHit hit = m.find_prefix(2);
  ASSERT_EQ(hit.num_tokens, 20);
  ASSERT_EQ(m.allocate_slots(2, 1, hit, slots), AllocStatus::kOk);
  expect_released(m, 2, 3);
  EXPECT_TRUE(check_all(m).is_ok()) << check_all(m).message();
}

TEST(KvWindow, CheckWindowBlocksAndCheckPlanSeeABlockReleasedEarly) {
  KvCacheManager m(window_config(/*prefix_caching=*/false));
  std::vector<int64_t> slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(20)).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 20, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 20).is_ok());
  ASSERT_TRUE(check_window_blocks(m).is_ok());
  SequenceState& s = KvCacheManagerTestPeer::seq(m, 1);
  BlockAllocator& device = KvCacheManagerTestPeer::device(m);

  // Released one block early: entry 3 (positions 12..15), which position 20 reads (15).
  const int32_t b3 = s.table()[3];
  s.table().set(3, kNoBlock);
  s.group(0).num_window_released = 4;
  ASSERT_TRUE(device.release(b3));
  const Status early = check_window_blocks(m);
  EXPECT_FALSE(early.is_ok());
  EXPECT_NE(early.message().find("I11"), std::string::npos) << early.message();
  // ... and a plan that runs position 20 reads the released entry: check_plan refuses it.
  ASSERT_TRUE(m.append_tokens(1, V{7}).is_ok());
  BatchPlan plan;
  plan.seq_ids = {1};
  plan.query_start = {0, 1};
  plan.context_lens = {21};
  plan.max_blocks_per_seq = 6;
  for (int64_t j = 0; j < 6; ++j) plan.block_tables.push_back(j < s.table().size() ? s.table()[j] : -1);
  plan.token_ids = {7};
  plan.positions = {20};
  plan.needs_logits = {1};
  plan.logits_all = {0};
  s.num_slots = 21;  // as if its slot were reserved
  s.table().push_back(device.allocate().block);
  plan.block_tables[5] = s.table()[5];
  plan.slot_mapping = {int64_t{s.table()[5]} * 4};  // position 20: block 5, offset 0
  const Status read = check_plan(m, plan, PlanBounds{64, 8, 64, 1});
  EXPECT_FALSE(read.is_ok());
  EXPECT_NE(read.message().find("attends to block-table entry 3, which the sliding window released"), std::string::npos)
      << read.message();
}

TEST(KvWindow, CheckWindowBlocksSeesABlockNoTokenReadsStillHeld) {
  KvCacheManager m(window_config(/*prefix_caching=*/false));
  std::vector<int64_t> slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(20)).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 20, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 20).is_ok());
  SequenceState& s = KvCacheManagerTestPeer::seq(m, 1);
  // Entry 2 (positions 8..11) held again: no token the sequence will run reads it.
  const int32_t b = KvCacheManagerTestPeer::device(m).allocate().block;
  s.table().set(2, b);
  const Status kept = check_window_blocks(m);
  EXPECT_FALSE(kept.is_ok());
  EXPECT_NE(kept.message().find("still holds block " + std::to_string(b) + " at index 2"), std::string::npos)
      << kept.message();
}

// A sequence registers the block after its released ones under the handle the last released
// block had. Another holder of that block may rewrite it in place at the same generation (it
// truncated into the block while both held it, and writes once the window let go: a sole
// holder does not copy on write) and cache it with other tokens. The next block must not be
// chained onto it: the kv_ops fuzzer found that entry (its hash not the chain hash of its
// parent's, check_prefix_cache). Block size 4, window 3: position p attends from p - 2.
TEST(KvWindow, NoBlockIsChainedOntoAReleasedParentAnotherSequenceRewrote) {
  KvCacheConfig c = window_config(/*prefix_caching=*/true);
  c.sliding_window = 3;
  KvCacheManager m(c);
  std::vector<int64_t> slots;
  // Sequence 1: five tokens, block 0 (1..4) final and cached.
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(5)).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 5, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 5).is_ok());
  const int32_t b0 = m.sequence(1)->table()[0];
  ASSERT_TRUE(m.device_allocator().is_cached(b0));
  // Sequence 2 shares it; sequence 1 truncates into it (its entry leaves the cache).
  ASSERT_TRUE(m.fork(1, 2).is_ok());
  ASSERT_TRUE(m.truncate(1, 2).is_ok());
  ASSERT_FALSE(m.device_allocator().is_cached(b0));
  // Sequence 2 decodes position 5: final 6, position 6 attends from 4, block 0 released.
  ASSERT_TRUE(m.append_tokens(2, V{6}).is_ok());
  ASSERT_TRUE(m.allocate_slots(2, 1, slots).is_ok());
  ASSERT_TRUE(m.mark_final(2, 6).is_ok());
  expect_released(m, 2, 1);
  // Sequence 1, now the sole holder, writes 9, 9 into block 0 in place and caches it.
  ASSERT_TRUE(m.append_tokens(1, V{9, 9}).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 2, slots).is_ok());
  ASSERT_EQ(m.sequence(1)->table()[0], b0);
  ASSERT_TRUE(m.mark_final(1, 4).is_ok());
  ASSERT_TRUE(m.device_allocator().is_cached(b0));
  // Sequence 2 fills block 1 (5..8): its parent was block 0 holding 1..4, no longer there.
  ASSERT_TRUE(m.append_tokens(2, V{7, 8}).is_ok());
  ASSERT_TRUE(m.allocate_slots(2, 2, slots).is_ok());
  ASSERT_TRUE(m.mark_final(2, 8).is_ok());
  EXPECT_FALSE(m.device_allocator().is_cached(m.sequence(2)->table()[1]));
  EXPECT_TRUE(check_all(m).is_ok()) << check_all(m).message();

  // Control: with nobody rewriting the released block, the next block is chained onto it.
  ASSERT_TRUE(m.add_sequence(3, 0, prompt(6, 20)).is_ok());
  ASSERT_TRUE(m.allocate_slots(3, 6, slots).is_ok());
  ASSERT_TRUE(m.mark_final(3, 6).is_ok());
  expect_released(m, 3, 1);
  ASSERT_TRUE(m.append_tokens(3, V{26, 27}).is_ok());
  ASSERT_TRUE(m.allocate_slots(3, 2, slots).is_ok());
  ASSERT_TRUE(m.mark_final(3, 8).is_ok());
  EXPECT_TRUE(m.device_allocator().is_cached(m.sequence(3)->table()[1]));
  EXPECT_TRUE(check_all(m).is_ok()) << check_all(m).message();
}

TEST(KvWindow, TheReplayerChecksEveryWindowRelease) {
  KvCacheManager m(window_config(/*prefix_caching=*/true));
  EventLog log;
  m.set_event_log(&log);
  std::vector<int64_t> slots;
  ASSERT_TRUE(m.add_sequence(1, 0, prompt(21)).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 21, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 21).is_ok());
  ASSERT_TRUE(m.add_sequence(2, 0, prompt(21)).is_ok());
  ASSERT_TRUE(m.allocate_slots(2, 1, slots).is_ok());
  ASSERT_TRUE(m.fork(2, 3).is_ok());
  ASSERT_TRUE(m.swap_out(3).is_ok());
  ASSERT_TRUE(m.free(1).is_ok());
  ASSERT_TRUE(m.free(2).is_ok());
  ASSERT_TRUE(m.free(3).is_ok());
  const std::string text = log.text();
  EXPECT_NE(text.find(R"("window":6)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"({"ev":"window_release","seq":1,"index":0,)"), std::string::npos) << text;
  const ReplayResult ok = replay_event_log(text);
  EXPECT_TRUE(ok.ok()) << ok.message << "\n" << text;

  // Planted: a block released while the last slotted position still attends to it.
  const std::string early = std::string(R"({"ev":"init","device_blocks":4,"host_blocks":0,"block_size":4,)") +
                            R"("global_prefix":false,"window":6})" + "\n" + R"({"ev":"add","seq":1,"tenant":0})" +
                            "\n" + R"({"ev":"alloc","seq":1,"block":0})" + "\n" +
                            R"({"ev":"alloc","seq":1,"block":1})" + "\n" + R"({"ev":"slots","seq":1,"len":8})" + "\n" +
                            R"({"ev":"window_release","seq":1,"index":0,"block":0})" + "\n";
  const ReplayResult r = replay_event_log(early);
  EXPECT_EQ(r.kind, ReplayResult::Kind::kViolation) << r.message;
  EXPECT_NE(r.message.find("position 7 attends from 2"), std::string::npos) << r.message;
  // With no window in init, a window_release is a violation too.
  std::string no_window = early;
  no_window.replace(no_window.find(R"(,"window":6)"), 11, "");
  EXPECT_NE(replay_event_log(no_window).message.find("has no window"), std::string::npos);
}

}  // namespace
}  // namespace kvp
