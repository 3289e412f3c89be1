// Stateful model-based properties of KvCacheManager: random command sequences (add with
// shared prefixes, append, fork, truncate, free, swap out/in, evict, flush, speculative
// append and rollback) run against the
// manager and the trivial model of kv_harness.h; every invariant is checked after every
// command.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <tuple>
#include <vector>

#include "optimized/checkers/invariants.h"
#include "properties/kv_harness.h"

namespace kvp::testing {
namespace {

rc::Gen<std::vector<Op>> gen_ops() {
  return rc::gen::map(rc::gen::container<std::vector<std::tuple<int, int, int, int>>>(
                          rc::gen::tuple(rc::gen::inRange(0, KvHarness::kNumKinds), rc::gen::inRange(0, 1 << 12),
                                         rc::gen::inRange(0, 1 << 12), rc::gen::inRange(0, 1 << 12))),
                      [](const std::vector<std::tuple<int, int, int, int>>& v) {
                        std::vector<Op> ops;
                        for (const auto& [k, a, b, c] : v) ops.push_back(Op::drawn(k, a, b, c));
                        return ops;
                      });
}

KvCacheConfig gen_config(bool tiny_pools) {
  KvCacheConfig c;
  c.pool.block_size = *rc::gen::element(1, 2, 4);
  c.pool.num_device_blocks = tiny_pools ? *rc::gen::inRange(0, 5) : *rc::gen::inRange(1, 40);
  c.pool.num_host_blocks = tiny_pools ? *rc::gen::inRange(0, 3) : *rc::gen::inRange(0, 12);
  c.watermark_blocks = *rc::gen::inRange(0, c.pool.num_device_blocks / 4 + 1);
  c.enable_prefix_caching = *rc::gen::element(true, true, false);
  c.global_prefix_sharing = *rc::gen::arbitrary<bool>();
  c.poison_on_free = *rc::gen::arbitrary<bool>();
  c.hash_bits = *rc::gen::element(256, 256, 3);
  // A sliding window in one config of three: blocks released behind it as positions turn
  // final, every command checked by check_window_blocks (I11) and the read-back.
  c.sliding_window = *rc::gen::element(0, 0, 1, 3, 5, 9);
  // KV-cache groups in one config of three (a hybrid model's full and sliding layers): one
  // to three groups, each full or windowed, all over the one pool.
  if (*rc::gen::element(0, 0, 1) == 1) {
    c.sliding_window = 0;
    c.group_windows =
        *rc::gen::container<std::vector<int64_t>>(*rc::gen::inRange(1, 4), rc::gen::element<int64_t>(0, 0, 1, 3, 5, 9));
  }
  return c;
}

void run(const KvCacheConfig& config, const std::vector<Op>& ops) {
  KvHarness h(config);
  for (const Op& op : ops) {
    const Status st = h.apply(op);
    if (!st.is_ok()) RC_FAIL(st.message());
  }
  const Status drained = h.drain();
  if (!drained.is_ok()) RC_FAIL("after freeing everything and a flush: " + drained.message());
}

RC_GTEST_PROP(KvCacheManagerProperty, ManagerAgreesWithTheModelAfterEveryCommand, ()) {
  const KvCacheConfig config = gen_config(/*tiny_pools=*/false);
  run(config, *gen_ops());
}

// Tiny pools make allocations and swaps fail often: each failure must change nothing.
RC_GTEST_PROP(KvCacheManagerProperty, FailedAllocationsAndSwapsLeaveTheStateUnchanged, ()) {
  const KvCacheConfig config = gen_config(/*tiny_pools=*/true);
  run(config, *gen_ops());
}

// A few hash bits: collisions on almost every lookup, and the model still reads its own
// tokens back through every block table.
RC_GTEST_PROP(KvCacheManagerProperty, TinyHashNeverSharesAForeignBlock, ()) {
  KvCacheConfig config = gen_config(/*tiny_pools=*/false);
  config.enable_prefix_caching = true;
  config.hash_bits = *rc::gen::inRange(1, 4);
  run(config, *gen_ops());
}

// Speculative steps (kSpeculate, four draws in eleven) among prefills, appends, forks, swaps
// and truncates: drafts get slots but never become final, rollbacks release what they must,
// and no rejected draft ever enters the prefix cache (I9, checked after every command).
RC_GTEST_PROP(KvCacheManagerProperty, SpeculativeAppendAndRollbackKeepEveryInvariant, ()) {
  KvCacheConfig config = gen_config(/*tiny_pools=*/false);
  config.enable_prefix_caching = *rc::gen::element(true, true, true, false);
  const auto ops = *rc::gen::container<std::vector<std::tuple<OpKind, int, int, int>>>(
      rc::gen::tuple(rc::gen::element(OpKind::kPrefill, OpKind::kPrefillChunk, OpKind::kAppend, OpKind::kFork,
                                      OpKind::kTruncate, OpKind::kSwapOut, OpKind::kSwapIn, OpKind::kSpeculate,
                                      OpKind::kSpeculate, OpKind::kSpeculate, OpKind::kSpeculate),
                     rc::gen::inRange(0, 1 << 12), rc::gen::inRange(0, 1 << 12), rc::gen::inRange(0, 1 << 12)));
  std::vector<Op> v;
  for (const auto& [k, a, b, c] : ops) v.push_back(Op{k, a, b, c});
  run(config, v);
}

RC_GTEST_PROP(KvCacheManagerProperty, FreeingEverythingAndFlushingLeavesEveryBlockFree, ()) {
  const KvCacheConfig config = gen_config(/*tiny_pools=*/false);
  KvHarness h(config);
  for (const Op& op : *gen_ops()) {
    if (!h.apply(op).is_ok()) return;  // covered by the other properties
  }
  const Status st = h.drain();
  if (!st.is_ok()) RC_FAIL(st.message());
  RC_ASSERT(h.manager().device_allocator().num_free() == config.pool.num_device_blocks);
  RC_ASSERT(h.manager().host_allocator().num_free() == config.pool.num_host_blocks);
  for (int32_t b = 0; b < config.pool.num_device_blocks; ++b) {
    RC_ASSERT(h.manager().device_allocator().refcount(b) == 0);
  }
}

}  // namespace
}  // namespace kvp::testing
