// The memory accounting of kvproof simulate, and its two checkers.
//
// A memory sample (MemorySlots) splits, in token slots, the KV memory requests hold plus
// the free memory the head of the queue cannot use (simulate.h defines each term):
//   token_states + reserved + internal = held   the device blocks in use (paged), or the
//                                               requests' reservations (contiguous)
//   held + external                    = total  the sample's shares are term / total
// so the shares of a sample sum to 1 exactly when the integer terms sum to what they split.
// A run's shares are the sums of its samples' terms over the sum of their totals.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "optimized/kv/kv_cache_manager.h"

namespace kvp::sim {

struct MemorySlots {
  int64_t token_states = 0, reserved = 0, internal = 0, external = 0;
  int64_t held() const { return token_states + reserved + internal; }
  int64_t total() const { return held() + external; }
  MemorySlots& operator+=(const MemorySlots& o) {
    token_states += o.token_states;
    reserved += o.reserved;
    internal += o.internal;
    external += o.external;
    return *this;
  }
  friend bool operator==(const MemorySlots&, const MemorySlots&) = default;
};

// A request in the engine, as the simulator knows it.
struct HeldRequest {
  SeqId seq = 0;                         // its KV-cache sequence (the engine's request id; a parallel sample's own)
  int64_t final_len = 0;                 // prompt + output: the most tokens it will ever hold
  int64_t res_offset = -1, res_len = 0;  // its contiguous reservation (contiguous policies)
};

// What a memory sample is recounted from.
struct MemoryAccountingState {
  const KvCacheManager* kv = nullptr;
  bool contiguous = false;
  std::vector<HeldRequest> requests;  // every request in the engine
  // Contiguous policies only: the memory's size and free slots as the first-fit allocator
  // has them, and the reservation the head of the queue waits for (0: nobody waits).
  int64_t capacity = 0, free_slots = 0, head_reservation = 0;
};

// The accounting invariant of one sample: `reported` is what an independent count of the
// memory gives. Paged: from the KV manager's blocks alone — the device blocks in use (by
// their states), the distinct blocks device-resident tables name (a block shared by prefix
// sharing or a fork counts once), a slot per position below each sequence's num_slots
// (token states), a slot per position from there to its final length within its table
// (reserved, unless another holder's token is there), the named blocks' other slots
// (internal); external is 0. Contiguous: the reservations, disjoint and inside the memory,
// their gaps are the allocator's free slots, the slots of each sequence within its
// reservation; external is the free slots in gaps shorter than the head's reservation.
// Error: the first term (or sum) that differs, with both numbers. O(slots held + blocks).
// REQUIRES: state.kv != nullptr.
Status check_memory_accounting(const MemoryAccountingState& state, const MemorySlots& reported);

struct SimReport;

// The accounting invariant of a report: its memory totals are the sums of its timeline's
// samples (integers, exactly), each sample's kv_in_use and kv_tokens are its held and
// token-state slots over the capacity, and the run's four shares are its totals over their
// sum and add up to 1 (up to the rounding of four divisions).
Status check_memory_shares(const SimReport& report);

}  // namespace kvp::sim
