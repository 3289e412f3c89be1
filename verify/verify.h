// `kvproof verify`: the CI verdict. Runs a workload through the paged engine (with a pool
// small enough that preemption, swapping, prefix hits, chunked prefill and cancellation
// happen) and checks, with the reference transformer as the oracle:
//   invariants   every KV-cache invariant checker and the scheduler's bounds after every step
//   terminal     every request ends exactly once, in a reported state (S3)
//   no-leak      nothing held once all requests ended; all free after a prefix-cache flush (I6)
//   logits       the engine's logits at every position against ReferenceModel<double>,
//                |a - r| <= tol * max|r_row|; tol per KV dtype (tolerance_for, below):
//                f32 2e-5, the fp32-vs-fp64 bound asserted in tests/reference_model_test.cc
//                (measured 6.7e-7), with a safety factor; f16 and bf16 from the error
//                measured on the default workload, with a margin. NaN never passes.
//   greedy       greedy tokens equal the reference's arg-max wherever its top-2 margin
//                exceeds the tolerance
//   recompute    positions computed twice (preemption by recompute) give bitwise equal logits
//   isolation    chosen requests re-run alone under another schedule (block size, chunk
//                size, preemption mode): bitwise equal tokens and logits (N1)
//   cancellation every cancelled request ended at the first step boundary after its
//                cancellation, whatever it was doing, with its blocks released
//                (a cancel that arrives after its request finished is a no-op, checked as
//                one: the request keeps the terminal state, tokens and logits it had)
// One run per preemption mode. Each check reads one of three outcomes: checked N items;
// not applicable (n/a: the workload gave it nothing to check, and its detail says why, e.g.
// "no preemption happened"); or nothing verified (it applied and saw nothing), which fails
// the run unless allow_empty, as does a run in which no position's logits were checked at
// all (nothing about the engine's outputs was verified).
//
// With speculation on (VerifyOptions::speculation), the engine under test decodes
// speculatively and every check above applies to it; besides, the same workload runs
// without speculation and
//   speculative  every request's logits at every position whose tokens agree in both runs
//                are bitwise equal, and greedy requests' tokens are equal (a cancelled one's
//                up to where the shorter run stopped); the report gives the acceptance rate,
//                mean accepted length and target forwards per generated token.
// Sampled requests are left out of the isolation re-runs then: their speculative draws
// depend on how many drafts each step verified, which the schedule decides. They get the
// strongest check that holds instead:
//   determinism  the workload re-run on an identical engine (same schedule) gives every
//                sampled request the same tokens and logits bit for bit
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/html_report.h"
#include "common/status.h"
#include "model/weights.h"
#include "optimized/backends/backend_factory.h"
#include "optimized/backends/cpu_backend.h"
#include "optimized/engine/engine.h"
#include "optimized/engine/metrics.h"
#include "optimized/engine/scheduler.h"
#include "optimized/engine/workload.h"
#include "reference/reference_model.h"
#include "verify/oracle_checks.h"

namespace kvp::kv_events {
class Publisher;
}

namespace kvp::verify {

// What an engine is made of: the pool, the schedule, the backend, speculation. verify, audit
// and generate build their engines from it (make_engine); VerifyOptions adds what verify
// checks and how.
struct EngineOptions {
  int32_t block_size = 4;
  int32_t num_blocks = 48;
  int32_t num_host_blocks = 24;
  int32_t watermark_blocks = 1;
  int32_t max_num_batched_tokens = 64;
  int32_t max_num_seqs = 8;
  int32_t prefill_chunk_size = 24;
  int64_t max_model_len = 512;
  AdmissionRule admission = AdmissionRule::kOptimistic;
  bool prefix_caching = true;
  bool global_prefix_sharing = false;
  bool poison_on_free = true;
  bool audit_reads = false;  // the backend checks the tenant scope of every block read
  int num_threads = 2;
  // The model executor (optimized/backends/backend_factory.h): cpu, or the CUDA backend
  // (cuda-emu: SIMT-emulated kernels on the CPU; cuda: nvcc kernels on a GPU, "no CUDA
  // device" without one).
  BackendKind backend = BackendKind::kCpu;
  // The KV pool's element type: f32, f16, bf16, fp8-e4m3 or fp8-e5m2, on every backend
  // (rounded when written, read as fp32).
  DType kv_dtype = DType::kF32;
  // An fp8 pool's scales ([layers][kv heads], verify/kv_scales.h) and where they came from
  // (printed with the logits check); empty for other pools.
  std::vector<float> kv_k_scales, kv_v_scales;
  std::string kv_scales_source;
  // A planted bug in the CUDA backends' attention (tests and hidden flags only).
  PlantedAttentionBug planted = PlantedAttentionBug::kNone;
  // The CUDA backends' weight storage: kF32, or kBF16 (the model's matrices must then be bf16
  // values, so that the oracle computes with exactly what the kernels read: --weight-dtype
  // rounds them first).
  DType weight_dtype = DType::kF32;
  // The CUDA backends' decode graphs: decode steps of up to this many tokens replayed from
  // CUDA graphs (CudaBackendConfig::max_graph_tokens); 0: every step eager.
  int64_t max_graph_tokens = 64;
  // KV-cache groups for a hybrid model (optimized/kv/kv_groups.h) on a backend that has
  // them (backend_has_kv_groups: all do): each group its own block tables, so the sliding
  // layers release what their windows left behind; the pool keeps its bytes (num_blocks
  // scaled by layers per block). Never under an attention plug-in (one table per sequence in
  // its ABI) or a draft model's own pool; audit and a published KV-event stream turn it off
  // (no group_idx yet). false: one group, whose full layers keep every block.
  bool kv_groups = true;
  // Speculative decoding of every request (off: the default job, unchanged).
  SpeculationParams speculation;
  int32_t draft_layers = 0;  // layers of the draft model (0: default_draft_layers)
  // The backend's attention from this plug-in (loaded by the caller, who keeps it loaded):
  // host plug-ins under cpu and cuda-emu, CUDA ones under cuda; nullptr: kvproof's own
  // kernel. Every check runs as usual: a kernel that is not batch- or chunk-invariant fails
  // the bitwise ones by name.
  const kvp_attention_plugin* attention_plugin = nullptr;
};

struct VerifyOptions : EngineOptions {
  std::vector<PreemptionMode> modes = {PreemptionMode::kRecompute, PreemptionMode::kSwap};
  // Reuse each comparison with the oracle for the same tokens and bitwise-equal engine rows,
  // and the oracle's dense caches for shared prefixes (OracleMemo); off: every request runs
  // the oracle from position 0.
  bool oracle_memo = true;
  // Logit tolerance relative to the row's largest reference logit; unset: the KV dtype's
  // default (tolerance_for).
  std::optional<double> tolerance;
  int isolation_samples = 4;  // the most preempted requests and one parallel sample
  int64_t max_steps = 100000;
  bool allow_empty = false;  // pass even when nothing was verified (see VerifyReport)
  // Where each mode's engine publishes kvproof's KV-event stream (docs/kv-events.md), one
  // batch per step, an AllBlocksCleared before each mode after the first (its engine starts
  // empty); nullptr: none. With one, every mode also gets a kv-event-stream check (the
  // stream passes the KV-event auditor and matches the engine's event log). Must outlive
  // run_verify.
  kv_events::Publisher* kv_events_publisher = nullptr;
};

// The logit tolerance a run uses, and where it comes from (printed with the logits check).
struct Tolerance {
  double value = 0;
  std::string source;
};
Tolerance tolerance_for(const VerifyOptions& o);

struct CheckResult {
  explicit CheckResult(std::string n) : name(std::move(n)) {}
  std::string name;
  bool passed = true;
  int64_t count = 0;       // things checked (steps, positions, requests)
  double worst_error = 0;  // where it applies
  std::string detail;      // first failure, or a summary
  // Whether the run gave this check something to see (a greedy check on a workload with
  // no greedy request does not apply). A check that applies and saw nothing is vacuous.
  bool applies = true;
  // The logits check's errors (relative to the row's largest reference logit, as
  // worst_error), for the HTML report's plots: the worst at each position over the requests
  // compared, and each request's worst, in the order compared.
  std::vector<double> worst_by_position;
  std::vector<std::pair<std::string, double>> worst_by_request;
};

struct VerifyReport {
  std::vector<CheckResult> checks;
  // What was not verified although it should have been: a check that applies with a count
  // of 0, or a run in which no request finished normally. Non-empty fails the report
  // unless allow_empty.
  std::vector<std::string> nothing_verified;
  bool allow_empty = false;
  std::vector<std::pair<std::string, EngineMetrics>> runs;  // per preemption mode
  OracleStats oracle;    // the oracle's work: sequences and positions run, what was reused
  double tolerance = 0;  // the logits checks' (relative to the row's largest reference logit)
  bool passed() const;
  std::string table() const;
  nlohmann::json to_json() const;
  std::string to_junit() const;
  // The job summary (--summary): the verdict, the failed checks (each reproduced by
  // `reproducer`, the run's command line), every check, and the run and oracle lines.
  Summary to_summary(std::vector<std::string> context, std::string reproducer) const;
  // The HTML report's plots: the error against the fp64 oracle by position and by request,
  // one series per preemption mode, with the tolerance drawn across.
  std::vector<Plot> plots() const;
};

// Shared by verify and audit.
struct EngineSetup {
  int32_t block_size;
  int32_t num_blocks;
  int32_t num_host_blocks;
  int32_t prefill_chunk_size;
  PreemptionMode mode;
};
struct LiveEngine {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};
// A draft-model proposer on the CPU backend: the draft model's own pool, with room for
// max_num_seqs sequences of max_model_len tokens.
std::unique_ptr<Proposer> make_draft_proposer(const Model& draft, int64_t max_num_seqs, int64_t max_model_len,
                                              int num_threads);
// The pool and schedule `options` ask for, in preemption mode `mode` (the other setups are
// verify's re-runs: non-interference alone, at another block size and chunk).
EngineSetup options_setup(const EngineOptions& options, PreemptionMode mode);
// The engine's config: the pool and schedule of `setup`, the rest from `options`; the one
// place an EngineConfig is assembled from options (errors: what validate(EngineConfig) says).
Result<EngineConfig> engine_config(const ModelConfig& model, const EngineOptions& options, const EngineSetup& setup);
// Whether that engine runs the model's KV-cache groups (EngineOptions::kv_groups).
bool uses_kv_groups(const ModelConfig& model, const EngineOptions& options);
// "kv-cache groups: 6 groups of 1 layer: ...; a block holds 1 of 6 layers, so the same bytes
// are N blocks + M host\n" when the run uses KV-cache groups, else empty.
std::string kv_groups_line(const ModelConfig& model, const EngineOptions& options);
// An engine on options.backend (make_backend) with engine_config's config and
// options.speculation's proposer (a draft model from `model`'s first layers). The backend
// reads `model`'s weights: REQUIRES model outlives the returned engine.
Result<LiveEngine> make_engine(const Model& model, const EngineOptions& options, const EngineSetup& setup);
// The checks of a plan before it runs (I3 exclusive write, I5 slot mapping, I8 bounds) and
// of the state after a step (every KvCacheManager invariant). A failure is recorded in
// `result` (first one kept) and returned, which stops the engine.
Status check_plan(const Engine& e, const BatchPlan& plan, CheckResult& result);
Status check_state(const Engine& e, const BatchPlan& plan, CheckResult& result);
// Installs both as the engine's observers.
void install_step_checks(Engine& engine, CheckResult& result);
// The request's captured logits at every position against the fp64 reference (into
// `logits`), and its greedy tokens against the reference's arg-max (into `greedy`), at once
// on this thread (verify itself queues them on OracleChecks). With `memo`, comparisons and
// dense caches are reused as OracleMemo says (verify/oracle_checks.h), counted in `stats`.
void check_against_reference(const ReferenceModel<double>& oracle, const Request& r, double tolerance,
                             CheckResult& logits, CheckResult& greedy, const std::string& label,
                             OracleMemo* memo = nullptr, OracleStats* stats = nullptr);

// Errors are for bad options or a backend/engine that could not run at all; a failing check
// is a VerifyReport with passed() == false.
// A number as verify's reports print it ("%.3g").
std::string fmt(double v);

Result<VerifyReport> run_verify(const Model& model, const Workload& workload, const VerifyOptions& options);

}  // namespace kvp::verify
