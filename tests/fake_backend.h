// A backend with no model, for scheduler and engine tests that need speed, not numbers:
// it validates the plan with the shared plan validator (as every backend does) and returns
// logits whose arg-max is a fixed function of the token and its position, so greedy
// generation is deterministic and depends on nothing but the request itself.
#pragma once

#include <limits>
#include <string>

#include "optimized/backends/backend.h"
#include "optimized/backends/plan_validation.h"

namespace kvp::testing {

class FakeBackend final : public Backend {
 public:
  // `pool`: the engine's KV pool shape (config.kv.pool); token ids must be < vocab; `window`:
  // the engine's sliding window (config.kv.sliding_window; 0: none): the plan validator then
  // accepts released entries before it and refuses reads of them.
  // `group_windows`: the engine's KV-cache groups (config.kv.group_windows; empty: one).
  FakeBackend(const KvPoolShape& pool, int64_t vocab, int64_t window = 0, std::vector<int64_t> group_windows = {})
      : pool_(pool), vocab_(vocab), window_(window), group_windows_(std::move(group_windows)) {}

  Status execute(const BatchPlan& plan, StepOutput& out) override {
    const PlanLimits limits{vocab_, std::numeric_limits<int32_t>::max(), window_, group_windows_};
    KVP_RETURN_IF_ERROR(validate_plan(plan, pool_, limits));
    auto reads = check_plan_read_scope(plan, pool_, limits);
    if (!reads) return reads.status();
    audited_ += *reads;
    const auto n = static_cast<std::size_t>(plan.num_seqs());
    out.vocab_size = vocab_;
    out.logit_row_start.assign(1, 0);
    out.logits.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const int32_t end = plan.query_start[i + 1];
      const int32_t rows = logit_rows_for(plan, static_cast<int64_t>(i));
      for (int32_t t = end - rows; t < end; ++t) {
        const auto ut = static_cast<std::size_t>(t);
        const int64_t hot = (static_cast<int64_t>(plan.token_ids[ut]) * 31 + plan.positions[ut] * 17) % vocab_;
        for (int64_t v = 0; v < vocab_; ++v) out.logits.push_back(v == hot ? 1.0f : 0.0f);
      }
      out.logit_row_start.push_back(out.logit_row_start.back() + rows);
    }
    ++steps_;
    return Status::ok();
  }
  const char* name() const override { return "fake"; }
  const KvPoolShape& pool_shape() const override { return pool_; }
  Status read_block(PoolKind, int64_t, int32_t, std::vector<float>&, std::vector<float>&) const override {
    return Status::error("the fake backend keeps no K/V");
  }
  int64_t audited_block_reads() const override { return audited_; }
  int64_t steps() const { return steps_; }

 private:
  KvPoolShape pool_;
  int64_t vocab_;
  int64_t window_;
  std::vector<int64_t> group_windows_;
  int64_t steps_ = 0;
  int64_t audited_ = 0;
};

}  // namespace kvp::testing
