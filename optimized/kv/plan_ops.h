// KvPlanOps: the memory operations KvCacheManager emits for the backend, as flat (src, dst)
// lists a kernel can take directly. The scheduler moves them into its BatchPlan
// (KvCacheManager::take_plan_ops) once per step.
//
// A backend executes one step's lists in this order, then writes new K/V and runs attention:
//   1. swap_out     device block -> host block
//   2. block_copies device block -> device block (copy-on-write)
//   3. poison       device blocks filled with NaN (only with poison-on-free)
//   4. swap_in      host block -> device block
// The manager keeps the lists consistent with this order: a block is never the destination
// of a copy-on-write and listed for poison in the same step (the later claim wins), and the
// source of a swap-out or copy is poisoned only after it was read.
#pragma once

#include <cstdint>
#include <vector>

namespace kvp {

struct BlockCopy {
  int32_t src = -1;
  int32_t dst = -1;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

struct KvPlanOps {
  std::vector<BlockCopy> swap_out;      // src: device block, dst: host block
  std::vector<BlockCopy> block_copies;  // src, dst: device blocks
  std::vector<int32_t> poison;          // device blocks
  std::vector<BlockCopy> swap_in;       // src: host block, dst: device block

  bool empty() const { return swap_out.empty() && block_copies.empty() && poison.empty() && swap_in.empty(); }
  void clear() {
    swap_out.clear();
    block_copies.clear();
    poison.clear();
    swap_in.clear();
  }
};

}  // namespace kvp
