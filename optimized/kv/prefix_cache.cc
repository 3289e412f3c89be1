#include "optimized/kv/prefix_cache.h"

#include <algorithm>

#include "common/status.h"

namespace kvp {

PrefixCache::PrefixCache(int32_t num_blocks) {
  KVP_CHECK(num_blocks >= 0);
  entries_.resize(static_cast<size_t>(num_blocks));
  present_.assign(static_cast<size_t>(num_blocks), false);
}

int32_t PrefixCache::find(const BlockHash& hash, int64_t salt, std::span<const int32_t> tokens, BlockHandle parent,
                          int32_t group) const {
  auto [lo, hi] = index_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    const PrefixCacheEntry& e = entries_[static_cast<size_t>(it->second)];
    if (e.salt == salt && e.parent == parent && e.group == group &&
        std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end())) {
      return it->second;
    }
  }
  return -1;
}

void PrefixCache::insert(int32_t block, PrefixCacheEntry entry) {
  KVP_CHECK(!contains(block));
  const auto i = static_cast<size_t>(block);
  index_.emplace(entry.hash, block);
  entries_[i] = std::move(entry);
  present_[i] = true;
}

void PrefixCache::erase(int32_t block) {
  KVP_CHECK(contains(block));
  const auto i = static_cast<size_t>(block);
  auto [lo, hi] = index_.equal_range(entries_[i].hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == block) {
      index_.erase(it);
      break;
    }
  }
  entries_[i] = PrefixCacheEntry{};
  present_[i] = false;
  ++stats_.evictions;
}

void PrefixCache::clear() {
  for (int32_t b : blocks()) erase(b);
}

bool PrefixCache::contains(int32_t block) const {
  return block >= 0 && static_cast<size_t>(block) < present_.size() && present_[static_cast<size_t>(block)];
}

const PrefixCacheEntry& PrefixCache::entry(int32_t block) const {
  KVP_CHECK(contains(block));
  return entries_[static_cast<size_t>(block)];
}

std::vector<int32_t> PrefixCache::blocks() const {
  std::vector<int32_t> out;
  for (size_t i = 0; i < present_.size(); ++i) {
    if (present_[i]) out.push_back(static_cast<int32_t>(i));
  }
  return out;
}

std::vector<std::pair<BlockHash, int32_t>> PrefixCache::index_pairs() const { return {index_.begin(), index_.end()}; }

}  // namespace kvp
