#include "optimized/kv/block_allocator.h"

#include "common/status.h"

namespace kvp {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  KVP_CHECK(num_blocks >= 0);
  blocks_.resize(static_cast<size_t>(num_blocks));
  for (int32_t b = 0; b < num_blocks; ++b) push_back(fresh_, b);
}

size_t BlockAllocator::idx(int32_t block) const {
  KVP_CHECK(block >= 0 && block < num_blocks());
  return static_cast<size_t>(block);
}

void BlockAllocator::push_back(List& list, int32_t block) {
  Block& b = blocks_[idx(block)];
  b.prev = list.tail;
  b.next = kNil;
  b.list = list.id;
  if (list.tail == kNil) {
    list.head = block;
  } else {
    blocks_[static_cast<size_t>(list.tail)].next = block;
  }
  list.tail = block;
  ++list.size;
}

void BlockAllocator::remove(List& list, int32_t block) {
  Block& b = blocks_[idx(block)];
  KVP_CHECK(b.list == list.id);
  if (b.prev == kNil) {
    list.head = b.next;
  } else {
    blocks_[static_cast<size_t>(b.prev)].next = b.next;
  }
  if (b.next == kNil) {
    list.tail = b.prev;
  } else {
    blocks_[static_cast<size_t>(b.next)].prev = b.prev;
  }
  b.prev = b.next = kNil;
  b.list = kNoList;
  --list.size;
}

std::vector<int32_t> BlockAllocator::list_items(const List& list) const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(list.size));
  for (int32_t b = list.head; b != kNil && out.size() <= blocks_.size(); b = blocks_[static_cast<size_t>(b)].next) {
    out.push_back(b);
  }
  return out;
}

BlockAllocator::Allocation BlockAllocator::allocate() {
  Allocation a;
  if (fresh_.head != kNil) {
    a.block = fresh_.head;
    remove(fresh_, a.block);
  } else {
    KVP_CHECK(evictable_.head != kNil);
    a.block = evictable_.head;
    remove(evictable_, a.block);
    a.evicted = true;
  }
  Block& b = blocks_[static_cast<size_t>(a.block)];
  b.refcount = 1;
  b.cached = false;
  ++b.generation;
  return a;
}

void BlockAllocator::retain(int32_t block) {
  Block& b = blocks_[idx(block)];
  if (b.refcount == 0) {
    KVP_CHECK(b.list == kEvictableList);
    remove(evictable_, block);
  }
  ++b.refcount;
}

bool BlockAllocator::release(int32_t block) {
  Block& b = blocks_[idx(block)];
  KVP_CHECK(b.refcount > 0);
  if (--b.refcount > 0) return false;
  push_back(b.cached ? evictable_ : fresh_, block);
  return true;
}

void BlockAllocator::mark_cached(int32_t block) {
  Block& b = blocks_[idx(block)];
  KVP_CHECK(b.refcount > 0);
  b.cached = true;
}

void BlockAllocator::clear_cached(int32_t block) {
  Block& b = blocks_[idx(block)];
  KVP_CHECK(b.cached);
  b.cached = false;
  if (b.refcount == 0) {
    remove(evictable_, block);
    push_back(fresh_, block);
  }
}

int32_t BlockAllocator::next_victim() const { return fresh_.head != kNil ? fresh_.head : evictable_.head; }

BlockState BlockAllocator::state(int32_t block) const {
  const Block& b = blocks_[idx(block)];
  if (b.refcount > 0) return BlockState::kInUse;
  return b.cached ? BlockState::kEvictable : BlockState::kFree;
}

}  // namespace kvp
