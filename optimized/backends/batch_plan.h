// BatchPlan: everything one engine step asks a backend to do, as flat arrays a GPU
// kernel can take directly (no pointers into engine objects), so the same plan drives the
// CPU, CUDA and cost-model backends. Every slot in it is already reserved in the
// KvCacheManager: the plan is executable as is.
//
// Per scheduled sequence i (CSR over the new tokens):
//   new tokens      [query_start[i], query_start[i+1])
//   context_lens[i] positions the sequence holds after this step; its new tokens are its
//                   last ones, so token t sits at position positions[t] and attends causally
//                   to positions [0, positions[t]]
//   block table     block_tables[i * max_blocks_per_seq + j], j < blocks_for_tokens(context_lens[i]),
//                   padded with -1
//   logits          every new token's row when logits_all[i], else only the last token's
//                   (none when needs_logits[i] is 0: a prefill chunk that is not the last)
// Per new token t: token_ids[t], positions[t], slot_mapping[t] (kernels::kSkipSlot = skip).
// KV-cache groups (num_groups > 1; KvCacheConfig::group_windows): block_tables and
// slot_mapping hold one section per group, group-major: group g's row of sequence i starts
// at block_tables[(g * num_seqs + i) * max_blocks_per_seq] (table_row), its slot of token t
// is slot_mapping[g * num_tokens + t] (group_slots). A layer reads and writes its group's.
//
// Execution order: ops (swap_out, block_copies, poison, swap_in; see plan_ops.h), then per
// layer: write every new token's K/V into its slot, then attention reads the whole context
// through the block table.
#pragma once

#include <cstdint>
#include <vector>

#include "optimized/kv/plan_ops.h"

namespace kvp {

struct BatchPlan {
  int64_t step = 0;

  std::vector<int64_t> seq_ids;
  std::vector<int32_t> query_start;  // num_seqs + 1 entries
  std::vector<int32_t> context_lens;
  int32_t max_blocks_per_seq = 0;
  int32_t num_groups = 1;             // KV-cache groups: sections of block_tables, slot_mapping
  std::vector<int32_t> block_tables;  // num_groups * num_seqs * max_blocks_per_seq
  std::vector<uint8_t> needs_logits;  // per sequence
  std::vector<uint8_t> logits_all;    // per sequence

  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<int64_t> slot_mapping;  // num_groups * num_tokens

  KvPlanOps ops;

  // Audit mode only (empty otherwise): the tenant of each scheduled sequence, and for every
  // device block the tenant whose sequences hold it (-1: nobody). A backend given these
  // refuses, before anything runs, a plan in which a sequence would read a block that
  // another tenant holds.
  std::vector<int64_t> seq_tenants;
  std::vector<int64_t> block_tenants;

  int64_t num_seqs() const { return static_cast<int64_t>(seq_ids.size()); }
  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  // Group g's block-table row of sequence i, and group g's slots (one per new token).
  const int32_t* table_row(int64_t g, int64_t i) const {
    return block_tables.data() + (g * num_seqs() + i) * static_cast<int64_t>(max_blocks_per_seq);
  }
  const int64_t* group_slots(int64_t g) const { return slot_mapping.data() + g * num_tokens(); }
  bool empty() const { return seq_ids.empty() && ops.empty(); }
};

// Logits a backend returns for one plan: for sequence i, rows
// [logit_row_start[i], logit_row_start[i+1]) of `logits` ([rows, vocab], row-major), one
// per token that the plan asked logits for, in token order.
struct StepOutput {
  int64_t vocab_size = 0;
  std::vector<int32_t> logit_row_start;
  std::vector<float> logits;

  const float* row(int64_t r) const { return logits.data() + r * vocab_size; }
};

// Rows of logits a plan asks for, per sequence (the contract backends implement).
inline int32_t logit_rows_for(const BatchPlan& plan, int64_t i) {
  if (!plan.needs_logits[static_cast<std::size_t>(i)]) return 0;
  if (plan.logits_all[static_cast<std::size_t>(i)])
    return plan.query_start[static_cast<std::size_t>(i) + 1] - plan.query_start[static_cast<std::size_t>(i)];
  return 1;
}

}  // namespace kvp
