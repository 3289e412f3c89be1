// The prefix cache against a model map from token prefix to the blocks that hold it.
// Sequences are prefilled one at a time and finalized, in a pool large enough that nothing
// is evicted, so the model knows exactly which prefixes are cached: the manager must find
// exactly the longest cached prefix (in the tenant scope), hand out exactly the blocks that
// hold it, and never a block whose tokens differ, even with a hash of a few bits.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <utility>
#include <vector>

#include "optimized/checkers/invariants.h"
#include "optimized/kv/kv_cache_manager.h"

namespace kvp {
namespace {

void check_against_model(int hash_bits) {
  KvCacheConfig c;
  c.pool.block_size = *rc::gen::element(1, 2, 3);
  c.pool.num_device_blocks = 512;
  c.hash_bits = hash_bits;
  c.global_prefix_sharing = *rc::gen::arbitrary<bool>();
  KvCacheManager m(c);
  const int64_t bs = c.pool.block_size;
  // (salt, prefix of whole blocks) -> the block holding the last block of that prefix.
  std::map<std::pair<int64_t, std::vector<int32_t>>, int32_t> model;
  const int n = *rc::gen::inRange(1, 30);
  for (SeqId s = 0; s < n; ++s) {
    const int64_t tenant = *rc::gen::inRange(0, 2);
    const int64_t salt = c.global_prefix_sharing ? 0 : tenant;
    // A tiny alphabet makes shared prefixes (and equal blocks under different parents) common.
    const auto len = static_cast<size_t>(*rc::gen::inRange(0, 17));  // 30 * 17 <= 512: no eviction
    const auto prompt = *rc::gen::container<std::vector<int32_t>>(len, rc::gen::inRange(0, 2));
    RC_ASSERT(m.add_sequence(s, tenant, prompt).is_ok());
    int64_t expect = 0;
    std::vector<int32_t> expected_blocks;
    const int64_t max_blocks = prompt.empty() ? 0 : (static_cast<int64_t>(prompt.size()) - 1) / bs;
    for (int64_t i = 0; i < max_blocks; ++i) {
      auto it = model.find({salt, std::vector<int32_t>(prompt.begin(), prompt.begin() + (i + 1) * bs)});
      if (it == model.end()) break;
      expect = (i + 1) * bs;
      expected_blocks.push_back(it->second);
    }
    RC_ASSERT(m.cached_prefix_tokens(s) == expect);
    std::vector<int64_t> slots;
    RC_ASSERT(m.allocate_slots(s, static_cast<int64_t>(prompt.size()) - expect, slots).is_ok());
    RC_ASSERT(m.mark_final(s, static_cast<int64_t>(prompt.size())).is_ok());
    const std::vector<int32_t>& table = m.sequence(s)->table().blocks();
    for (size_t i = 0; i < expected_blocks.size(); ++i) RC_ASSERT(table[i] == expected_blocks[i]);
    for (int64_t i = 0; i < static_cast<int64_t>(prompt.size()) / bs; ++i) {
      model.emplace(std::make_pair(salt, std::vector<int32_t>(prompt.begin(), prompt.begin() + (i + 1) * bs)),
                    table[static_cast<size_t>(i)]);
    }
    const Status st = check_all(m);
    if (!st.is_ok()) RC_FAIL(st.message());
    if (*rc::gen::element(0, 0, 1) == 1) RC_ASSERT(m.free(s).is_ok());  // stays cached
  }
}

RC_GTEST_PROP(PrefixCacheProperty, FindsExactlyTheLongestCachedPrefix, ()) { check_against_model(256); }

RC_GTEST_PROP(PrefixCacheProperty, TinyHashFindsExactlyTheLongestCachedPrefix, ()) {
  check_against_model(*rc::gen::inRange(1, 4));
}

}  // namespace
}  // namespace kvp
