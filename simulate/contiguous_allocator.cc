#include "simulate/contiguous_allocator.h"

#include <algorithm>
#include <iterator>

#include "common/status.h"

namespace kvp::sim {

ContiguousAllocator::ContiguousAllocator(int64_t capacity) : capacity_(capacity), free_slots_(capacity) {
  KVP_CHECK(capacity >= 0);
  if (capacity > 0) holes_.emplace(0, capacity);
}

int64_t ContiguousAllocator::allocate(int64_t len) {
  KVP_CHECK(len > 0);
  for (auto it = holes_.begin(); it != holes_.end(); ++it) {
    if (it->second < len) continue;
    const int64_t offset = it->first;
    const int64_t rest = it->second - len;
    holes_.erase(it);
    if (rest > 0) holes_.emplace(offset + len, rest);
    free_slots_ -= len;
    return offset;
  }
  return -1;
}

bool ContiguousAllocator::try_extend(int64_t offset, int64_t len, int64_t new_len) {
  KVP_CHECK(new_len >= len);
  if (new_len == len) return true;
  auto it = holes_.find(offset + len);
  const int64_t more = new_len - len;
  if (it == holes_.end() || it->second < more) return false;
  const int64_t rest = it->second - more;
  holes_.erase(it);
  if (rest > 0) holes_.emplace(offset + new_len, rest);
  free_slots_ -= more;
  return true;
}

void ContiguousAllocator::free(int64_t offset, int64_t len) {
  KVP_CHECK(len > 0 && offset >= 0 && offset + len <= capacity_);
  auto next = holes_.lower_bound(offset);
  KVP_CHECK(next == holes_.end() || next->first >= offset + len);
  int64_t start = offset, end = offset + len;
  if (next != holes_.begin()) {
    auto prev = std::prev(next);
    KVP_CHECK(prev->first + prev->second <= offset);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      holes_.erase(prev);
    }
  }
  if (next != holes_.end() && next->first == end) {
    end += next->second;
    holes_.erase(next);
  }
  holes_.emplace(start, end - start);
  free_slots_ += len;
}

int64_t ContiguousAllocator::largest_hole() const {
  int64_t best = 0;
  for (const auto& [off, len] : holes_) best = std::max(best, len);
  return best;
}

int64_t ContiguousAllocator::free_in_holes_smaller_than(int64_t len) const {
  int64_t sum = 0;
  for (const auto& [off, l] : holes_)
    if (l < len) sum += l;
  return sum;
}

}  // namespace kvp::sim
