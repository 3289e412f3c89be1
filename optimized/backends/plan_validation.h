// The one plan validator every backend calls before it runs anything, and the backend-side
// tenant-scope check of audit mode. Both only read the plan; on an error the backend must
// change nothing (no pool, no output).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/model_config.h"
#include "optimized/backends/batch_plan.h"
#include "optimized/kv/kv_pool_shape.h"

namespace kvp {

// What a backend's model accepts, beside its pool.
struct PlanLimits {
  int64_t vocab_size = 0;               // token ids in [0, vocab_size)
  int64_t max_position_embeddings = 0;  // context_len <= this
  // Every layer's sliding window (ModelConfig::kv_window; 0: none): block-table entries
  // wholly before the window of a sequence's first new token may be -1 (released), the
  // rest must name pool blocks.
  int64_t window = 0;
  // KV-cache groups (KvCacheConfig::group_windows): each group's window; empty: one group
  // whose window is `window`. A plan must carry exactly these groups (BatchPlan::num_groups).
  std::vector<int64_t> group_windows;

  int64_t num_groups() const { return group_windows.empty() ? 1 : static_cast<int64_t>(group_windows.size()); }
  int64_t window_of(int64_t g) const { return group_windows.empty() ? window : group_windows[static_cast<size_t>(g)]; }
};

// A pool for `model`'s layers, KV heads and head dim.
KvPoolShape pool_shape_for(const ModelConfig& model, int32_t block_size, int32_t num_device_blocks,
                           int32_t num_host_blocks, DType kv_dtype = DType::kF32);
// The pool's model dimensions are the model's: an error names the first that differs.
Status check_pool_matches_model(const KvPoolShape& pool, const ModelConfig& model);

// The plan's shape against batch_plan.h's contract: array sizes (CSR query_start over the
// tokens, one context length / logits flag per sequence, block_tables num_seqs x
// max_blocks_per_seq, one position and slot per token), token ids in the vocabulary, every
// sequence has >= 1 new token and its new tokens are its last positions in order, context
// lengths within the model and the table, block-table entries and slots inside the device
// pool, memory ops' blocks inside their pools. The audit arrays are either both empty or
// sized num_seqs and num_device_blocks. With KV-cache groups, the plan has the limits'
// groups and every group's section is checked with its window. Returns the first violation,
// naming the array, index and value.
//
// It does not check that the slot mapping agrees with the block tables or who owns which
// block (I3-I5): those are the invariant checkers' business (check_plan in
// optimized/checkers/invariants.h); a plan that breaks them runs and shows up as wrong or
// NaN logits.
Status validate_plan(const BatchPlan& plan, const KvPoolShape& pool, const PlanLimits& limits);

// Audit mode (plan.seq_tenants / plan.block_tenants filled): every block each sequence's
// attention will read (its block-table row up to its context length, from the block of
// the first new token's window on: `window` is PlanLimits::window) is held by the
// sequence's own tenant. Returns the number of (sequence, block) reads checked, 0 when the
// plan carries no audit arrays. REQUIRES: validate_plan(plan, ...) is ok.
Result<int64_t> check_plan_read_scope(const BatchPlan& plan, const KvPoolShape& pool, int64_t window = 0);
// The same for every KV-cache group of `limits`, each with its window.
Result<int64_t> check_plan_read_scope(const BatchPlan& plan, const KvPoolShape& pool, const PlanLimits& limits);

// What every backend's execute() runs before it changes anything: validate_plan, then
// check_plan_read_scope. Returns the audited block reads.
Result<int64_t> preflight_plan(const BatchPlan& plan, const KvPoolShape& pool, const PlanLimits& limits);

// The rows of a step's output, the same in every backend: per sequence i its last
// logit_rows_for(plan, i) tokens, in plan order. Sets out.vocab_size and out.logit_row_start
// and zeroes out.logits; fills seq_of_token[t] (token t's sequence) and returns the tokens
// whose rows they are. REQUIRES: validate_plan(plan, ...) is ok.
std::vector<int32_t> lay_out_logit_rows(const BatchPlan& plan, int64_t vocab_size, StepOutput& out,
                                        std::vector<int32_t>& seq_of_token);

// Gemma's final soft-capping of a step's n logits in place, every backend alike
// (kernels::soft_cap on the host: the same bits); nothing without final_logit_softcapping.
void apply_final_softcap(const ModelConfig& c, float* logits, int64_t n);

}  // namespace kvp
