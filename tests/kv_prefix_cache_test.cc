#include "optimized/kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <vector>

#include "optimized/kv/block_hash.h"

namespace kvp {
namespace {

using V = std::vector<int32_t>;

PrefixCacheEntry entry(const BlockHash* parent_hash, BlockHandle parent, int64_t salt, const V& tokens,
                       int bits = 256) {
  return {chain_hash(parent_hash, salt, tokens, bits), salt, tokens, parent};
}

TEST(ChainHash, DependsOnParentSaltAndTokens) {
  const V t = {1, 2, 3, 4};
  const BlockHash a = chain_hash(nullptr, 0, t, 256);
  EXPECT_EQ(a, chain_hash(nullptr, 0, t, 256));
  EXPECT_NE(a, chain_hash(nullptr, 1, t, 256));
  EXPECT_NE(a, chain_hash(nullptr, 0, V{1, 2, 3, 5}, 256));
  EXPECT_NE(a, chain_hash(&a, 0, t, 256));
}

TEST(ChainHash, TruncationKeepsOnlyTheLeadingBits) {
  const BlockHash h = chain_hash(nullptr, 0, V{1, 2}, 3);
  EXPECT_EQ(h[0] & 0x1F, 0);
  for (size_t i = 1; i < h.size(); ++i) EXPECT_EQ(h[i], 0);
}

TEST(PrefixCache, FindsAnInsertedBlockByItsFullContent) {
  PrefixCache c(4);
  const PrefixCacheEntry e = entry(nullptr, {}, 7, V{1, 2});
  c.insert(3, e);
  EXPECT_EQ(c.find(e.hash, 7, V{1, 2}, {}), 3);
  EXPECT_TRUE(c.contains(3));
  EXPECT_EQ(c.size(), 1);
}

TEST(PrefixCache, RejectsEqualHashWithDifferentTokensSaltOrParent) {
  PrefixCache c(4);
  const PrefixCacheEntry e = entry(nullptr, {}, 7, V{1, 2});
  c.insert(0, e);
  EXPECT_EQ(c.find(e.hash, 7, V{1, 3}, {}), -1);
  EXPECT_EQ(c.find(e.hash, 8, V{1, 2}, {}), -1);
  EXPECT_EQ(c.find(e.hash, 7, V{1, 2}, BlockHandle{2, 1}), -1);
}

TEST(PrefixCache, ParentGenerationMustMatch) {
  PrefixCache c(4);
  const PrefixCacheEntry root = entry(nullptr, {}, 0, V{1});
  c.insert(0, root);
  const PrefixCacheEntry child = entry(&root.hash, BlockHandle{0, 1}, 0, V{2});
  c.insert(1, child);
  EXPECT_EQ(c.find(child.hash, 0, V{2}, BlockHandle{0, 1}), 1);
  EXPECT_EQ(c.find(child.hash, 0, V{2}, BlockHandle{0, 2}), -1);
}

TEST(PrefixCache, CollidingHashesKeepBothEntries) {
  PrefixCache c(4);
  // With 1 bit of hash there are only two names; force one by construction.
  PrefixCacheEntry a = entry(nullptr, {}, 0, V{1}, 1);
  PrefixCacheEntry b{a.hash, 0, V{2}, {}};
  c.insert(0, a);
  c.insert(1, b);
  EXPECT_EQ(c.find(a.hash, 0, V{1}, {}), 0);
  EXPECT_EQ(c.find(a.hash, 0, V{2}, {}), 1);
  c.erase(0);
  EXPECT_EQ(c.find(a.hash, 0, V{1}, {}), -1);
  EXPECT_EQ(c.find(a.hash, 0, V{2}, {}), 1);
  EXPECT_EQ(c.stats().evictions, 1);
}

TEST(PrefixCache, ClearForgetsEverything) {
  PrefixCache c(3);
  c.insert(0, entry(nullptr, {}, 0, V{1}));
  c.insert(2, entry(nullptr, {}, 0, V{2}));
  EXPECT_EQ(c.blocks(), (V{0, 2}));
  c.clear();
  EXPECT_EQ(c.size(), 0);
  EXPECT_FALSE(c.contains(0));
  EXPECT_EQ(c.stats().evictions, 2);
}

}  // namespace
}  // namespace kvp
