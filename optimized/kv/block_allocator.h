// BlockAllocator: a fixed pool of KV blocks with reference counts.
//
// Every block is in exactly one state (invariant I1):
//   kFree       refcount 0, not cached; in the fresh list.
//   kInUse      refcount > 0; in no list.
//   kEvictable  refcount 0, cached (its content is named in the prefix cache); in the
//               evictable list, least recently released first.
//
// allocate() takes the head of the fresh list; only when that list is empty does it take
// the head of the evictable list (evicting the least recently released cached block). Both
// lists are intrusive doubly linked lists over per-block links, so allocate, release, and
// retain of an evictable block (removal from the middle) are all O(1). Released blocks are
// appended at the tail of their list, so the free-list order is documented and testable:
// initially 0, 1, ..., num_blocks-1; then in release order.
//
// Every allocate bumps the block's generation, so a (block, generation) handle kept past a
// release and reuse is detectably stale.
//
// One instance serves the device pool and another the host (swap) pool. The allocator knows
// nothing about sequences or hashes; KvCacheManager keeps the tables and the prefix cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvp {

enum class BlockState : uint8_t { kFree, kInUse, kEvictable };

struct BlockHandle {
  int32_t block = -1;
  uint32_t generation = 0;
  friend bool operator==(const BlockHandle&, const BlockHandle&) = default;
};

class BlockAllocator {
 public:
  // REQUIRES: num_blocks >= 0.
  explicit BlockAllocator(int32_t num_blocks);

  struct Allocation {
    int32_t block = -1;
    bool evicted = false;  // the block was cached-evictable; the caller drops its cache entry
  };

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free() const { return fresh_.size; }
  int32_t num_evictable() const { return evictable_.size; }
  int32_t num_in_use() const { return num_blocks() - num_free() - num_evictable(); }
  // Blocks allocate() can hand out: free plus evictable.
  int32_t num_available() const { return fresh_.size + evictable_.size; }

  // Takes a block, refcount 0 -> 1, generation + 1. A taken evictable block loses its cached
  // mark. REQUIRES: num_available() > 0.
  Allocation allocate();

  // refcount + 1. An evictable block (a prefix-cache hit on a released block) leaves the
  // evictable list. REQUIRES: state(block) != kFree.
  void retain(int32_t block);

  // refcount - 1. At zero the block goes to the tail of the evictable list if cached, else
  // to the tail of the fresh list. Returns true when the refcount reached zero.
  // REQUIRES: state(block) == kInUse.
  bool release(int32_t block);

  // Marks a block's content as named by the prefix cache. REQUIRES: state(block) == kInUse.
  void mark_cached(int32_t block);
  // Removes the cached mark (the cache forgot the block); an evictable block becomes free
  // (moved to the tail of the fresh list). REQUIRES: is_cached(block).
  void clear_cached(int32_t block);

  // The block allocate() would take next (-1 when none): the head of the fresh list, else
  // the head of the evictable list.
  int32_t next_victim() const;
  // The least recently released evictable block (-1 when none).
  int32_t lru_evictable() const { return evictable_.head; }

  BlockState state(int32_t block) const;
  int32_t refcount(int32_t block) const { return blocks_[idx(block)].refcount; }
  uint32_t generation(int32_t block) const { return blocks_[idx(block)].generation; }
  bool is_cached(int32_t block) const { return blocks_[idx(block)].cached; }
  BlockHandle handle(int32_t block) const { return {block, generation(block)}; }
  // True when `h` names the block's current allocation (not a stale, reused one).
  bool is_current(BlockHandle h) const {
    return h.block >= 0 && h.block < num_blocks() && generation(h.block) == h.generation;
  }

  // The lists in order, head first (for checkers and tests; O(n)).
  std::vector<int32_t> free_list() const { return list_items(fresh_); }
  std::vector<int32_t> evictable_list() const { return list_items(evictable_); }

  // Debug access for the invariant checkers: whether the block's links say it is in the
  // fresh list / evictable list.
  bool in_fresh_list(int32_t block) const { return blocks_[idx(block)].list == kFreshList; }
  bool in_evictable_list(int32_t block) const { return blocks_[idx(block)].list == kEvictableList; }

 private:
  static constexpr int32_t kNil = -1;
  static constexpr uint8_t kNoList = 0, kFreshList = 1, kEvictableList = 2;

  struct Block {
    int32_t refcount = 0;
    uint32_t generation = 0;
    int32_t prev = kNil;
    int32_t next = kNil;
    bool cached = false;
    uint8_t list = kNoList;
  };
  struct List {
    int32_t head = kNil;
    int32_t tail = kNil;
    int32_t size = 0;
    uint8_t id = kNoList;
  };

  size_t idx(int32_t block) const;
  void push_back(List& list, int32_t block);
  void remove(List& list, int32_t block);
  std::vector<int32_t> list_items(const List& list) const;

  std::vector<Block> blocks_;
  List fresh_{kNil, kNil, 0, kFreshList};
  List evictable_{kNil, kNil, 0, kEvictableList};
};

}  // namespace kvp
