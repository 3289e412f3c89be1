// PrefixCache: names full, final device blocks by their chain hash so that a new sequence
// with the same prefix (in the same tenant scope) can share them instead of recomputing.
//
// Each entry records what the hash only hints at: the tenant salt, the block's tokens and
// its parent block (id and generation at registration; -1 for a first block). find() accepts
// an entry only when all of these compare equal, so a hash collision never maps foreign
// content into a sequence; a parent handle whose generation moved on (the parent was evicted
// and reused) no longer matches. Several entries may share one hash.
//
// The cache holds no reference count: a cached block whose refcount drops to zero stays in
// the allocator's evictable list until the allocator reuses it, and then KvCacheManager
// erases it here. The cache is a passive index; it never touches the allocator.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "optimized/kv/block_allocator.h"
#include "optimized/kv/block_hash.h"

namespace kvp {

struct PrefixCacheEntry {
  BlockHash hash{};
  int64_t salt = 0;
  std::vector<int32_t> tokens;
  BlockHandle parent;  // block -1: a sequence's first block
  int32_t group = 0;   // the KV-cache group whose table registered it (its chain's group)
};

struct PrefixCacheStats {
  int64_t hits = 0;       // blocks reused through a prefix hit
  int64_t misses = 0;     // blocks looked up for a new sequence and not found
  int64_t evictions = 0;  // entries dropped (reuse by the allocator, evict, flush)
};

class PrefixCache {
 public:
  // REQUIRES: num_blocks >= 0.
  explicit PrefixCache(int32_t num_blocks);

  // The cached block whose entry equals (hash, salt, tokens, parent, group), or -1.
  int32_t find(const BlockHash& hash, int64_t salt, std::span<const int32_t> tokens, BlockHandle parent,
               int32_t group = 0) const;

  // Names `block` in the cache. REQUIRES: !contains(block).
  void insert(int32_t block, PrefixCacheEntry entry);
  // REQUIRES: contains(block).
  void erase(int32_t block);
  // Forgets every entry (counted as evictions).
  void clear();

  bool contains(int32_t block) const;
  // REQUIRES: contains(block).
  const PrefixCacheEntry& entry(int32_t block) const;
  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  // Cached block ids, ascending (O(num_blocks)).
  std::vector<int32_t> blocks() const;
  // Every (hash -> block) pair in the index (for the invariant checker).
  std::vector<std::pair<BlockHash, int32_t>> index_pairs() const;

  PrefixCacheStats& stats() { return stats_; }
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  std::vector<PrefixCacheEntry> entries_;
  std::vector<bool> present_;
  std::unordered_multimap<BlockHash, int32_t, BlockHashHasher> index_;
  PrefixCacheStats stats_;
};

}  // namespace kvp
