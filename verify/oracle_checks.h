// The oracle's side of verify's logits and greedy checks: each finished request's engine
// rows against ReferenceModel<double>, computed once per token sequence and, with a worker
// thread, while the engine goes on running.
//
// The oracle's row at position p depends on tokens 0..p alone, bit for bit however its
// positions are split into forward() calls (tests/reference_model_test.cc). Two reuses rest
// on that:
//   comparisons  the same tokens with engine rows of the same bits (SHA-256 of each row)
//                give the same comparisons: they are reused instead of running the oracle
//   dense caches a sequence that shares a prefix with one the oracle already ran starts from
//                a copy of that run's K/V for the shared positions it has no engine row at
//                (a prefix-cache hit, a parallel sample's prompt), and runs the rest
// Both are exact: a reused comparison or a run from a stored cache gives the bits a fresh
// run gives (tests/differential_test.cc).
//
// OracleChecks runs the comparisons on one worker thread (background) in submission order,
// so what is reused, and every verdict, does not depend on timing; the verdicts are applied
// to the checks in submission order by finish().
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "optimized/engine/request.h"
#include "reference/reference_model.h"

namespace kvp::verify {

struct CheckResult;

using RowDigest = std::array<uint8_t, 32>;  // SHA-256 of a logits row
struct RowComparison {
  bool present = false;  // the engine captured a row at this position
  RowDigest engine_row{};
  double err = 0;     // max |engine - oracle| over the vocabulary (inf if a NaN)
  double scale = 0;   // max |oracle|
  int64_t best = 0;   // the oracle's arg-max
  double margin = 0;  // oracle[best] - the second largest logit
};

// What the logits and greedy checks read of one finished request, taken from it when it
// finishes (the engine may drop the request's rows then; see Engine::take_logits).
struct OracleJob {
  std::string label;                     // "request 7", in every failure detail
  std::vector<int32_t> tokens;           // the request's tokens
  std::vector<std::vector<float>> rows;  // the engine's rows at positions 0..last, the last
                                         // with a row; empty: none captured there
  int64_t num_prompt = 0;                // tokens of the prompt
  int64_t num_generated = 0;             // tokens generated (the rest of tokens)
  int64_t num_forced = 0;                // of which forced (not sampled)
  bool greedy = false;                   // its sampled tokens are the arg-max
  // The job of a finished request whose rows (its `logits`, taken or copied by the caller)
  // are `rows`; none when it captured no row.
  static std::optional<OracleJob> of(const Request& r, std::string label, std::vector<std::vector<float>> rows);
  // The tokens the oracle runs: positions 0..last.
  std::vector<int32_t> positions() const { return {tokens.begin(), tokens.begin() + std::ssize(rows)}; }
};

// The comparisons made so far, by token sequence, and the dense caches of the last runs
// (within a byte budget, the least recently used dropped first).
class OracleMemo {
 public:
  explicit OracleMemo(bool reuse = true, int64_t cache_budget_bytes = 16ll << 20)
      : reuse_(reuse), cache_budget_(cache_budget_bytes) {}
  bool reuse() const { return reuse_; }
  // The comparisons stored for `tokens` if every engine row has the same digest (and the
  // same positions have rows); else nullptr.
  const std::vector<RowComparison>* find(const std::vector<int32_t>& tokens,
                                         const std::vector<std::optional<RowDigest>>& rows) const;
  void store(std::vector<int32_t> tokens, std::vector<RowComparison> rows);
  // Copies into `cache` (empty) the K/V of the longest prefix of `tokens`, at most `limit`
  // positions and the cache's capacity, that a stored cache holds; returns its length.
  int64_t restore_prefix(const std::vector<int32_t>& tokens, int64_t limit, DenseKVCache<double>& cache);
  // Keeps the cache of a run of `tokens` (its length: tokens.size()) for later prefixes.
  void keep_cache(std::vector<int32_t> tokens, DenseKVCache<double> cache);
  int64_t cached_bytes() const { return cached_bytes_; }

 private:
  struct Cached {
    std::vector<int32_t> tokens;
    DenseKVCache<double> cache;
    uint64_t last_use = 0;
  };
  bool reuse_;
  int64_t cache_budget_;
  int64_t cached_bytes_ = 0;
  uint64_t clock_ = 0;
  std::map<std::vector<int32_t>, std::vector<RowComparison>> by_tokens_;
  std::vector<Cached> caches_;
};

// Counts of the oracle's work, for the report.
struct OracleStats {
  int64_t sequences_run = 0;       // sequences the oracle ran (some of their positions, at least)
  int64_t comparisons_reused = 0;  // requests whose comparisons were reused whole
  int64_t positions_run = 0;       // positions the oracle computed
  int64_t positions_restored = 0;  // positions taken from a stored dense cache instead
};

// The comparisons of a job's rows with the oracle: from `memo` when it has them, else from a
// run of the oracle (from a stored prefix's cache where there is one), stored there.
// `memo` may be nullptr (no reuse).
Result<std::vector<RowComparison>> compare_job(const ReferenceModel<double>& oracle, const OracleJob& job,
                                               OracleMemo* memo, OracleStats& stats);
// The verdicts of a job's comparisons: every row within `tolerance` of the oracle's row max
// (into `logits`), every greedy token the oracle's arg-max where its margin is beyond the
// tolerance (into `greedy`); the first failure of each is kept.
void apply_comparisons(const OracleJob& job, const std::vector<RowComparison>& rows, double tolerance,
                       CheckResult& logits, CheckResult& greedy);

// Jobs compared with the oracle, on a worker thread when background. Jobs come in ordered
// streams (verify: one per preemption mode, whose engines may run at once): every job of
// stream s is compared after every job of the streams before it, and only once those are
// closed (close()), each stream's in submission order. The memo then sees the jobs in one
// order, the one a single thread running the modes in turn gives, so the reuse, the work
// counted and the verdicts do not depend on timing. The rows of queued jobs are held until
// compared: submit() waits while its stream's would exceed max_pending_bytes (the stream
// the worker is on, or may be next on) or max_waiting_bytes (a stream waiting for an
// earlier one), and a job of its stream is queued.
class OracleChecks {
 public:
  struct Options {
    bool reuse = true;       // OracleMemo reuse; off: every job runs the oracle
    bool background = true;  // a worker thread; off: submit() compares at once
    // Memory beyond the engine's and the oracle's own: verify's peak must stay within 10% of
    // the engine's fp32 and an fp64 oracle's weights, and the pools. The oracle holds fp32
    // weights (reference_model.h), so a stream waiting for an earlier one may hold up to
    // max_waiting_bytes (verify: half the fp32 weights, within [24 MB, 256 MB]).
    int64_t max_pending_bytes = 24ll << 20;   // rows of a stream's jobs not yet compared
    int64_t max_waiting_bytes = 24ll << 20;   // the same, for a stream not yet being compared
    int64_t cache_budget_bytes = 16ll << 20;  // OracleMemo's dense caches
  };
  OracleChecks(const ReferenceModel<double>& oracle, Options options);
  ~OracleChecks();
  OracleChecks(const OracleChecks&) = delete;
  OracleChecks& operator=(const OracleChecks&) = delete;

  // Queues `job` on `stream` (0, 1, ...; not closed); its verdicts go to `logits` and
  // `greedy` when finish() runs, so both must outlive that call. Without a worker, compares
  // at once (the streams must then come in turn).
  void submit(OracleJob job, double tolerance, CheckResult& logits, CheckResult& greedy, int stream = 0);
  // No more jobs on `stream`: later streams' jobs may be compared once its own are.
  void close(int stream);
  // Waits for every queued job (closing every stream), then applies their verdicts, stream by
  // stream, each in submission order.
  void finish();
  // Valid after finish().
  const OracleStats& stats() const { return stats_; }

 private:
  struct Pending {
    OracleJob job;
    double tolerance = 0;
    CheckResult* logits = nullptr;
    CheckResult* greedy = nullptr;
    int64_t bytes = 0;
    Result<std::vector<RowComparison>> result = Status::error("not compared");
    bool done = false;
  };
  struct Stream {
    std::deque<Pending> jobs;  // submitted, not yet applied (stable addresses)
    std::size_t next = 0;      // index in jobs of the next job to compare
    int64_t pending_bytes = 0;
    bool closed = false;
  };
  void work();
  void compare(Pending& p);
  Stream& stream(int s);  // REQUIRES: mu_ held
  // The stream whose jobs may be compared now: the first with jobs left or still open
  // (nullptr: none). REQUIRES: mu_ held.
  Stream* current();

  const ReferenceModel<double>& oracle_;
  Options options_;
  OracleMemo memo_;
  OracleStats stats_;  // written by whoever compares (one at a time)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Stream> streams_;  // by number (stable addresses)
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace kvp::verify
