// A first-fit allocator of contiguous ranges of token slots: the memory model of the
// contiguous baselines (contiguous-max, -pow2, -oracle) of kvproof simulate.
#pragma once

#include <cstdint>
#include <map>

namespace kvp::sim {

class ContiguousAllocator {
 public:
  // REQUIRES: capacity >= 0.
  explicit ContiguousAllocator(int64_t capacity);

  // The lowest offset of a free range of `len` slots, taken; -1 (nothing changes) when no
  // hole is large enough. REQUIRES: len > 0.
  int64_t allocate(int64_t len);
  // Grows [offset, offset + len) to new_len in place when the slots after it are free.
  // Returns whether it did. REQUIRES: the range is allocated, new_len >= len.
  bool try_extend(int64_t offset, int64_t len, int64_t new_len);
  // REQUIRES: [offset, offset + len) is allocated. Merges with neighbouring holes.
  void free(int64_t offset, int64_t len);

  int64_t capacity() const { return capacity_; }
  int64_t num_free() const { return free_slots_; }
  int64_t largest_hole() const;
  // Free slots in holes shorter than len.
  int64_t free_in_holes_smaller_than(int64_t len) const;
  int64_t num_holes() const { return static_cast<int64_t>(holes_.size()); }

 private:
  int64_t capacity_;
  int64_t free_slots_;
  std::map<int64_t, int64_t> holes_;  // offset -> length, disjoint, never adjacent
};

}  // namespace kvp::sim
