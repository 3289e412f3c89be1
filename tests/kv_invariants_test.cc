// Each checker must report a broken state, and name where it broke. The peer reaches into
// the manager to corrupt exactly one thing per test.
#include "optimized/checkers/invariants.h"
#include "tests/kv_cache_manager_test_peer.h"

#include <gtest/gtest.h>

#include "kernels/kv_index.h"

#include <numeric>
#include <vector>

namespace kvp {

namespace {

using Peer = KvCacheManagerTestPeer;
using V = std::vector<int32_t>;

V iota(int n) {
  V v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 100);
  return v;
}

KvCacheManager& setup(KvCacheManager& m) {
  // seq 1: 6 tokens in blocks 0, 1 (block 0 cached); seq 2 forks it.
  EXPECT_TRUE(m.add_sequence(1, 7, iota(6)).is_ok());
  std::vector<int64_t> slots;
  EXPECT_TRUE(m.allocate_slots(1, 6, slots).is_ok());
  EXPECT_TRUE(m.mark_final(1, 6).is_ok());
  EXPECT_TRUE(m.fork(1, 2).is_ok());
  EXPECT_TRUE(check_all(m).is_ok());
  return m;
}

KvCacheConfig config() {
  KvCacheConfig c;
  c.pool.num_device_blocks = 6;
  c.pool.num_host_blocks = 2;
  c.pool.block_size = 4;
  return c;
}

void expect_error(const Status& st, const std::string& fragment) {
  ASSERT_FALSE(st.is_ok()) << "expected an error containing: " << fragment;
  EXPECT_NE(st.message().find(fragment), std::string::npos) << st.message();
}

TEST(Invariants, HoldOnAFreshManager) {
  KvCacheManager m(config());
  EXPECT_TRUE(check_all(m).is_ok());
  EXPECT_TRUE(check_all_free(m).is_ok());
}

TEST(Invariants, RefcountCheckerSeesAnExtraReference) {
  KvCacheManager m(config());
  setup(m);
  Peer::device(m).retain(1);
  expect_error(check_refcounts(m), "device pool: block 1 has refcount 3 but 2 table entries");
  EXPECT_FALSE(check_all(m).is_ok());
}

TEST(Invariants, RefcountCheckerSeesAnOrphanBlock) {
  KvCacheManager m(config());
  setup(m);
  Peer::device(m).allocate();
  expect_error(check_refcounts(m), "block 2 has refcount 1 but 0 table entries");
}

TEST(Invariants, MappingCheckerSeesATableTooLong) {
  KvCacheManager m(config());
  setup(m);
  Peer::seq(m, 1).table().push_back(5);
  expect_error(check_mapping(m), "sequence 1 has 3 blocks for 6 slots (expected 2)");
}

TEST(Invariants, MappingCheckerSeesABlockNamedTwice) {
  KvCacheManager m(config());
  setup(m);
  Peer::seq(m, 1).table().set(1, 0);
  expect_error(check_mapping(m), "sequence 1 names block 0 twice");
}

TEST(Invariants, MappingCheckerSeesSlotsBeyondTokens) {
  KvCacheManager m(config());
  setup(m);
  Peer::seq(m, 2).num_slots = 7;
  expect_error(check_mapping(m), "sequence 2 has num_final");
}

TEST(Invariants, IsolationCheckerSeesDivergentTokensInASharedBlock) {
  KvCacheManager m(config());
  setup(m);
  Peer::seq(m, 2).tokens[5] = 0;
  expect_error(check_isolation(m), "block 1 shared by sequences 1 and 2 whose tokens differ at position 5");
}

TEST(Invariants, IsolationCheckerSeesSharingAcrossTenants) {
  KvCacheManager m(config());
  setup(m);
  Peer::seq(m, 2).tenant = 8;
  expect_error(check_isolation(m), "across tenants 7 and 8");
}

TEST(Invariants, IsolationCheckerSeesACachedBlockWithForeignTokens) {
  KvCacheManager m(config());
  setup(m);
  Peer::seq(m, 1).tokens[0] = 1;
  Peer::seq(m, 2).tokens[0] = 1;
  expect_error(check_isolation(m), "cached block 0 held by sequence 1 differs at position 0");
}

TEST(Invariants, PrefixCacheCheckerSeesAMarkWithoutAnEntry) {
  KvCacheManager m(config());
  setup(m);
  Peer::device(m).mark_cached(1);
  expect_error(check_prefix_cache(m), "block 1 is marked cached but has no cache entry");
}

TEST(Invariants, ExclusiveWriteCheckerSeesAWriteIntoASharedBlock) {
  KvCacheManager m(config());
  setup(m);
  const std::vector<int64_t> slots = {6};  // block 1, shared by 1 and 2
  expect_error(check_exclusive_write(m, 1, slots), "block 1 with refcount 2");
}

TEST(Invariants, SlotMappingCheckerSeesAWrongSlot) {
  KvCacheManager m(config());
  setup(m);
  const std::vector<int64_t> slots = {0, 1, 2, 3, 5};
  expect_error(check_slot_mapping(m, 1, 0, slots), "position 4 mapped to slot 5, the table gives 4");
}

TEST(Invariants, NoLeakCheckerSeesABlockKeptAfterEveryoneLeft) {
  KvCacheManager m(config());
  setup(m);
  ASSERT_TRUE(m.free(1).is_ok());
  ASSERT_TRUE(m.free(2).is_ok());
  ASSERT_TRUE(check_no_leak(m).is_ok());
  Peer::device(m).allocate();
  expect_error(check_no_leak(m), "no sequences remain but device block");
}

TEST(Invariants, MappingCheckerSeesMoreFinalPositionsThanSlots) {
  KvCacheManager m(config());
  setup(m);
  SequenceState& s = Peer::seq(m, 1);
  s.num_final = s.num_slots + 1;
  expect_error(check_mapping(m), "(expected num_final <= num_slots <= tokens)");
}

TEST(Invariants, ExclusiveWriteCheckerSeesAWriteIntoAnotherSequencesPrivateBlock) {
  KvCacheManager m(config());
  std::vector<int64_t> one, two;
  ASSERT_TRUE(m.add_sequence(1, 7, iota(6)).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 6, one).is_ok());
  ASSERT_TRUE(m.add_sequence(2, 7, V{1, 2, 3}).is_ok());
  ASSERT_TRUE(m.allocate_slots(2, 3, two).is_ok());
  ASSERT_TRUE(check_exclusive_write(m, 1, one).is_ok());
  // Sequence 1's last slot is in a block of its own (refcount 1, not cached): only the table
  // tells that sequence 2 may not write it.
  expect_error(check_exclusive_write(m, 2, std::vector<int64_t>{one.back()}), "which is not in its table");
}

TEST(Invariants, PrefixCacheCheckerRecomputesEachEntrysChainHash) {
  KvCacheManager m(config());
  setup(m);  // block 0 cached
  ASSERT_TRUE(m.prefix_cache().contains(0));
  PrefixCacheEntry e = m.prefix_cache().entry(0);
  e.tokens[1] += 1;  // indexed under its old hash, which its tokens no longer give
  Peer::cache(m).erase(0);
  Peer::cache(m).insert(0, e);
  expect_error(check_prefix_cache(m, nullptr), "entry hash is not the chain hash of its parent, salt and tokens");
}

// A chain of three cached blocks (tokens 0-11 of one sequence), all evictable.
KvCacheManager& cached_chain(KvCacheManager& m) {
  EXPECT_TRUE(m.add_sequence(1, 7, iota(12)).is_ok());
  std::vector<int64_t> slots;
  EXPECT_TRUE(m.allocate_slots(1, 12, slots).is_ok());
  EXPECT_TRUE(m.mark_final(1, 12).is_ok());
  EXPECT_TRUE(m.free(1).is_ok());
  EXPECT_EQ(m.prefix_cache().size(), 3);
  return m;
}

TEST(Invariants, HygieneCheckerSeesABlockCachedUnderAParentNoLongerCached) {
  KvCacheManager m(config());
  cached_chain(m);
  ASSERT_TRUE(check_cache_reachable(m).is_ok());
  // Drop the middle block's entry behind the manager: the last block's chain is broken.
  const int32_t middle = m.prefix_cache().entry(m.prefix_cache().blocks().back()).parent.block;
  Peer::cache(m).erase(middle);
  Peer::device(m).clear_cached(middle);
  expect_error(check_cache_reachable(m), "is unreachable: it was cached under block " + std::to_string(middle));
  expect_error(check_all(m), "hygiene");
}

TEST(Invariants, HygieneCheckerSeesACycleInACachedChain) {
  KvCacheManager m(config());
  cached_chain(m);
  const std::vector<int32_t> blocks = m.prefix_cache().blocks();
  // The chain's root made the child of its last block: root -> last -> middle -> root.
  int32_t root = -1, last = -1;
  for (int32_t b : blocks) {
    if (m.prefix_cache().entry(b).parent.block < 0) root = b;
    bool is_parent = false;
    for (int32_t c : blocks) is_parent = is_parent || m.prefix_cache().entry(c).parent.block == b;
    if (!is_parent) last = b;
  }
  ASSERT_GE(root, 0);
  ASSERT_GE(last, 0);
  PrefixCacheEntry e = m.prefix_cache().entry(root);
  e.parent = Peer::device(m).handle(last);
  Peer::cache(m).erase(root);
  Peer::cache(m).insert(root, e);
  expect_error(check_cache_reachable(m), "'s chain has a cycle");
}

TEST(Invariants, HygieneCheckerSeesAParentReusedUnderTheSameId) {
  KvCacheManager m(config());
  cached_chain(m);
  const int32_t last = m.prefix_cache().blocks().back();
  const int32_t middle = m.prefix_cache().entry(last).parent.block;
  // The middle block is handed out again (new generation) and then re-marked cached: the
  // id is cached, but not the allocation the last block was registered under.
  Peer::cache(m).erase(middle);
  Peer::device(m).clear_cached(middle);
  for (int i = 0; i < 6 && Peer::device(m).allocate().block != middle; ++i) {
  }
  ASSERT_EQ(Peer::device(m).refcount(middle), 1);
  Peer::device(m).mark_cached(middle);
  Peer::cache(m).insert(middle, PrefixCacheEntry{BlockHash{}, 7, iota(4), BlockHandle{}});
  expect_error(check_cache_reachable(m), "no longer that allocation");
}

// The manager keeps the cache hygienic by construction: a sequence releases its table from
// the tail, so a child is always older in the evictable list than its parent and the LRU
// eviction (evict_cached, or the allocator reusing a block) takes it first. This drives
// both eviction paths one block at a time and checks every intermediate state; an eviction
// that took the most recently released block first fails it.
TEST(Invariants, EvictionNeverLeavesAnUnreachableCachedBlock) {
  for (const bool by_allocation : {false, true}) {
    SCOPED_TRACE(by_allocation ? "evicted by allocation" : "evicted by evict_cached");
    KvCacheManager m(config());
    cached_chain(m);
    ASSERT_TRUE(m.add_sequence(2, 7, V{900, 901, 902}).is_ok());  // shares nothing
    std::vector<int64_t> slots;
    for (int round = 0; round < 3; ++round) {
      if (by_allocation) {
        // 3 fresh blocks remain in the pool of 6; each 4 tokens after that reuses one.
        ASSERT_TRUE(m.append_tokens(2, V{1, 2, 3, 4}).is_ok());
        ASSERT_TRUE(m.allocate_slots(2, 4, slots).is_ok());
      } else {
        ASSERT_EQ(m.evict_cached(1), 1);
      }
      ASSERT_TRUE(check_all(m).is_ok()) << "round " << round;
    }
  }
}
TEST(Invariants, AllFreeCheckerSeesCachedBlocksBeforeTheFlush) {
  KvCacheManager m(config());
  setup(m);
  ASSERT_TRUE(m.free(1).is_ok());
  ASSERT_TRUE(m.free(2).is_ok());
  expect_error(check_all_free(m), "prefix-cache entries remain");
  m.flush_prefix_cache();
  EXPECT_TRUE(check_all_free(m).is_ok());
}

// A plan of the last `n` positions of `seq`, made from the manager's own state (what the
// scheduler would emit).
BatchPlan plan_for(const KvCacheManager& m, SeqId seq, int64_t n) {
  const SequenceState& s = *m.sequence(seq);
  BatchPlan plan;
  plan.seq_ids = {seq};
  plan.query_start = {0, static_cast<int32_t>(n)};
  plan.context_lens = {static_cast<int32_t>(s.num_slots)};
  plan.max_blocks_per_seq = static_cast<int32_t>(s.table().size()) + 1;  // one entry of padding
  plan.block_tables = s.table().blocks();
  plan.block_tables.push_back(-1);
  plan.needs_logits = {1};
  plan.logits_all = {0};
  for (int64_t p = s.num_slots - n; p < s.num_slots; ++p) {
    plan.token_ids.push_back(s.tokens[static_cast<size_t>(p)]);
    plan.positions.push_back(static_cast<int32_t>(p));
    plan.slot_mapping.push_back(kernels::slot_of(s.table().data(), p, m.block_size()));
  }
  return plan;
}

// Two tenants, one sequence each, nothing shared: seq 1 (tenant 7) and seq 3 (tenant 8).
KvCacheManager& two_tenants(KvCacheManager& m) {
  std::vector<int64_t> slots;
  EXPECT_TRUE(m.add_sequence(1, 7, iota(6)).is_ok());
  EXPECT_TRUE(m.allocate_slots(1, 6, slots).is_ok());
  EXPECT_TRUE(m.add_sequence(3, 8, V{1, 2, 3, 4, 5, 6}).is_ok());
  EXPECT_TRUE(m.allocate_slots(3, 6, slots).is_ok());
  EXPECT_TRUE(check_all(m).is_ok());
  return m;
}

constexpr PlanBounds kLoose{64, 8, 64, 2};

TEST(PlanChecker, AcceptsThePlanTheManagerDescribes) {
  KvCacheManager m(config());
  two_tenants(m);
  PlanReadStats stats;
  ASSERT_TRUE(check_plan(m, plan_for(m, 1, 2), kLoose, &stats).is_ok());
  EXPECT_EQ(stats.block_reads, 2);
  EXPECT_EQ(stats.kv_position_reads, 5 + 6);
}

TEST(PlanChecker, SeesATokenBudgetOverrun) {
  KvCacheManager m(config());
  two_tenants(m);
  PlanBounds tight = kLoose;
  tight.max_num_batched_tokens = 1;
  expect_error(check_plan(m, plan_for(m, 1, 2), tight), "I8: 2 tokens scheduled, budget 1");
}

TEST(PlanChecker, SeesATableRowThatIsNotTheSequencesTable) {
  KvCacheManager m(config());
  two_tenants(m);
  BatchPlan plan = plan_for(m, 1, 1);
  plan.block_tables[1] = m.sequence(3)->table()[1];
  expect_error(check_plan(m, plan, kLoose), "I5: block-table entry 1");
}

TEST(PlanChecker, SeesATokenThatIsNotTheSequencesHistory) {
  KvCacheManager m(config());
  two_tenants(m);
  BatchPlan plan = plan_for(m, 1, 2);
  plan.token_ids[0] += 1;
  expect_error(check_plan(m, plan, kLoose), "I10: the plan carries token 105 at position 4");
}

TEST(PlanChecker, SeesAReadOfABlockAnotherTenantHolds) {
  KvCacheManager m(config());
  two_tenants(m);
  // Tenant 8's sequence comes to hold tenant 7's first block (a mapping bug).
  Peer::seq(m, 3).table().set(0, m.sequence(1)->table()[0]);
  expect_error(check_plan(m, plan_for(m, 1, 1), kLoose), "I4: reads block");
}

}  // namespace
}  // namespace kvp
