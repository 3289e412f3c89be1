// kernel-check: kvproof's adversarial grid run on an attention plug-in
// (include/kvproof/attention_plugin.h, docs/plugins.md) against an fp64 reference.
//
// A case is one batch: a shape (heads, head_dim, block size, KV dtype and layout), its
// sequences (context length, new tokens: a decode row or a prefill chunk that may start
// mid-block), an input kind (random, large-magnitude scores, all-equal scores, one dominant
// position) and a seed. Its inputs are drawn from the seed: dense K/V per sequence, rounded
// to the KV dtype, scattered through block tables drawn without replacement from a pool
// larger than needed, in random order; every slot outside the tables and past a context is
// NaN. The reference is softmax(QK^T)V in double on the dense K/V, written here and nowhere
// else (it shares no code with any kernel).
//
// Properties, each reported by name when it fails:
//   accuracy          |out - ref| / max|ref row| <= tolerance(dtype) on every (token, head) row
//   no-poison-leak    a non-finite output that disappears when the poison is 0 instead of NaN
//   finite-output     a non-finite output from finite inputs (poison 0 too): overflow
//   guard-zones       the floats before and after `out` unchanged
//   inputs-unchanged  pools, queries, block tables and metadata unchanged
//   batch-invariance  each sequence's rows bit-identical run alone and in the batch
//   repeatability     the same batch twice gives the same bits
//   run-error         run() failed on a shape that supports() (supports_window(), supports_softcap()) accepted
//   crash, timeout    the case's child process died by a signal or ran past its time limit
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/html_report.h"
#include "common/status.h"
#include "kernel_check/attention_plugin_loader.h"
#include "kvproof/attention_plugin.h"

namespace kvp::verify::kernel_check {

enum class Grid { kQuick, kFull };
enum class InputKind { kRandom, kLargeScores, kEqualScores, kDominant };

const char* grid_name(Grid grid);
const char* input_kind_name(InputKind kind);
const char* dtype_name(int32_t kv_dtype);
const char* layout_name(int32_t kv_layout);

// Largest accepted error relative to the row's largest reference value, per KV dtype. The
// K/V values are exact in every dtype (drawn rounded), so a kernel computing in fp32 is held
// to fp32's error; fp16/bf16 leave room for a kernel that rounds P or V to the KV dtype.
double tolerance(int32_t kv_dtype);

struct SeqSpec {
  int32_t context_len = 1;  // positions the sequence holds, new ones included
  int32_t num_new = 1;      // new tokens: the last num_new positions (1: a decode row)
};

struct KernelCase {
  int64_t id = 0;
  std::string label;  // the grid's scenario: decode, prefill-mid-block, partition-edges, ...
  int32_t num_heads = 1, num_kv_heads = 1, head_dim = 64, block_size = 16;
  int32_t kv_dtype = KVP_KV_F32, kv_layout = KVP_LAYOUT_KVPROOF;
  std::vector<SeqSpec> seqs;
  InputKind kind = InputKind::kRandom;
  uint64_t seed = 0;
  // The sliding window in positions (ABI version 3; 0: none). A windowed case's table entries
  // for the blocks wholly before each sequence's window name one block of NaN (a serving
  // engine has freed them), and a dominant input plants its key one position before the window.
  int32_t window = 0;
  // The score scale (0: 1 / sqrt(head_dim), what most models use; the scale cases set
  // Gemma's query_pre_attn_scalar^-1/2 and scales far from it) and the soft-cap (ABI version 4;
  // 0: none; c > 0: scores x become c * tanh(x / c) after the scale).
  float scale = 0.0f;
  float softcap = 0.0f;

  std::string describe() const;  // one line: shape, sequences, kind, seed
  nlohmann::json to_json() const;
};

// The grid for a plug-in declaring `kv_dtypes` and `kv_layouts` (descriptor bitmasks): the
// same list for the same declaration, ids 0..n-1. quick: every head_dim x head pairing once
// per scenario, a few seconds; full: every block size, dtype and scenario, long contexts.
// The cases every plug-in gets end with the scale cases (scores scaled other than by
// 1 / sqrt(head_dim)); `windows` (a plug-in with a sliding window: ABI version 3,
// supports_window set) appends the windowed cases after them, and `softcaps` (ABI version 4,
// supports_softcap set) the soft-capped ones after those, so every other case keeps its id.
std::vector<KernelCase> make_grid(Grid grid, uint32_t kv_dtypes, uint32_t kv_layouts, bool windows = false,
                                  bool softcaps = false);
// Whether a loaded plug-in has a sliding window (abi_version >= 3 and supports_window set).
bool has_window(const kvp_attention_plugin& plugin);
// Whether a loaded plug-in has a score soft-cap (abi_version >= 4 and supports_softcap set).
bool has_softcap(const kvp_attention_plugin& plugin);
// Whether the plug-in takes case `c` on `shape` (the case's shape): supports(), and for a
// windowed case supports_window(), for a soft-capped one supports_softcap().
bool plugin_takes(const kvp_attention_plugin& plugin, const KernelCase& c, const kvp_attention_shape& shape);

struct Failure {
  std::string property;
  std::string message;
};

struct CaseResult {
  bool skipped = false;  // supports() declined the shape
  std::vector<Failure> failures;
  double max_rel_error = 0.0;   // over the rows, relative to the row's largest reference value
  double max_error_ulps = 0.0;  // the same error in ULPs of the KV dtype at the row's largest value
  double seconds = 0.0;

  bool passed() const { return failures.empty(); }
  bool failed(const std::string& property) const;
};

// Runs one case in this process (no isolation: a crashing kernel takes the caller down).
CaseResult run_case(const kvp_attention_plugin& plugin, const KernelCase& c);
// Runs one case in a forked child with a time limit; a signal or timeout is the case's
// failure (property crash or timeout).
CaseResult run_case_isolated(const kvp_attention_plugin& plugin, const KernelCase& c, double timeout_s);

// A long-lived forked worker that runs cases one at a time, isolated from this process: a
// crash or a hang kills only the worker (the case reported with its signal or timeout), and
// the next case starts a fresh one. The plug-in and `cases` must outlive it.
class CaseWorker {
 public:
  CaseWorker(const kvp_attention_plugin& plugin, const std::vector<KernelCase>& cases);
  ~CaseWorker();
  CaseWorker(const CaseWorker&) = delete;
  CaseWorker& operator=(const CaseWorker&) = delete;
  // cases[index], within timeout_s seconds (the worker's start included).
  CaseResult run(std::size_t index, double timeout_s);
  int64_t started() const { return started_; }  // workers forked so far

 private:
  std::string start();  // empty, or why no worker started
  int stop();           // closes the socket and reaps the worker; its wait status (0 when none ran)
  const kvp_attention_plugin& plugin_;
  const std::vector<KernelCase>& cases_;
  pid_t pid_ = -1;
  int fd_ = -1;
  int64_t started_ = 0;
};

// The shard (0..shard_count-1) a case belongs to: a hash of its id, so that every shard gets a
// mix of scenarios and sizes whatever N is.
int shard_of(int64_t case_id, int shard_count);

// Every property a case can fail, in the order reports list them.
const std::vector<std::string>& all_properties();
// The properties that gate whatever --properties says: a case that did not produce its output
// (run-error, crash, timeout) was not measured at all.
bool always_required(const std::string& property);
// Ok when every name is a property (all_properties()); else an error naming the first that is
// not, and listing them.
Status check_property_names(const std::vector<std::string>& names);

struct Options {
  Grid grid = Grid::kQuick;
  // The properties a case must hold to pass (--properties); empty: all of them. The others are
  // still measured and reported ("not required"), never the verdict. always_required() ones
  // gate either way.
  std::vector<std::string> required_properties;
  std::optional<int64_t> case_id;        // only this case
  int shard_index = 0, shard_count = 1;  // the cases with shard_of(id, shard_count) == shard_index
  double timeout_s = 30.0;
  bool isolate = true;       // run the cases in a forked worker (CaseWorker)
  int64_t max_failures = 0;  // stop after this many failing cases (0: run them all)
};

struct CaseRecord {
  KernelCase spec;
  CaseResult result;
  std::string reproduce;  // the command that re-runs this case alone
};

struct Report {
  std::string plugin_path, plugin_name;
  Grid grid = Grid::kQuick;
  int shard_index = 0, shard_count = 1;
  std::vector<CaseRecord> cases;
  double seconds = 0.0;
  int64_t workers_started = 0;        // worker processes forked (isolated runs: 1 + one per crash or timeout)
  std::vector<std::string> required;  // Options::required_properties (empty: all)

  // Whether a failure of `property` fails its case (see Options::required_properties).
  bool gates(const std::string& property) const;
  // The case broke a property that gates.
  bool case_failed(const CaseResult& r) const;
  // The properties not required (empty when all are), in all_properties() order.
  std::vector<std::string> not_required() const;
  // Cases that broke only properties not required (measured, reported, passing).
  int64_t num_failed_not_required() const;
  int64_t num_failed() const;  // cases that broke a property that gates
  int64_t num_skipped() const;
  // No case failed and at least one ran (a plug-in that declines every shape checks nothing).
  bool passed() const { return num_failed() == 0 && num_skipped() < static_cast<int64_t>(cases.size()); }
  nlohmann::json to_json() const;
  std::string to_junit() const;
  std::string summary() const;  // failing cases (shape, failures, reproducer) and totals
  // The job summary (--summary): the verdict, each failed property with its first failing
  // case and that case's reproducer, a row per property, then the failing cases (20 at most).
  Summary to_summary(std::string reproducer) const;
  // The HTML report's plots: each case's error by scenario, and the failing cases per property.
  std::vector<Plot> plots() const;
};

// Runs the grid (or one case of it) on a loaded plug-in. `on_case` is called after each case.
// A CUDA plug-in (device KVP_DEVICE_CUDA) gets device copies of every array and a stream
// (kernel_check/cuda_runtime.h); `out`'s guard zones and the inputs are read back from the device.
// Errors: a --case id outside the grid, a bad shard, a CUDA plug-in without a CUDA runtime or
// device ("... runs on CUDA: no CUDA device: ...").
Result<Report> run_kernel_check(const AttentionPlugin& plugin, const Options& options,
                                const std::function<void(const CaseRecord&)>& on_case = {});

// Joins shard reports (to_json() of each) into one: same plug-in and grid, shards 0..N-1 of one
// N, each once. Errors name the file (its index in `reports`) and what disagrees.
Result<nlohmann::json> merge_reports(const std::vector<nlohmann::json>& reports);

}  // namespace kvp::verify::kernel_check
