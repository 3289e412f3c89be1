// kvproof simulate: the engine's own Scheduler and KvCacheManager, unchanged, on the
// cost-model backend (optimized/backends/cost_model.h), driven by traffic
// (simulate/traffic.h) in simulated time.
//
// The driver owns simulated time: before each step it hands the engine every request whose
// arrival time has passed on the backend's clock; when nothing is running it jumps the
// clock to the next arrival. Latencies are read from the engine's request state after each
// step and timed on the backend's clock (the engine's own wall-clock metrics are not used).
//
// Allocation policies (the same scheduler under each):
//   paged              the real KvCacheManager with block size B over the whole KV pool.
//   contiguous-max     every request reserves max_model_len token slots, contiguously;
//   contiguous-pow2    reserves the next power of two >= its current length, and when it
//                      outgrows that, reallocates to the next power of two (in place if the
//                      memory after it is free, else a new region while the old is held);
//                      when that fails the newest running request is preempted (its
//                      reservation freed; it restarts later with its tokens so far as prompt);
//   contiguous-oracle  reserves exactly its final length (prompt + output).
//   A contiguous policy is a first-fit allocator over the same KV memory (in token slots)
//   that the driver consults before it hands a request to the engine, FCFS; the engine's
//   paged manager then runs with a pool large enough never to bind, and no prefix sharing
//   (contiguous systems have none). The admission rule has no effect under them: a
//   reservation is itself conservative.
//
// Memory accounting, sampled every sample_interval_s of simulated time while requests
// run, and averaged over the samples (token slots; shares of their sum):
//   token_states        slots holding a computed token's K/V (a block shared by several
//                       sequences counts once).
//   reserved            slots held for a request's future tokens that it will fill
//                       (up to its final length prompt + output; a slot that several
//                       holders of a shared block will fill counts once).
//   internal            held slots the request will never fill (past its final length: the
//                       rest of a paged last block, or a contiguous reservation's excess).
//   external            free slots that the request at the head of the queue cannot use:
//                       for contiguous policies, free holes smaller than its reservation
//                       while it waits; always 0 for paged (any free block serves anyone).
// Free memory that nobody is waiting for is idle capacity, not waste, and is not counted.
// Each sample is kept in integer slots (memory_accounting.h); with check, every sample is
// recounted from the KV manager's blocks (check_memory_accounting) and the report's shares
// from its samples (check_memory_shares).
//
// Parallel sampling (n > 1, paged only): every request forks into n sequences once its
// prompt is computed; they share the prompt's blocks, and each sample has the request's
// final length. A request's latencies are its first sample's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "optimized/backends/cost_model.h"
#include "optimized/engine/scheduler.h"
#include "simulate/memory_accounting.h"
#include "simulate/traffic.h"

namespace kvp::sim {

enum class AllocationPolicy { kPaged, kContiguousMax, kContiguousPow2, kContiguousOracle };
const char* to_string(AllocationPolicy p);
Result<AllocationPolicy> parse_policy(const std::string& s);
const char* to_string(AdmissionRule a);
const char* to_string(PreemptionMode m);

struct SimOptions {
  std::string model = "llama-3-8b";
  std::string gpu = "h200-141gb";
  double gpu_memory_utilization = 0.9;
  AllocationPolicy policy = AllocationPolicy::kPaged;
  int32_t block_size = 16;
  // The KV cache's element type: bytes per token for capacity and for the decode step's
  // traffic (fp8-e4m3/e5m2 halve bf16's). What it costs in accuracy is `kvproof verify
  // --kv-dtype`'s to measure.
  DType kv_dtype = DType::kBF16;
  AdmissionRule admission = AdmissionRule::kOptimistic;
  PreemptionMode preemption = PreemptionMode::kRecompute;
  int64_t max_model_len = 0;  // 0: the model's context length
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  int32_t prefill_chunk_size = 8192;
  bool prefix_sharing = true;
  // The model's sliding window releases blocks (paged policy): off keeps every position, as
  // a full-attention KV cache would, to see what the window saves.
  bool sliding_window = true;
  int32_t n = 1;                     // parallel samples per request (> 1: paged only)
  double watermark_fraction = 0.01;  // of the device blocks (optimistic admission)
  double rate = 0;                   // > 0: rescale the traffic to this many requests/s
  double ttft_slo_s = 1.0;
  double tpot_slo_s = 0.05;
  bool check = false;              // every invariant checker after every step
  double sample_interval_s = 1.0;  // memory and queue samples (<= 0: every step)
  uint64_t seed = 0;               // prompt token ids
  // Called now and then with the share of the traffic's requests ended, in [0, 1].
  std::function<void(double)> progress;
};

// Applies one "key=value" setting (the keys --sweep accepts): block-size, admission,
// preemption, max-model-len (alias max-context), rate, policy, prefix-sharing (on/off),
// sliding-window, max-num-seqs, n, gpu, model, gpu-memory-utilization, kv-dtype. Error: unknown key
// or bad value.
Status apply_setting(SimOptions& o, const std::string& key, const std::string& value);

struct Stat {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
  int64_t count = 0;
};
Stat summarize(std::vector<double> samples);

struct MemoryShares {
  double token_states = 0, reserved = 0, internal = 0, external = 0;  // shares, sum 1
  double mean_in_use = 0;  // (token_states + reserved + internal) slots / KV capacity
};

struct TimelinePoint {
  double t_s = 0;
  int64_t waiting = 0, running = 0, swapped = 0;
  double kv_in_use = 0;  // held slots / KV capacity
  double kv_tokens = 0;  // token-state slots / KV capacity
  MemorySlots memory;    // the sample
};

struct SimReport {
  // Settings as run.
  std::string traffic, model, gpu, policy, admission, preemption;
  std::string kv_dtype;  // the flag spelling: bf16, fp8-e4m3, ...
  int32_t block_size = 0;
  int64_t max_model_len = 0;
  bool prefix_sharing = false;
  int64_t sliding_window = 0;  // the window the KV manager released blocks behind (0: none)
  // The KV-cache groups of a hybrid run with its window ("7 groups of 4 layers: 1 full, ..."),
  // empty with one block table per sequence.
  std::string kv_groups;
  int64_t num_kv_groups = 1;
  double rate = 0;  // requests/s of the traffic as run
  double ttft_slo_s = 0, tpot_slo_s = 0;
  // The pool.
  double kv_pool_bytes = 0, kv_bytes_per_token = 0;
  // kv_capacity_slots: the pool's slots (device blocks x block size; contiguous: the
  // memory's), what the memory shares divide; kv_capacity_tokens: the positions it holds
  // with every layer's K/V kept (slots / KV-cache groups).
  int64_t kv_capacity_tokens = 0, kv_capacity_slots = 0, num_device_blocks = 0, num_host_blocks = 0;
  // Outcome.
  int64_t requests = 0, finished = 0, rejected = 0, preemptions = 0, swaps_out = 0, swaps_in = 0;
  int64_t prefix_hit_tokens = 0, steps = 0, token_steps = 0, compute_bound_steps = 0;
  double duration_s = 0;  // simulated: first arrival to last finish
  double requests_per_s = 0, output_tokens_per_s = 0, total_tokens_per_s = 0;
  Stat ttft_s, tpot_s, e2e_s, queue_s;
  double slo_attainment = 0;  // requests meeting both TTFT and TPOT targets / all requests
  double ttft_attainment = 0, tpot_attainment = 0;
  MemoryShares memory;
  MemorySlots memory_slots;  // the samples' sums
  int64_t peak_waiting = 0;
  double mean_running = 0;
  std::vector<TimelinePoint> timeline;
  std::vector<double> ttft_samples, tpot_samples;  // per finished request
  int64_t checked_steps = 0;                       // with check: steps every invariant checker passed after
  double wall_s = 0;
  double token_steps_per_s() const { return wall_s > 0 ? static_cast<double>(token_steps) / wall_s : 0; }
};

// Runs the traffic to completion. Errors: unknown preset, a model that does not fit the GPU,
// a bad option, an invariant check that failed (with check: the engine's after every step,
// the memory accounting's at every sample and at the end), a backend error.
Result<SimReport> simulate(const SimOptions& options, const Traffic& traffic);

// --sweep: axes "key=v1,v2,..."; their cartesian product (first axis slowest), applied on
// top of `base`. Each element: the options and a label "key=v key=v".
struct SweepPoint {
  SimOptions options;
  std::string label;
};
Result<std::vector<SweepPoint>> expand_sweep(const SimOptions& base, const std::vector<std::string>& axes);

}  // namespace kvp::sim
