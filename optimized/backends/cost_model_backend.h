// CostModelBackend: the backend of `kvproof simulate`. It runs no math: it validates each
// plan with the shared plan validator (as every backend does), advances a simulated clock
// by the plan's cost (cost_model.h), and returns one logit per requested row with
// vocab_size 1, so sampling picks token 0 for every generated token.
//
// Why one-wide rows: a capacity simulation needs the engine's scheduling and KV-cache
// decisions, not token values, and a 128k-wide row per decode token would cost more than
// the rest of the simulation. Prompts carry the caller's token ids (validated against the
// model's vocabulary, PlanLimits::vocab_size), so prefix sharing sees exactly the prompts
// it is given; generated tokens are all 0, which only matters for the prefix cache past a
// prompt (two requests never share generated text in practice, and here they would only
// share it if their prompts were equal too).
#pragma once

#include "optimized/backends/backend.h"
#include "optimized/backends/cost_model.h"
#include "optimized/backends/plan_validation.h"

namespace kvp {

class CostModelBackend final : public Backend {
 public:
  // `pool`: the engine's KV pool shape (EngineConfig::kv.pool). `limits`: token ids and
  // context lengths the plans may carry.
  // REQUIRES: cost.validate().is_ok(), pool.validate().is_ok().
  CostModelBackend(const CostModelConfig& cost, const KvPoolShape& pool, const PlanLimits& limits);

  // validate_plan and check_plan_read_scope first (on an error nothing changes, not even
  // the clock); then clock += step_cost(plan).total_s and one logit (0.0) per row.
  Status execute(const BatchPlan& plan, StepOutput& out) override;
  const char* name() const override { return "cost-model"; }
  const KvPoolShape& pool_shape() const override { return pool_; }
  // Always an error: the cost model keeps no K/V.
  Status read_block(PoolKind pool, int64_t layer, int32_t block, std::vector<float>& k,
                    std::vector<float>& v) const override;
  int64_t audited_block_reads() const override { return audited_block_reads_; }

  // Simulated seconds: the sum of every executed plan's cost, plus advance_to jumps.
  double clock_s() const { return clock_s_; }
  // Moves the clock forward to t (idle time: nothing runs). No-op when t <= clock_s().
  void advance_to(double t) { clock_s_ = t > clock_s_ ? t : clock_s_; }
  const StepCost& last_cost() const { return last_; }
  const CostModelConfig& cost_config() const { return cost_; }
  int64_t steps() const { return steps_; }
  int64_t token_steps() const { return token_steps_; }  // new tokens over every plan run
  int64_t compute_bound_steps() const { return compute_bound_steps_; }

 private:
  CostModelConfig cost_;
  KvPoolShape pool_;
  PlanLimits limits_;
  double clock_s_ = 0;
  StepCost last_;
  int64_t steps_ = 0;
  int64_t token_steps_ = 0;
  int64_t compute_bound_steps_ = 0;
  int64_t audited_block_reads_ = 0;
};

}  // namespace kvp
