// The paged KV-cache index math: the one place a slot is computed.
//
// A block holds `block_size` consecutive token slots. A sequence's block table lists its
// block ids in order; logical position p lives in block table[p / block_size] at offset
// p % block_size, and its slot in the KV pool is block_id * block_size + offset.
// A slot of kSkipSlot (-1) in a slot mapping means "do not write".
//
// Every backend (CPU, CUDA, cost model) and every checker calls these functions; nothing
// else computes a slot. All functions are KVP_HOST_DEVICE and constexpr.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace kvp::kernels {

inline constexpr int64_t kSkipSlot = -1;

// Number of blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size).
// REQUIRES: num_tokens >= 0, block_size > 0.
KVP_HOST_DEVICE constexpr int64_t blocks_for_tokens(int64_t num_tokens, int64_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

// Index into the block table of the block holding `position`.
// REQUIRES: position >= 0, block_size > 0.
KVP_HOST_DEVICE constexpr int64_t block_index_of(int64_t position, int64_t block_size) { return position / block_size; }

// Offset of `position` inside its block.
// REQUIRES: position >= 0, block_size > 0.
KVP_HOST_DEVICE constexpr int64_t offset_in_block(int64_t position, int64_t block_size) {
  return position % block_size;
}

// The first position a query at `position` attends to: 0, or in a layer with a sliding
// window of `window` positions (window > 0) max(0, position - window + 1): the window holds
// the query's own position and the window - 1 before it (transformers' sliding-window mask,
// reference/ops.h attention_first). Blocks wholly before it are never read.
// REQUIRES: position >= 0, window >= 0.
KVP_HOST_DEVICE constexpr int64_t window_first(int64_t position, int64_t window) {
  return window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
}

// Slot of (block id, offset): block_id * block_size + offset.
// REQUIRES: block_id >= 0, 0 <= offset < block_size.
KVP_HOST_DEVICE constexpr int64_t slot_of_block(int64_t block_id, int64_t offset, int64_t block_size) {
  return block_id * block_size + offset;
}

// Slot of logical `position` of a sequence whose block table is `block_table`.
// REQUIRES: block_table holds at least blocks_for_tokens(position + 1, block_size) entries.
template <typename BlockId>
KVP_HOST_DEVICE constexpr int64_t slot_of(const BlockId* block_table, int64_t position, int64_t block_size) {
  return slot_of_block(static_cast<int64_t>(block_table[block_index_of(position, block_size)]),
                       offset_in_block(position, block_size), block_size);
}

// Block id that holds `slot`; the inverse of slot_of_block.
KVP_HOST_DEVICE constexpr int64_t block_of_slot(int64_t slot, int64_t block_size) { return slot / block_size; }

}  // namespace kvp::kernels
