// A backend runs the model over a BatchPlan against its own KV pool (device blocks) and
// host pool (swap blocks), laid out per layer as K and V, each
// [num_blocks, block_size, num_kv_heads, head_dim].
#pragma once

#include "common/status.h"
#include "optimized/batch_plan.h"

namespace kvp {

class Backend {
 public:
  virtual ~Backend() = default;
  // Executes the plan's memory ops, writes the new tokens' K/V, runs attention through the
  // block tables and fills `out` with the requested logits. Errors: a plan that does not
  // fit this backend (block ids or slots outside the pool, mismatched array sizes).
  virtual Status execute(const BatchPlan& plan, StepOutput& out) = 0;
  virtual const char* name() const = 0;
};

}  // namespace kvp
