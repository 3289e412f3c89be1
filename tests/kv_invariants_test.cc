// Each checker must report a broken state, and name where it broke. The peer reaches into
// the manager to corrupt exactly one thing per test.
#include "optimized/checkers/invariants.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace kvp {

class KvCacheManagerTestPeer {
 public:
  static BlockAllocator& device(KvCacheManager& m) { return m.device_; }
  static PrefixCache& cache(KvCacheManager& m) { return m.cache_; }
  static SequenceState& seq(KvCacheManager& m, SeqId s) { return m.seqs_.at(s); }
};

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
  Peer::seq(m, 1).table.push_back(5);
  expect_error(check_mapping(m), "sequence 1 has 3 blocks for 6 slots (expected 2)");
}

TEST(Invariants, MappingCheckerSeesABlockNamedTwice) {
  KvCacheManager m(config());
  setup(m);
  Peer::seq(m, 1).table.set(1, 0);
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

TEST(Invariants, AllFreeCheckerSeesCachedBlocksBeforeTheFlush) {
  KvCacheManager m(config());
  setup(m);
  ASSERT_TRUE(m.free(1).is_ok());
  ASSERT_TRUE(m.free(2).is_ok());
  expect_error(check_all_free(m), "prefix-cache entries remain");
  m.flush_prefix_cache();
  EXPECT_TRUE(check_all_free(m).is_ok());
}

}  // namespace
}  // namespace kvp
