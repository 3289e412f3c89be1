#include "optimized/engine/metrics.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace kvp {

Percentiles percentiles(std::vector<double> samples) {
  Percentiles p;
  p.count = static_cast<int64_t>(samples.size());
  if (samples.empty()) return p;
  std::sort(samples.begin(), samples.end());
  auto rank = [&](double q) {
    const auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
    return samples[std::min(samples.size() - 1, k == 0 ? 0 : k - 1)];
  };
  p.p50 = rank(0.50);
  p.p90 = rank(0.90);
  p.p99 = rank(0.99);
  return p;
}

namespace {
nlohmann::json pj(const Percentiles& p) { return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"count", p.count}}; }
}  // namespace

nlohmann::json EngineMetrics::to_json() const {
  const EngineCounters& c = counters;
  return {
      {"steps", c.steps},
      {"scheduled_tokens", c.scheduled_tokens},
      {"prefill_tokens", c.prefill_tokens},
      {"decode_tokens", c.decode_tokens},
      {"generated_tokens", c.generated_tokens},
      {"preemptions", c.preemptions},
      {"swaps_out", c.swaps_out},
      {"swaps_in", c.swaps_in},
      {"cancellations", c.cancellations},
      {"rejections", c.rejections},
      {"copy_on_writes", c.copy_on_writes},
      {"poisoned_blocks", c.poisoned_blocks},
      {"prefix_hit_tokens", c.prefix_hit_tokens},
      {"prefix_hit_rate", prefix_hit_rate},
      {"kv_utilization", kv_utilization},
      {"internal_fragmentation", internal_fragmentation},
      {"mean_pool_occupancy", mean_pool_occupancy},
      {"peak_pool_occupancy", c.peak_pool_occupancy},
      {"tokens_per_s", tokens_per_s},
      {"target_forwards", c.target_forwards},
      {"spec_steps", c.spec_steps},
      {"spec_proposed", c.spec_proposed},
      {"spec_accepted", c.spec_accepted},
      {"acceptance_rate", acceptance_rate},
      {"mean_accepted_length", mean_accepted_length},
      {"forwards_per_token", forwards_per_token},
      {"elapsed_s", c.elapsed_s},
      {"ttft_steps", pj(ttft_steps)},
      {"tpot_steps", pj(tpot_steps)},
      {"e2e_steps", pj(e2e_steps)},
      {"queue_steps", pj(queue_steps)},
      {"ttft_s", pj(ttft_s)},
      {"tpot_s", pj(tpot_s)},
      {"e2e_s", pj(e2e_s)},
      {"queue_s", pj(queue_s)},
  };
}

}  // namespace kvp
