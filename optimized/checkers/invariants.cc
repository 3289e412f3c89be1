#include "optimized/checkers/invariants.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/text.h"
#include "kernels/kv_index.h"

namespace kvp {
namespace {

Status check_pool_conservation(const BlockAllocator& a, const char* pool) {
  const auto where = [pool] { return std::string(pool) + " pool: "; };
  const int32_t n = a.num_blocks();
  std::vector<uint8_t> seen(static_cast<size_t>(n), 0);
  const std::vector<int32_t> fresh = a.free_list();
  const std::vector<int32_t> evictable = a.evictable_list();
  for (int32_t b : fresh) {
    if (b < 0 || b >= n) return Status::error(where() + "free list holds out-of-range block " + str(b));
    if (seen[static_cast<size_t>(b)]++) {
      return Status::error(where() + "block " + str(b) + " appears twice in the free lists");
    }
    if (a.refcount(b) != 0 || a.is_cached(b) || !a.in_fresh_list(b)) {
      return Status::error(where() + "block " + str(b) + " is in the free list but has refcount " + str(a.refcount(b)) +
                           (a.is_cached(b) ? ", cached" : ", not cached") + " (expected refcount 0, not cached)");
    }
  }
  for (int32_t b : evictable) {
    if (b < 0 || b >= n) {
      return Status::error(where() + "evictable list holds out-of-range block " + str(b));
    }
    if (seen[static_cast<size_t>(b)]++) {
      return Status::error(where() + "block " + str(b) + " appears twice in the free lists");
    }
    if (a.refcount(b) != 0 || !a.is_cached(b) || !a.in_evictable_list(b)) {
      return Status::error(where() + "block " + str(b) + " is in the evictable list but has refcount " +
                           str(a.refcount(b)) + (a.is_cached(b) ? ", cached" : ", not cached") +
                           " (expected refcount 0, cached)");
    }
  }
  int32_t in_use = 0;
  for (int32_t b = 0; b < n; ++b) {
    if (a.refcount(b) < 0) {
      return Status::error(where() + "block " + str(b) + " has negative refcount " + str(a.refcount(b)));
    }
    if (a.refcount(b) > 0) {
      ++in_use;
      if (seen[static_cast<size_t>(b)] || a.in_fresh_list(b) || a.in_evictable_list(b)) {
        return Status::error(where() + "block " + str(b) + " is in use (refcount " + str(a.refcount(b)) +
                             ") but in a free list");
      }
    } else if (!seen[static_cast<size_t>(b)]) {
      return Status::error(where() + "block " + str(b) +
                           " has refcount 0 but is in neither the free nor the evictable list");
    }
  }
  const auto nf = static_cast<int32_t>(fresh.size());
  const auto ne = static_cast<int32_t>(evictable.size());
  if (nf != a.num_free() || ne != a.num_evictable()) {
    return Status::error(where() + "list counters say free " + str(a.num_free()) + ", evictable " +
                         str(a.num_evictable()) + "; the lists hold " + str(nf) + ", " + str(ne));
  }
  if (nf + ne + in_use != n) {
    return Status::error(where() + "free " + str(nf) + " + evictable " + str(ne) + " + in use " + str(in_use) +
                         " != pool size " + str(n));
  }
  return Status::ok();
}

// Whether entry e must name an anchor-group block as its parent (KvCacheConfig::anchor_group).
bool anchor_parent_required(const KvCacheManager& m, const PrefixCacheEntry& e) {
  const int64_t anchor = m.config().anchor_group();
  return anchor >= 0 && e.group != anchor;
}

// The manager's sequences by id, so that the first violation reported is stable.
std::vector<const SequenceState*> ordered_sequences(const KvCacheManager& m) {
  std::vector<const SequenceState*> v;
  v.reserve(m.sequences().size());
  for (const auto& [id, s] : m.sequences()) v.push_back(&s);
  std::sort(v.begin(), v.end(), [](const SequenceState* a, const SequenceState* b) { return a->id < b->id; });
  return v;
}

// Table entries naming each block of one pool.
std::vector<int32_t> count_owners(const KvCacheManager& m, bool host) {
  const int32_t n = host ? m.host_allocator().num_blocks() : m.device_allocator().num_blocks();
  std::vector<int32_t> owners(static_cast<size_t>(n), 0);
  for (const auto& [id, s] : m.sequences()) {
    if (s.swapped != host) continue;
    for (const GroupTable& gt : s.groups) {
      for (int32_t b : gt.table.blocks()) {
        if (b >= 0 && b < n) ++owners[static_cast<size_t>(b)];
      }
    }
  }
  return owners;
}

Status check_pool_refcounts(const KvCacheManager& m, bool host) {
  const BlockAllocator& a = host ? m.host_allocator() : m.device_allocator();
  const char* where = host ? "host pool: " : "device pool: ";
  const std::vector<int32_t> owners = count_owners(m, host);
  for (int32_t b = 0; b < a.num_blocks(); ++b) {
    if (a.refcount(b) != owners[static_cast<size_t>(b)]) {
      std::string who;
      for (const auto& [id, s] : m.sequences()) {
        if (s.swapped == host && std::any_of(s.groups.begin(), s.groups.end(), [b](const GroupTable& gt) {
              return std::find(gt.table.blocks().begin(), gt.table.blocks().end(), b) != gt.table.blocks().end();
            })) {
          who += (who.empty() ? "" : ", ") + str(id);
        }
      }
      return Status::error(std::string(where) + "block " + str(b) + " has refcount " + str(a.refcount(b)) + " but " +
                           str(owners[static_cast<size_t>(b)]) + " table entries name it" +
                           (who.empty() ? "" : " (sequences " + who + ")"));
    }
  }
  return Status::ok();
}

}  // namespace

Status check_conservation(const KvCacheManager& m) {
  KVP_RETURN_IF_ERROR(check_pool_conservation(m.device_allocator(), "device"));
  KVP_RETURN_IF_ERROR(check_pool_conservation(m.host_allocator(), "host"));
  for (int32_t b = 0; b < m.host_allocator().num_blocks(); ++b) {
    if (m.host_allocator().is_cached(b)) {
      return Status::error("host pool: block " + str(b) + " is marked cached");
    }
  }
  return Status::ok();
}

Status check_refcounts(const KvCacheManager& m) {
  KVP_RETURN_IF_ERROR(check_pool_refcounts(m, /*host=*/false));
  return check_pool_refcounts(m, /*host=*/true);
}

Status check_exclusive_write(const KvCacheManager& m, SeqId seq, std::span<const int64_t> slot_mapping, int64_t group) {
  const SequenceState* s = m.sequence(seq);
  if (s == nullptr) return Status::error("I3: unknown sequence " + str(seq));
  if (s->swapped && !slot_mapping.empty()) {
    return Status::error("I3: sequence " + str(seq) + " is swapped out but has slots to write");
  }
  if (group < 0 || group >= s->num_groups()) {
    return Status::error("I3: sequence " + str(seq) + " has no KV-cache group " + str(group));
  }
  const BlockTable& table = s->group(group).table;
  const BlockAllocator& a = m.device_allocator();
  for (int64_t slot : slot_mapping) {
    if (slot == kernels::kSkipSlot) continue;
    const int64_t b = kernels::block_of_slot(slot, m.block_size());
    if (b < 0 || b >= a.num_blocks()) {
      return Status::error("I3: sequence " + str(seq) + " writes slot " + str(slot) + " outside the device pool");
    }
    const auto block = static_cast<int32_t>(b);
    if (std::find(table.blocks().begin(), table.blocks().end(), block) == table.blocks().end()) {
      return Status::error("I3: sequence " + str(seq) + " writes slot " + str(slot) + " in block " + str(b) +
                           ", which is not in its table" + (s->num_groups() > 1 ? " of group " + str(group) : ""));
    }
    if (a.refcount(block) != 1 || a.is_cached(block)) {
      return Status::error("I3: sequence " + str(seq) + " writes slot " + str(slot) + " in block " + str(b) +
                           " with refcount " + str(a.refcount(block)) + (a.is_cached(block) ? ", cached" : "") +
                           " (expected refcount 1, not cached)");
    }
  }
  return Status::ok();
}

Status check_isolation(const KvCacheManager& m) {
  const int64_t bs = m.block_size();
  const BlockAllocator& a = m.device_allocator();
  const PrefixCache& cache = m.prefix_cache();
  struct Holder {
    int32_t block;
    const SequenceState* s;
    int64_t group;
    int64_t index;
  };
  // By block, then by sequence id (deterministic: the first violation reported is stable).
  std::vector<Holder> holders;
  for (const SequenceState* s : ordered_sequences(m)) {
    if (s->swapped) continue;
    for (int64_t g = 0; g < s->num_groups(); ++g) {
      const GroupTable& gt = s->group(g);
      for (int64_t i = 0; i < gt.table.size(); ++i) {
        const int32_t b = gt.table[i];
        if (b == kNoBlock && i < gt.num_window_released) continue;  // check_window_blocks says where it may be
        if (b < 0 || b >= a.num_blocks()) {
          return Status::error("I4: sequence " + str(s->id) + " names out-of-range block " + str(b));
        }
        holders.push_back({b, s, g, i});
      }
    }
  }
  std::stable_sort(holders.begin(), holders.end(), [](const Holder& x, const Holder& y) { return x.block < y.block; });
  for (std::size_t lo = 0; lo < holders.size();) {
    std::size_t hi = lo;
    const int32_t b = holders[lo].block;
    while (hi < holders.size() && holders[hi].block == b) ++hi;
    const Holder& first = holders[lo];
    for (size_t k = lo + 1; k < hi; ++k) {
      const Holder& h = holders[k];
      const auto pair = [&] {
        return "block " + str(b) + " shared by sequences " + str(first.s->id) + " and " + str(h.s->id);
      };
      if (h.group != first.group) {
        return Status::error("I12: " + pair() + " in the tables of different KV-cache groups " + str(first.group) +
                             " and " + str(h.group));
      }
      if (h.index != first.index) {
        return Status::error("I4: " + pair() + " at different table indices " + str(first.index) + " and " +
                             str(h.index));
      }
      if (!m.config().global_prefix_sharing && h.s->tenant != first.s->tenant) {
        return Status::error("I4: " + pair() + " across tenants " + str(first.s->tenant) + " and " + str(h.s->tenant));
      }
      const int64_t upto = std::min({(h.index + 1) * bs, h.s->num_slots, first.s->num_slots});
      for (int64_t p = 0; p < upto; ++p) {
        if (h.s->tokens[static_cast<size_t>(p)] != first.s->tokens[static_cast<size_t>(p)]) {
          return Status::error("I4: " + pair() + " whose tokens differ at position " + str(p) + " (" +
                               str(first.s->tokens[static_cast<size_t>(p)]) + " vs " +
                               str(h.s->tokens[static_cast<size_t>(p)]) + ")");
        }
      }
    }
    if (cache.contains(b)) {
      const PrefixCacheEntry& e = cache.entry(b);
      for (size_t k = lo; k < hi; ++k) {
        const Holder& h = holders[k];
        const auto who = [&] { return "I4: cached block " + str(b) + " held by sequence " + str(h.s->id); };
        if (e.group != h.group) {
          return Status::error("I12: cached block " + str(b) + " is in group " + str(e.group) +
                               "'s cache but in group " + str(h.group) + "'s table of sequence " + str(h.s->id));
        }
        if (e.salt != (m.config().global_prefix_sharing ? 0 : h.s->tenant)) {
          return Status::error(who() + " has salt " + str(e.salt) + ", the sequence " +
                               str(m.config().global_prefix_sharing ? 0 : h.s->tenant));
        }
        const int64_t base = h.index * bs;
        const int64_t upto = std::min(bs, h.s->num_slots - base);
        for (int64_t o = 0; o < upto; ++o) {
          if (e.tokens[static_cast<size_t>(o)] != h.s->tokens[static_cast<size_t>(base + o)]) {
            return Status::error(who() + " differs at position " + str(base + o) + " (cached " +
                                 str(e.tokens[static_cast<size_t>(o)]) + ", sequence " +
                                 str(h.s->tokens[static_cast<size_t>(base + o)]) + ")");
          }
        }
        const GroupTable& gt = h.s->group(h.group);
        const int64_t anchor = m.config().anchor_group();
        const int32_t prev = h.index == 0 ? kNoBlock : gt.table[h.index - 1];
        // A group other than the anchor registers under the anchor's block of the same index.
        const BlockHandle want = anchor >= 0 && h.group != anchor ? a.handle(h.s->group(anchor).table[h.index])
                                 : h.index == 0                   ? BlockHandle{}
                                 : prev == kNoBlock               ? gt.window_parent  // the handle it had
                                                                  : a.handle(prev);
        if (!(e.parent == want)) {
          return Status::error(who() + " at index " + str(h.index) + " names parent block " + str(e.parent.block) +
                               " gen " + str(e.parent.generation) + ", the table has " + str(want.block) + " gen " +
                               str(want.generation));
        }
      }
    }
    lo = hi;
  }
  return Status::ok();
}

Status check_mapping(const KvCacheManager& m) {
  const int64_t bs = m.block_size();
  // One scratch mark per block and per slot of the larger pool, cleared after each sequence
  // (no allocation per sequence: the fuzzers call this after every operation).
  const int32_t max_blocks = std::max(m.device_allocator().num_blocks(), m.host_allocator().num_blocks());
  std::vector<uint8_t> block_seen(static_cast<size_t>(max_blocks), 0);
  std::vector<uint8_t> slot_seen(static_cast<size_t>(max_blocks * bs), 0);
  for (const SequenceState* s : ordered_sequences(m)) {
    const SeqId id = s->id;
    const auto who = [id] { return "I5: sequence " + str(id); };
    const auto ntok = static_cast<int64_t>(s->tokens.size());
    if (s->num_final < 0 || s->num_final > s->num_slots || s->num_slots > ntok) {
      return Status::error(who() + " has num_final " + str(s->num_final) + ", num_slots " + str(s->num_slots) +
                           ", tokens " + str(ntok) + " (expected num_final <= num_slots <= tokens)");
    }
    const int64_t want = kernels::blocks_for_tokens(s->num_slots, bs);
    if (s->table().size() != want) {
      return Status::error(who() + " has " + str(s->table().size()) + " blocks for " + str(s->num_slots) +
                           " slots (expected " + str(want) + ")");
    }
    const int32_t pool = s->swapped ? m.host_allocator().num_blocks() : m.device_allocator().num_blocks();
    Status found = Status::ok();
    // Every group's blocks are distinct from every other's (a block belongs to one table),
    // and each group maps its positions to distinct slots.
    for (const GroupTable& gt : s->groups) {
      for (int64_t i = 0; i < gt.table.size() && found.is_ok(); ++i) {
        const int32_t b = gt.table[i];
        if (b == kNoBlock && i < gt.num_window_released) continue;  // released by the window (I11)
        if (b < 0 || b >= pool) {
          found = Status::error(who() + " table[" + str(i) + "] = " + str(b) + " is outside the " +
                                (s->swapped ? "host" : "device") + " pool");
        } else if (block_seen[static_cast<size_t>(b)]++) {
          found = Status::error(who() + " names block " + str(b) + " twice");
        }
      }
      const int64_t end = std::min(s->num_slots, gt.table.size() * bs);  // I12 reports a short table
      for (int64_t p = gt.num_window_released * bs; p < end && found.is_ok(); ++p) {
        const int64_t slot = kernels::slot_of(gt.table.data(), p, bs);
        if (slot_seen[static_cast<size_t>(slot)]++) {
          found = Status::error(who() + " maps two positions to slot " + str(slot) + " (second at position " + str(p) +
                                ")");
        }
      }
    }
    for (const GroupTable& gt : s->groups) {
      for (int32_t b : gt.table.blocks()) {
        if (b < 0 || b >= max_blocks) continue;
        block_seen[static_cast<size_t>(b)] = 0;
        std::fill_n(slot_seen.begin() + static_cast<std::ptrdiff_t>(b * bs), bs, uint8_t{0});
      }
    }
    KVP_RETURN_IF_ERROR(found);
  }
  return Status::ok();
}

Status check_slot_mapping(const KvCacheManager& m, SeqId seq, int64_t start, std::span<const int64_t> slot_mapping,
                          int64_t group) {
  const SequenceState* s = m.sequence(seq);
  if (s == nullptr) return Status::error("I5: unknown sequence " + str(seq));
  if (group < 0 || group >= s->num_groups()) {
    return Status::error("I5: sequence " + str(seq) + " has no KV-cache group " + str(group));
  }
  const GroupTable& gt = s->group(group);
  const int64_t bs = m.block_size();
  const auto n = static_cast<int64_t>(slot_mapping.size());
  if (start < 0 || start + n > s->num_slots) {
    return Status::error("I5: sequence " + str(seq) + " slot mapping covers positions [" + str(start) + ", " +
                         str(start + n) + ") beyond its " + str(s->num_slots) + " slots");
  }
  if (start / bs < gt.num_window_released) {
    return Status::error("I5: sequence " + str(seq) + " slot mapping starts at position " + str(start) +
                         ", in a block the sliding window released");
  }
  for (int64_t k = 0; k < n; ++k) {
    const int64_t want = kernels::slot_of(gt.table.data(), start + k, bs);
    if (slot_mapping[static_cast<size_t>(k)] != want) {
      return Status::error("I5: sequence " + str(seq) + " position " + str(start + k) + " mapped to slot " +
                           str(slot_mapping[static_cast<size_t>(k)]) + ", the table gives " + str(want));
    }
  }
  return Status::ok();
}

Status check_prefix_cache(const KvCacheManager& m, ChainHashMemo* memo) {
  const BlockAllocator& a = m.device_allocator();
  const PrefixCache& cache = m.prefix_cache();
  const int64_t bs = m.block_size();
  for (int32_t b = 0; b < a.num_blocks(); ++b) {
    if (a.is_cached(b) != cache.contains(b)) {
      return Status::error("prefix cache: block " + str(b) + " is " + (a.is_cached(b) ? "" : "not ") +
                           "marked cached but " + (cache.contains(b) ? "has" : "has no") + " cache entry");
    }
  }
  std::vector<int> indexed(static_cast<size_t>(a.num_blocks()), 0);
  for (const auto& [h, b] : cache.index_pairs()) {
    if (b < 0 || b >= a.num_blocks() || !cache.contains(b)) {
      return Status::error("prefix cache: index names block " + str(b) + " with no entry");
    }
    if (cache.entry(b).hash != h) {
      return Status::error("prefix cache: block " + str(b) +
                           " is indexed under a hash "
                           "that is not its entry's");
    }
    ++indexed[static_cast<size_t>(b)];
  }
  for (int32_t b : cache.blocks()) {
    if (indexed[static_cast<size_t>(b)] != 1) {
      return Status::error("prefix cache: block " + str(b) + " is indexed " + str(indexed[static_cast<size_t>(b)]) +
                           " times (expected 1)");
    }
    const PrefixCacheEntry& e = cache.entry(b);
    if (static_cast<int64_t>(e.tokens.size()) != bs) {
      return Status::error("prefix cache: block " + str(b) + " entry holds " +
                           str(static_cast<int64_t>(e.tokens.size())) + " tokens, not a full block");
    }
    if (e.group < 0 || e.group >= m.config().num_groups()) {
      return Status::error("prefix cache: block " + str(b) + " entry names KV-cache group " + str(e.group) + " of " +
                           str(m.config().num_groups()));
    }
    const BlockHash* parent = nullptr;
    if (e.parent.block >= 0) {
      if (!a.is_current(e.parent) || !cache.contains(e.parent.block)) continue;  // stale chain
      const int64_t anchor = m.config().anchor_group();
      const int32_t parent_group = cache.entry(e.parent.block).group;
      const bool anchored = anchor >= 0 && e.group != anchor;
      if (parent_group != (anchored ? anchor : e.group)) {
        return Status::error("I12: prefix cache: block " + str(b) + " of group " + str(e.group) +
                             " is chained onto block " + str(e.parent.block) + " of group " + str(parent_group) +
                             (anchored ? " (not the anchor group " + str(anchor) + ")" : ""));
      }
      if (anchored) {
        // Registered under the anchor's block of the same positions: the same chain hash.
        if (cache.entry(e.parent.block).hash != e.hash || cache.entry(e.parent.block).tokens != e.tokens ||
            cache.entry(e.parent.block).salt != e.salt) {
          return Status::error("prefix cache: block " + str(b) + " of group " + str(e.group) +
                               " is registered under anchor block " + str(e.parent.block) +
                               ", whose hash, tokens or salt differ");
        }
        continue;
      }
      parent = &cache.entry(e.parent.block).hash;
    } else if (anchor_parent_required(m, e)) {
      return Status::error("I12: prefix cache: block " + str(b) + " of group " + str(e.group) +
                           " has no parent; it must be registered under an anchor block");
    }
    ChainHashMemo::Verified* seen = nullptr;
    if (memo != nullptr) {
      if (memo->by_block.size() < static_cast<size_t>(a.num_blocks()))
        memo->by_block.resize(static_cast<size_t>(a.num_blocks()));
      seen = &memo->by_block[static_cast<size_t>(b)];
      if (seen->valid && seen->has_parent == (parent != nullptr) && (parent == nullptr || seen->parent == *parent) &&
          seen->salt == e.salt && seen->tokens == e.tokens && seen->hash == e.hash)
        continue;
    }
    if (chain_hash(parent, e.salt, e.tokens, m.config().hash_bits) != e.hash) {
      return Status::error("prefix cache: block " + str(b) +
                           " entry hash is not the chain hash of its parent, salt and tokens");
    }
    if (seen != nullptr)
      *seen = {true, parent != nullptr, parent != nullptr ? *parent : BlockHash{}, e.salt, e.tokens, e.hash};
  }
  return Status::ok();
}

Status check_no_leak(const KvCacheManager& m) {
  if (m.num_sequences() != 0) return Status::ok();
  for (bool host : {false, true}) {
    const BlockAllocator& a = host ? m.host_allocator() : m.device_allocator();
    for (int32_t b = 0; b < a.num_blocks(); ++b) {
      if (a.refcount(b) != 0) {
        return Status::error(std::string("I6: no sequences remain but ") + (host ? "host" : "device") + " block " +
                             str(b) + " has refcount " + str(a.refcount(b)));
      }
    }
    if (a.num_in_use() != 0) {
      return Status::error(std::string("I6: no sequences remain but ") + str(a.num_in_use()) +
                           (host ? " host" : " device") + " blocks are in use");
    }
  }
  return Status::ok();
}

Status check_all_free(const KvCacheManager& m) {
  if (m.num_sequences() != 0) {
    return Status::error("I6: " + str(m.num_sequences()) + " sequences remain");
  }
  KVP_RETURN_IF_ERROR(check_no_leak(m));
  if (m.prefix_cache().size() != 0) {
    return Status::error("I6: " + str(m.prefix_cache().size()) + " prefix-cache entries remain");
  }
  for (bool host : {false, true}) {
    const BlockAllocator& a = host ? m.host_allocator() : m.device_allocator();
    if (a.num_free() != a.num_blocks()) {
      return Status::error(std::string("I6: ") + (host ? "host" : "device") + " pool has " + str(a.num_free()) +
                           " of " + str(a.num_blocks()) + " blocks free");
    }
  }
  return Status::ok();
}

Status check_accepted_only_cache(const KvCacheManager& m) {
  const BlockAllocator& dev = m.device_allocator();
  for (int32_t b : m.prefix_cache().blocks()) {
    if (b < 0 || b >= dev.num_blocks()) continue;  // check_prefix_cache reports it
    if (m.rolled_back_generation(b) == static_cast<int64_t>(dev.generation(b))) {
      return Status::error("I9: device block " + str(b) + " (generation " + str(dev.generation(b)) +
                           ") is in the prefix cache but a truncate rolled back one of its positions");
    }
  }
  return Status::ok();
}

Status check_cache_reachable(const KvCacheManager& m) {
  const PrefixCache& cache = m.prefix_cache();
  const BlockAllocator& device = m.device_allocator();
  for (int32_t b : cache.blocks()) {
    int32_t at = b;
    // A chain longer than the number of cached blocks has a cycle.
    for (int64_t steps = 0;; ++steps) {
      const BlockHandle parent = cache.entry(at).parent;
      if (parent.block < 0) break;
      if (steps > cache.size()) return Status::error("hygiene: cached block " + str(b) + "'s chain has a cycle");
      if (!device.is_current(parent) || !cache.contains(parent.block)) {
        return Status::error("hygiene: cached block " + str(b) +
                             " is unreachable: " + (at == b ? "it" : "its ancestor " + str(at)) +
                             " was cached under block " + str(parent.block) + " (generation " + str(parent.generation) +
                             "), which is no longer " + (device.is_current(parent) ? "cached" : "that allocation"));
      }
      at = parent.block;
    }
  }
  return Status::ok();
}

namespace {
// I11 for group g of one sequence.
Status check_group_window(const KvCacheManager& m, const SequenceState& s, int64_t g) {
  const int64_t w = m.config().window_of(g);
  const GroupTable& gt = s.group(g);
  // Stated from the window's definition, not the manager's helper: the first position the
  // next token (at num_final, or any later one) attends to, and the whole blocks before it.
  const int64_t dead = w > 0 ? kernels::window_first(s.num_final, w) / m.block_size() : 0;
  const auto who = [&] {
    return "I11: sequence " + str(s.id) + (m.config().num_groups() > 1 ? " group " + str(g) : std::string()) + " (" +
           str(s.num_final) + " final positions, window " + str(w) + ", " + str(dead) + " leading entries released)";
  };
  if (gt.num_window_released != dead) {
    return Status::error(who() + " counts " + str(gt.num_window_released) + " released entries");
  }
  for (int64_t j = 0; j < gt.table.size(); ++j) {
    const int32_t b = gt.table[j];
    if (j < dead && b != kNoBlock) {
      return Status::error(who() + " still holds block " + str(b) + " at index " + str(j) +
                           ", which no token it will run attends to");
    }
    if (j >= dead && b == kNoBlock) {
      return Status::error(who() + " released index " + str(j) + ", which position " + str(s.num_final) +
                           " still attends to");
    }
  }
  return Status::ok();
}
}  // namespace

Status check_window_blocks(const KvCacheManager& m) {
  for (const SequenceState* s : ordered_sequences(m)) {
    for (int64_t g = 0; g < std::min(s->num_groups(), m.config().num_groups()); ++g) {
      KVP_RETURN_IF_ERROR(check_group_window(m, *s, g));
    }
  }
  return Status::ok();
}

Status check_group_tables(const KvCacheManager& m) {
  const int64_t groups = m.config().num_groups();
  for (const SequenceState* s : ordered_sequences(m)) {
    if (s->num_groups() != groups) {
      return Status::error("I12: sequence " + str(s->id) + " has " + str(s->num_groups()) + " block tables for " +
                           str(groups) + " KV-cache groups");
    }
    const int64_t want = kernels::blocks_for_tokens(s->num_slots, m.block_size());
    for (int64_t g = 0; g < groups; ++g) {
      if (s->group(g).table.size() != want) {
        return Status::error("I12: sequence " + str(s->id) + "'s table in KV-cache group " + str(g) + " has " +
                             str(s->group(g).table.size()) + " entries for its " + str(s->num_slots) +
                             " positions (every group's table has " + str(want) + ")");
      }
    }
  }
  return Status::ok();
}

Status check_all(const KvCacheManager& m, ChainHashMemo* memo) {
  KVP_RETURN_IF_ERROR(check_conservation(m));
  KVP_RETURN_IF_ERROR(check_refcounts(m));
  KVP_RETURN_IF_ERROR(check_group_tables(m));
  KVP_RETURN_IF_ERROR(check_mapping(m));
  KVP_RETURN_IF_ERROR(check_window_blocks(m));
  KVP_RETURN_IF_ERROR(check_isolation(m));
  KVP_RETURN_IF_ERROR(check_prefix_cache(m, memo));
  KVP_RETURN_IF_ERROR(check_cache_reachable(m));
  KVP_RETURN_IF_ERROR(check_accepted_only_cache(m));
  return check_no_leak(m);
}

Status check_plan(const KvCacheManager& m, const BatchPlan& plan, const PlanBounds& bounds, PlanReadStats* stats) {
  const std::string at = "step " + str(plan.step) + ": ";
  const int64_t groups = m.config().num_groups();
  if (plan.num_groups != groups) {
    return Status::error(at + "I12: the plan carries " + str(plan.num_groups) +
                         " KV-cache groups' tables, the manager has " + str(groups));
  }
  if (plan.num_tokens() > bounds.max_num_batched_tokens)
    return Status::error(at + "I8: " + str(plan.num_tokens()) + " tokens scheduled, budget " +
                         str(bounds.max_num_batched_tokens));
  if (bounds.num_running > bounds.max_num_seqs)
    return Status::error(at + "I8: " + str(bounds.num_running) + " running, max_num_seqs " + str(bounds.max_num_seqs));
  const bool global = m.config().global_prefix_sharing;
  std::unordered_map<int32_t, std::vector<const SequenceState*>> holders;
  for (const auto& [id, s] : m.sequences())
    if (!s.swapped)
      for (const GroupTable& gt : s.groups)
        for (int32_t b : gt.table.blocks())
          if (b != kNoBlock) holders[b].push_back(&s);
  const auto width = static_cast<std::size_t>(plan.max_blocks_per_seq);
  for (int64_t i = 0; i < plan.num_seqs(); ++i) {
    const auto ui = static_cast<std::size_t>(i);
    const SeqId id = plan.seq_ids[ui];
    const std::string where = at + "sequence " + str(id);
    const SequenceState* s = m.sequence(id);
    if (s == nullptr) return Status::error(where + ": I5: not known to the KV-cache manager");
    if (s->swapped) return Status::error(where + ": I5: scheduled while swapped out");
    const int64_t first = plan.query_start[ui];
    const int64_t n = plan.query_start[ui + 1] - first;
    const int64_t context = plan.context_lens[ui];
    if (context > bounds.max_model_len)
      return Status::error(where + ": I8: context " + str(context) + " beyond max_model_len " +
                           str(bounds.max_model_len));
    if (context != s->num_slots)
      return Status::error(where + ": I5: context length " + str(context) + " but " + str(s->num_slots) +
                           " slots reserved");
    for (int64_t g = 0; g < groups; ++g) {
      const BlockTable& table = s->group(g).table;
      const std::string in = groups > 1 ? " of group " + str(g) : std::string();
      const int32_t* row = plan.table_row(g, i);
      for (std::size_t j = 0; j < width; ++j) {
        const int32_t want = static_cast<int64_t>(j) < table.size() ? table[static_cast<int64_t>(j)] : -1;
        if (row[j] != want)
          return Status::error(where + ": I5: block-table entry " + str(static_cast<int64_t>(j)) + in + " is " +
                               str(row[j]) + ", the manager's table has " + str(want));
      }
      const std::span<const int64_t> slots(plan.group_slots(g) + first, static_cast<std::size_t>(n));
      if (Status st = check_slot_mapping(m, id, context - n, slots, g); !st) return Status::error(at + st.message());
      if (Status st = check_exclusive_write(m, id, slots, g); !st) return Status::error(at + st.message());
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t pos = plan.positions[static_cast<std::size_t>(first + k)];
      const int32_t tok = plan.token_ids[static_cast<std::size_t>(first + k)];
      if (pos < 0 || pos >= static_cast<int64_t>(s->tokens.size()) || s->tokens[static_cast<std::size_t>(pos)] != tok)
        return Status::error(where + ": I10: the plan carries token " + str(tok) + " at position " + str(pos) +
                             ", the sequence's token history has " +
                             (pos >= 0 && pos < static_cast<int64_t>(s->tokens.size())
                                  ? str(s->tokens[static_cast<std::size_t>(pos)])
                                  : std::string("none")));
      if (stats != nullptr) stats->kv_position_reads += pos + 1;
    }
    const int64_t nblocks = kernels::blocks_for_tokens(context, m.block_size());
    for (int64_t g = 0; g < groups; ++g) {
      const int32_t* row = plan.table_row(g, i);
      // The first block any new token reads: the window's of the first one (I11: never released).
      const int64_t first_read = kernels::window_first(context - n, m.config().window_of(g)) / m.block_size();
      for (int64_t j = first_read; j < nblocks; ++j) {
        const int32_t b = row[static_cast<std::size_t>(j)];
        if (b == kNoBlock)
          return Status::error(
              where + ": I11: a new token at position " + str(context - n) + " attends to block-table entry " + str(j) +
              (groups > 1 ? " of group " + str(g) : std::string()) + ", which the sliding window released");
        if (!global) {
          for (const SequenceState* h : holders[b]) {
            if (h->tenant != s->tenant)
              return Status::error(where + " (tenant " + str(s->tenant) + "): I4: reads block " + str(b) +
                                   " (block-table index " + str(j) + "), also held by sequence " + str(h->id) +
                                   " of tenant " + str(h->tenant));
          }
        }
        if (stats != nullptr) {
          ++stats->block_reads;
          stats->blocks.push_back(b);
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace kvp

namespace kvp {

Status check_prefix_hit(const KvCacheManager& m, const PrefixHit& hit) {
  const SequenceState* s = m.sequence(hit.seq);
  const auto who = [&] { return "I13: prefix hit of sequence " + str(hit.seq); };
  if (s == nullptr) return Status::error(who() + ": unknown sequence");
  if (!m.is_current(hit, hit.seq)) return Status::error(who() + ": stale (the manager changed since it was found)");
  const int64_t bs = m.block_size();
  const int64_t groups = m.config().num_groups();
  if (!(hit.blocks.empty() && hit.num_tokens == 0) && static_cast<int64_t>(hit.blocks.size()) != groups) {
    return Status::error(who() + " has " + str(static_cast<int64_t>(hit.blocks.size())) + " chains for " + str(groups) +
                         " KV-cache groups");
  }
  const bool may_hit =
      m.config().enable_prefix_caching && !s->swapped && s->table().empty() && s->num_slots == 0 && !s->tokens.empty();
  // At least the last token is recomputed.
  const int64_t max_blocks = may_hit ? (static_cast<int64_t>(s->tokens.size()) - 1) / bs : 0;
  const int64_t k = hit.num_tokens / bs;
  if (hit.num_tokens % bs != 0 || k < 0 || k > max_blocks) {
    return Status::error(who() + " skips " + str(hit.num_tokens) + " tokens; at most " + str(max_blocks) +
                         " whole blocks of " + str(bs) + " may be skipped");
  }
  const PrefixCache& cache = m.prefix_cache();
  const BlockAllocator& a = m.device_allocator();
  // Whether cached block b serves group g's block i of the sequence after `parent`.
  const auto serves = [&](int32_t b, int64_t g, int64_t i, BlockHandle parent) {
    if (b < 0 || b >= a.num_blocks() || !cache.contains(b)) return false;
    const PrefixCacheEntry& e = cache.entry(b);
    return e.group == g && e.parent == parent && m.same_block_content(e, *s, i);
  };
  static const std::vector<int32_t> kNone;
  const auto chain_of = [&](int64_t g) -> const std::vector<int32_t>& {
    return hit.blocks.empty() ? kNone : hit.blocks[static_cast<size_t>(g)];
  };
  for (int64_t g = 0; g < groups; ++g) {
    if (static_cast<int64_t>(chain_of(g).size()) != k) {
      return Status::error(who() + ": group " + str(g) + "'s chain has " +
                           str(static_cast<int64_t>(chain_of(g).size())) + " blocks for " + str(hit.num_tokens) +
                           " tokens (every group serves the whole hit)");
    }
  }
  const std::vector<int32_t> cached = cache.blocks();
  // A cached block serving group g's block i after `parent`, or -1 (scanned over the whole
  // cache, not through its index).
  const auto any_serving = [&](int64_t g, int64_t i, BlockHandle parent) {
    for (int32_t b : cached) {
      if (serves(b, g, i, parent)) return b;
    }
    return -1;
  };
  int64_t evictable = 0;
  const int64_t anchor = m.config().anchor_group();
  if (anchor >= 0) {
    // The anchor's chain from its root; every other group g the blocks its window needs
    // before position k * bs ([window_dead_blocks, k)), each registered under the anchor's
    // block of the same index; the entries before them -1 (released as the hit is taken).
    const std::vector<int32_t>& base = chain_of(anchor);
    BlockHandle parent;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t b = base[static_cast<size_t>(i)];
      if (!serves(b, anchor, i, parent)) {
        return Status::error(who() + ": anchor group " + str(anchor) + "'s block " + str(b) + " at index " + str(i) +
                             " is not a cached block of that group holding the sequence's tokens after its chain");
      }
      parent = a.handle(b);
      if (a.refcount(b) == 0) ++evictable;
    }
    // Whether every other group serves the window before k2 blocks over anchor chain `over`.
    const auto all_windows_served = [&](int64_t k2, const std::vector<int32_t>& over, bool count) {
      for (int64_t g = 0; g < groups; ++g) {
        if (g == anchor) continue;
        const int64_t dead = m.window_dead_blocks(k2 * bs, g);
        for (int64_t j = dead; j < k2; ++j) {
          const BlockHandle under = a.handle(over[static_cast<size_t>(j)]);
          if (!count) {
            if (any_serving(g, j, under) < 0) return false;
            continue;
          }
          const int32_t b = chain_of(g)[static_cast<size_t>(j)];
          if (!serves(b, g, j, under)) return false;
          if (a.refcount(b) == 0) ++evictable;
        }
      }
      return true;
    };
    for (int64_t g = 0; g < groups; ++g) {
      if (g == anchor) continue;
      const int64_t dead = m.window_dead_blocks(hit.num_tokens, g);
      for (int64_t j = 0; j < dead; ++j) {
        if (chain_of(g)[static_cast<size_t>(j)] != kNoBlock) {
          return Status::error(who() + ": group " + str(g) + " takes block " +
                               str(chain_of(g)[static_cast<size_t>(j)]) + " at index " + str(j) +
                               ", before the window of position " + str(hit.num_tokens));
        }
      }
    }
    if (!all_windows_served(k, base, /*count=*/true)) {
      return Status::error(who() + ": a windowed group's block is not a cached block of that group holding the " +
                           "sequence's tokens under the anchor's block of the same index");
    }
    // Maximal: no longer anchor chain has every window served.
    std::vector<int32_t> longer = base;
    for (int64_t k2 = k + 1; k2 <= max_blocks; ++k2) {
      const int32_t next = any_serving(anchor, k2 - 1, k2 == 1 ? BlockHandle{} : a.handle(longer.back()));
      if (next < 0) break;
      longer.push_back(next);
      if (all_windows_served(k2, longer, /*count=*/false)) {
        return Status::error(who() + " stops at " + str(k) + " blocks, but every group serves " + str(k2) +
                             " (the anchor's chain and every window before it)");
      }
    }
  } else {
    bool every_group_extends = k < max_blocks;
    for (int64_t g = 0; g < groups; ++g) {
      const std::vector<int32_t>& chain = chain_of(g);
      BlockHandle parent;
      for (int64_t i = 0; i < k; ++i) {
        const int32_t b = chain[static_cast<size_t>(i)];
        if (!serves(b, g, i, parent)) {
          return Status::error(who() + ": group " + str(g) + "'s block " + str(b) + " at index " + str(i) +
                               " is not a cached block of that group holding the sequence's tokens after its chain");
        }
        parent = a.handle(b);
        if (i >= m.window_dead_blocks(hit.num_tokens, g) && a.refcount(b) == 0) ++evictable;
      }
      // The hit is as long as every group can serve: some group has no next block.
      if (every_group_extends) every_group_extends = any_serving(g, k, parent) >= 0;
    }
    if (every_group_extends) {
      return Status::error(who() + " stops at " + str(k) + " blocks, but every group caches the sequence's block " +
                           str(k) + " (of at most " + str(max_blocks) + ")");
    }
  }
  if (hit.num_evictable != evictable) {
    return Status::error(who() + " counts " + str(int64_t{hit.num_evictable}) + " evictable blocks it keeps; " +
                         str(evictable) + " have refcount 0");
  }
  return Status::ok();
}

}  // namespace kvp
