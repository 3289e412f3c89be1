#include "optimized/backends/cost_model_backend.h"

namespace kvp {

CostModelBackend::CostModelBackend(const CostModelConfig& cost, const KvPoolShape& pool, const PlanLimits& limits)
    : cost_(cost), pool_(pool), limits_(limits) {
  KVP_CHECK(cost_.validate().is_ok());
  KVP_CHECK(pool_.validate().is_ok());
}

Status CostModelBackend::execute(const BatchPlan& plan, StepOutput& out) {
  KVP_RETURN_IF_ERROR(validate_plan(plan, pool_, limits_));
  auto reads = check_plan_read_scope(plan, pool_, limits_);
  if (!reads) return reads.status();
  audited_block_reads_ += *reads;

  last_ = step_cost(cost_, plan, pool_.block_size);
  clock_s_ += last_.total_s;
  ++steps_;
  token_steps_ += plan.num_tokens();
  if (last_.compute_bound()) ++compute_bound_steps_;

  out.vocab_size = 1;
  out.logit_row_start.assign(1, 0);
  for (int64_t i = 0; i < plan.num_seqs(); ++i)
    out.logit_row_start.push_back(out.logit_row_start.back() + logit_rows_for(plan, i));
  out.logits.assign(static_cast<std::size_t>(out.logit_row_start.back()), 0.0f);
  return Status::ok();
}

Status CostModelBackend::read_block(PoolKind, int64_t, int32_t, std::vector<float>&, std::vector<float>&) const {
  return Status::error("the cost-model backend keeps no K/V");
}

}  // namespace kvp
