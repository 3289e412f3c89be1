// A backend runs the model over a BatchPlan against its own KV pool (device blocks) and
// host pool (swap blocks), laid out per layer as K and V, each
// [num_blocks, block_size, num_kv_heads, head_dim].
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "optimized/backends/batch_plan.h"
#include "optimized/kv/kv_pool_shape.h"

namespace kvp {

// Planted bugs in the CUDA backends' attention kernel (cuda_backend.h), for the checks that must catch them (tests and
// hidden flags; never a user option): see AttentionVariant in kernels/cuda/model_kernels.h.
enum class PlantedAttentionBug { kNone, kBf16Accumulator, kDropKvScales };

enum class PoolKind { kDevice, kHost };

class Backend {
 public:
  virtual ~Backend() = default;
  // Validates the plan with validate_plan (plan_validation.h) and, in audit mode, the read
  // scope with check_plan_read_scope, before it runs anything; on an error nothing changes.
  // Then executes the plan's memory ops in plan_ops.h's order, writes the new tokens' K/V,
  // runs attention through the block tables and fills `out` with the requested logits.
  virtual Status execute(const BatchPlan& plan, StepOutput& out) = 0;
  virtual const char* name() const = 0;
  // The pool this backend was built with; the engine refuses a backend whose shape is not
  // its KV-cache manager's.
  virtual const KvPoolShape& pool_shape() const = 0;
  // A copy of one block of one layer of a pool, converted to fp32: K and V, each
  // [block_size, num_kv_heads, head_dim]. For the conformance tests and audits. Error: layer
  // or block out of range.
  virtual Status read_block(PoolKind pool, int64_t layer, int32_t block, std::vector<float>& k,
                            std::vector<float>& v) const = 0;
  // (sequence, block-table entry) reads whose tenant scope audit-mode plans carried and
  // this backend checked (check_plan_read_scope), summed over every plan it ran.
  virtual int64_t audited_block_reads() const = 0;
  // Steps this backend ran by replaying a captured CUDA graph (0 for backends without).
  virtual int64_t graph_replays() const { return 0; }
};

}  // namespace kvp
