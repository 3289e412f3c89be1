// A backend with no model, for scheduler and engine tests that need speed, not numbers:
// it checks the plan's shape against the contract in optimized/batch_plan.h and returns
// logits whose arg-max is a fixed function of the token and its position, so greedy
// generation is deterministic and depends on nothing but the request itself.
#pragma once

#include <string>

#include "optimized/backend.h"

namespace kvp::testing {

class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(int64_t vocab) : vocab_(vocab) {}

  Status execute(const BatchPlan& plan, StepOutput& out) override {
    const auto n = static_cast<std::size_t>(plan.num_seqs());
    if (plan.query_start.size() != n + 1 || plan.context_lens.size() != n || plan.needs_logits.size() != n ||
        plan.logits_all.size() != n || plan.block_tables.size() != n * static_cast<std::size_t>(plan.max_blocks_per_seq) ||
        plan.positions.size() != plan.token_ids.size() || plan.slot_mapping.size() != plan.token_ids.size() ||
        plan.query_start.back() != static_cast<int32_t>(plan.token_ids.size()))
      return Status::error("plan arrays have inconsistent sizes");
    out.vocab_size = vocab_;
    out.logit_row_start.assign(1, 0);
    out.logits.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const int32_t begin = plan.query_start[i], end = plan.query_start[i + 1];
      if (end <= begin) return Status::error("sequence " + std::to_string(i) + " has no tokens");
      if (plan.positions[static_cast<std::size_t>(end - 1)] != plan.context_lens[i] - 1)
        return Status::error("last position is not context_len - 1");
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
  int64_t steps() const { return steps_; }

 private:
  int64_t vocab_;
  int64_t steps_ = 0;
};

}  // namespace kvp::testing
