// KvEvent: one state change of KvCacheManager, as a typed value. The manager records them;
// the EventLog (event_log.h) turns them into the JSON lines the independent replayer checks.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "optimized/kv/plan_ops.h"

namespace kvp::kv_event {

struct Init {
  int32_t device_blocks = 0, host_blocks = 0, block_size = 0;
  bool global_prefix = false;
  int64_t window = 0;  // every layer's sliding window (0: none, nothing is freed early)
  // KV-cache groups (KvCacheConfig::group_windows): each group's window; empty: one group.
  std::vector<int64_t> group_windows = {};
};
struct Add {  // a sequence appears, empty table
  int64_t seq = 0, tenant = 0;
};
struct Fork {  // child appears with parent's tenant, empty table
  int64_t parent = 0, child = 0;
};
// `group`: the KV-cache group whose table the event changes (vLLM's group_idx; 0 with one).
struct Alloc {  // a free device block appended to seq's table
  int64_t seq = 0;
  int32_t block = 0;
  int32_t group = 0;
};
enum class ShareReason { kPrefixHit, kFork };
struct Share {  // an existing device block appended (refcount + 1); block kNoBlock: a prefix
                // hit's entry before its group's window, appended released (nothing shared)
  int64_t seq = 0;
  int32_t block = 0;
  ShareReason reason = ShareReason::kPrefixHit;
  int32_t group = 0;
};
struct Cow {  // free block dst replaces src at table index; src released
  int64_t seq = 0, index = 0;
  int32_t src = 0, dst = 0;
  int32_t group = 0;
};
struct Release {  // seq's last table entry (block, or kNoBlock for a window-freed one) dropped, refcount - 1
  int64_t seq = 0;
  int32_t block = 0;
  int32_t group = 0;
};
struct WindowRelease {  // the sliding window left table entry `index` (block) behind: it is
                        // released (refcount - 1) and the entry becomes kNoBlock
  int64_t seq = 0, index = 0;
  int32_t block = 0;
  int32_t group = 0;
};
struct Slots {  // seq now has len positions with slots
  int64_t seq = 0, len = 0;
};
struct Cache {  // block's content named in the prefix cache
  int32_t block = 0;
};
struct Evict {  // block's cache entry dropped
  int32_t block = 0;
};
struct SwapOut {  // table moves to host blocks, in order: (device, host) pairs
  int64_t seq = 0;
  std::vector<BlockCopy> pairs;
};
struct SwapIn {  // table moves back to device blocks: (host, device) pairs
  int64_t seq = 0;
  std::vector<BlockCopy> pairs;
};
struct Poison {  // a freed device block is poisoned
  int32_t block = 0;
};
struct Free {  // seq (already with an empty table) ends
  int64_t seq = 0;
};

}  // namespace kvp::kv_event

namespace kvp {

using KvEvent =
    std::variant<kv_event::Init, kv_event::Add, kv_event::Fork, kv_event::Alloc, kv_event::Share, kv_event::Cow,
                 kv_event::Release, kv_event::WindowRelease, kv_event::Slots, kv_event::Cache, kv_event::Evict,
                 kv_event::SwapOut, kv_event::SwapIn, kv_event::Poison, kv_event::Free>;

}  // namespace kvp
