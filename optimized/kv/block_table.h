// BlockTable: one sequence's ordered list of block ids. Logical position p lives in
// block (*this)[p / block_size] (see kernels/kv_index.h). A table names blocks of one pool:
// the device pool while the sequence is resident, the host pool while it is swapped out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace kvp {

// A table entry whose block a sliding window released (every layer windowed: no token the
// sequence will still run attends to its positions). Such entries are always a table's
// leading ones; attention never reads them (kernels start at the window's first position).
inline constexpr int32_t kNoBlock = -1;

class BlockTable {
 public:
  int64_t size() const { return static_cast<int64_t>(blocks_.size()); }
  bool empty() const { return blocks_.empty(); }
  const int32_t* data() const { return blocks_.data(); }
  const std::vector<int32_t>& blocks() const { return blocks_; }

  // REQUIRES: 0 <= i < size().
  int32_t operator[](int64_t i) const { return blocks_[checked(i)]; }
  int32_t back() const { return (*this)[size() - 1]; }

  void push_back(int32_t block) { blocks_.push_back(block); }
  // REQUIRES: !empty().
  void pop_back() {
    KVP_CHECK(!blocks_.empty());
    blocks_.pop_back();
  }
  // Replaces entry i (copy-on-write, swap). REQUIRES: 0 <= i < size().
  void set(int64_t i, int32_t block) { blocks_[checked(i)] = block; }
  void clear() { blocks_.clear(); }

 private:
  size_t checked(int64_t i) const {
    KVP_CHECK(i >= 0 && i < size());
    return static_cast<size_t>(i);
  }
  std::vector<int32_t> blocks_;
};

}  // namespace kvp
