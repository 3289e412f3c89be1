// Properties of kvproof simulate's memory accounting: under random traffic (arrival rates
// and burstiness, prompt and output lengths, tenants' shared system prompts), block sizes,
// pool sizes, allocation policies, prefix sharing on and off, parallel samples (n > 1) and
// both preemption modes, every memory sample is what an independent count of the KV
// manager's blocks (or of the reservations) gives, its terms add up to the memory they
// split, and the run's shares are its samples' sums and add up to 1.
#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "optimized/backends/cost_model.h"
#include "simulate/memory_accounting.h"
#include "simulate/simulate.h"
#include "simulate/traffic.h"

namespace kvp {
namespace {

// The GPU memory utilization that leaves `model` on an H200 a KV pool of `slots` token
// slots of every layer (plus half a slot, so the pool's floor division lands on `slots`).
double utilization_for(const std::string& model, int64_t slots) {
  CostModelConfig c;
  c.model = *find_model_preset(model);
  c.gpu = *find_gpu_preset("h200-141gb");
  const double pool = (static_cast<double>(slots) + 0.5) * c.kv_bytes_per_token();
  return (c.weight_bytes() + c.activation_reserve_bytes + pool) / c.gpu.memory_bytes;
}

struct Case {
  sim::SimOptions options;
  SyntheticTrafficSpec traffic;
};

Case draw_case() {
  Case c;
  sim::SimOptions& o = c.options;
  // gemma-3-1b: a hybrid (4 global layers, 22 with window 512) run as KV-cache groups, with
  // contexts several windows long (or, sliding-window off, one table keeping everything).
  const bool gemma = *rc::gen::element(false, false, false, true);
  o.model = gemma ? "gemma-3-1b" : "llama-3-8b";
  if (gemma) o.sliding_window = *rc::gen::element(true, true, true, false);
  o.gpu = "h200-141gb";
  o.check = true;
  o.sample_interval_s = 0;  // a sample, and its check, before every step
  o.seed = *rc::gen::inRange<uint64_t>(0, 1000);
  o.policy = *rc::gen::element(sim::AllocationPolicy::kPaged, sim::AllocationPolicy::kPaged,
                               sim::AllocationPolicy::kPaged, sim::AllocationPolicy::kPaged,
                               sim::AllocationPolicy::kPaged, sim::AllocationPolicy::kContiguousMax,
                               sim::AllocationPolicy::kContiguousPow2, sim::AllocationPolicy::kContiguousOracle);
  o.block_size = *rc::gen::element(1, 2, 3, 4, 8, 16, 32);
  o.gpu_memory_utilization = gemma ? utilization_for(o.model, *rc::gen::inRange<int64_t>(128, 1536))
                                   : utilization_for(o.model, *rc::gen::inRange<int64_t>(32, 768));
  o.max_model_len = gemma ? *rc::gen::element<int64_t>(1024, 2048) : *rc::gen::element<int64_t>(128, 256, 512);
  o.max_num_seqs = *rc::gen::inRange(1, 16);
  o.max_num_batched_tokens = gemma ? *rc::gen::inRange(64, 1024) : *rc::gen::inRange(16, 256);
  o.prefill_chunk_size = gemma ? *rc::gen::inRange(32, 1024) : *rc::gen::inRange(8, 256);
  o.prefix_sharing = *rc::gen::arbitrary<bool>();
  if (o.policy == sim::AllocationPolicy::kPaged && *rc::gen::arbitrary<bool>())
    o.n = *rc::gen::inRange(2, std::max(3, std::min(4, o.max_num_seqs) + 1));
  o.preemption = *rc::gen::element(PreemptionMode::kRecompute, PreemptionMode::kSwap);
  o.admission = *rc::gen::element(AdmissionRule::kOptimistic, AdmissionRule::kConservative);
  o.watermark_fraction = *rc::gen::element(0.0, 0.01, 0.1);

  SyntheticTrafficSpec& t = c.traffic;
  t.seed = *rc::gen::inRange<uint64_t>(0, 1000);
  t.num_requests = gemma ? *rc::gen::inRange<int64_t>(1, 10) : *rc::gen::inRange<int64_t>(1, 40);
  t.rate = *rc::gen::element(1.0, 20.0, 200.0, 2000.0);
  t.arrivals = *rc::gen::element(ArrivalProcess::kPoisson, ArrivalProcess::kGamma);
  t.burstiness_cv = 3;
  t.prompt =
      gemma ? LengthSpec{LengthDistribution::kLognormal, static_cast<double>(*rc::gen::inRange(64, 1024)), 0.8, 1, 1800}
            : LengthSpec{LengthDistribution::kLognormal, static_cast<double>(*rc::gen::inRange(4, 128)), 0.8, 1, 256};
  t.output = {LengthDistribution::kLognormal, static_cast<double>(*rc::gen::inRange(1, 64)), 0.8, 1, 128};
  t.system_prompt_tokens = *rc::gen::element<int64_t>(0, 16, 32, 64, 128);
  t.num_tenants = *rc::gen::inRange<int64_t>(1, 4);
  return c;
}

RC_GTEST_PROP(SimulateProperty, EveryMemorySampleAddsUpAndMatchesTheKvManagersBlocks, ()) {
  const Case c = draw_case();
  const Traffic traffic = generate_traffic(c.traffic);
  auto r = sim::simulate(c.options, traffic);
  // simulate --check recounts every sample (check_memory_accounting) and the report
  // (check_memory_shares); its error names the run, the sample, the time and both numbers.
  if (!r.is_ok()) RC_FAIL(r.status().message());
  const Status shares = sim::check_memory_shares(*r);
  if (!shares) RC_FAIL(shares.message());
  RC_ASSERT(r->finished + r->rejected == r->requests);
  RC_ASSERT(r->finished == 0 || !r->timeline.empty());
  RC_CLASSIFY(r->policy != "paged", "contiguous");
  RC_CLASSIFY(r->num_kv_groups > 1, "KV-cache groups");
  RC_CLASSIFY(c.options.n > 1 && r->finished > 0, "parallel samples");
  RC_CLASSIFY(r->prefix_hit_tokens > 0, "prefix hits");
  RC_CLASSIFY(r->preemptions > 0, "preempted");
  RC_CLASSIFY(r->swaps_out > 0, "swapped");
  RC_CLASSIFY(r->memory.external > 0, "external fragmentation");
}

}  // namespace
}  // namespace kvp
