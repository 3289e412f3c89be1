// Serving metrics: latency percentiles per request, throughput, and KV-cache use.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvp {

struct EngineCounters {
  int64_t steps = 0;
  int64_t scheduled_tokens = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t swaps_out = 0;
  int64_t swaps_in = 0;
  int64_t cancellations = 0;
  int64_t rejections = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_lookup_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t copy_on_writes = 0;
  int64_t poisoned_blocks = 0;
  int64_t graph_steps = 0;  // steps the backend replayed from a CUDA graph (Backend::graph_replays)
  // Target forwards that produced tokens (a sequence's row that sampled, or verified drafts),
  // and speculation: verification rows, draft tokens verified, draft tokens accepted.
  int64_t target_forwards = 0;
  int64_t spec_steps = 0;
  int64_t spec_proposed = 0;
  int64_t spec_accepted = 0;
  // Sums over steps, for averages.
  double kv_used_slots_sum = 0;       // tokens stored in allocated blocks
  double kv_allocated_slots_sum = 0;  // slots of blocks in use
  double pool_occupancy_sum = 0;      // in-use blocks / pool
  double peak_pool_occupancy = 0;
  double elapsed_s = 0;
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0;
  int64_t count = 0;
};
// Nearest-rank percentiles; all zero for no samples.
Percentiles percentiles(std::vector<double> samples);

struct EngineMetrics {
  EngineCounters counters;
  // In steps (deterministic) and in seconds (wall clock).
  Percentiles ttft_steps, tpot_steps, e2e_steps, queue_steps;
  Percentiles ttft_s, tpot_s, e2e_s, queue_s;
  double tokens_per_s = 0;
  double kv_utilization = 0;          // tokens stored / slots allocated, averaged over steps
  double internal_fragmentation = 0;  // 1 - kv_utilization
  double mean_pool_occupancy = 0;
  double prefix_hit_rate = 0;  // tokens served from the prefix cache / tokens looked up at admission
  // Speculation: accepted / verified drafts; accepted drafts per verification row; target
  // forwards (rows that produced tokens) per generated token (1 without speculation and
  // parallel sampling).
  double acceptance_rate = 0;
  double mean_accepted_length = 0;
  double forwards_per_token = 0;

  nlohmann::json to_json() const;
};

}  // namespace kvp
