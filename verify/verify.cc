#include "verify/verify.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/report.h"
#include "model/presets.h"
#include "optimized/backends/backend_factory.h"
#include "optimized/backends/plan_validation.h"
#include "optimized/checkers/engine_invariants.h"
#include "optimized/checkers/invariants.h"
#include "optimized/engine/engine.h"
#include "optimized/kv/kv_groups.h"
#include "reference/reference_model.h"
#include "verify/kv_events_engine.h"

namespace kvp::verify {

namespace {
const char* mode_name(PreemptionMode m) { return m == PreemptionMode::kSwap ? "swap" : "recompute"; }
}  // namespace

namespace {
// The comparison of a speculative run with a plain one (see verify.h), request by request:
// workload requests by index, parallel samples by their index among the children.
void compare_runs(const Engine& spec, const Engine& plain, RequestId a, RequestId b, CheckResult& check) {
  const Request& x = spec.request(a);
  const Request& y = plain.request(b);
  const std::string label = "request " + std::to_string(a);
  const std::size_t common = std::min(x.tokens().size(), y.tokens().size());
  std::size_t agree = 0;
  while (agree < common && x.tokens()[agree] == y.tokens()[agree]) ++agree;
  auto fail = [&](const std::string& why) {
    if (!check.passed) return;
    check.passed = false;
    check.detail = label + ": " + why;
  };
  if (x.spec.sampling.greedy() && x.spec.forced_tokens.empty()) {
    const bool cut = x.finish() == FinishReason::kCancelled || y.finish() == FinishReason::kCancelled;
    if (agree < common || (!cut && x.tokens().size() != y.tokens().size()))
      fail("greedy tokens differ from plain decoding at position " + std::to_string(agree));
    if (!cut && x.finish() != y.finish()) fail("finishes differently from plain decoding");
  }
  // Logits at position p depend on tokens 0..p only.
  for (std::size_t p = 0; p + 1 <= agree && p < x.logits.size() && p < y.logits.size(); ++p) {
    if (x.logits[p].empty() || y.logits[p].empty()) continue;
    ++check.count;
    if (x.logits[p] != y.logits[p])
      fail("logits at position " + std::to_string(p) + " differ bitwise from plain decoding");
  }
  for (std::size_t c = 0; c < x.children.size() && c < y.children.size(); ++c)
    compare_runs(spec, plain, x.children[c], y.children[c], check);
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * v);
  return buf;
}
}  // namespace

namespace {

// A request as it was when it first reached a terminal state: a cancel that arrives later
// is a no-op, so none of this may change afterwards. Its logits are kept as one digest per
// position (the rows themselves are released once checked: see run_verify).
struct FinishedSnapshot {
  FinishReason finish = FinishReason::kNone;
  int64_t finish_step = -1;
  std::vector<int32_t> tokens;
  std::vector<std::optional<uint64_t>> rows;  // FNV-1a of each logits row's bits; none: no row
  bool released = false;                      // the engine dropped its logits after the check
};

// A row's digest, to tell whether two runs gave a row the same bits. Four lanes, each an
// FNV-style chain over every fourth 32-bit word (h = (h ^ word) * prime), finished by
// MurmurHash3's fmix64 and combined by rotation and xor: every step and the finish are
// bijections of a lane's state, so rows that differ in one word (one logit's bits) always
// get different digests. It runs on the engine's thread, per captured row (49,152 words for
// SmolLM2): four independent chains over words instead of byte-wise FNV-1a's one chain of
// four steps per word.
uint64_t hash_row(const std::vector<float>& row) {
  constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t lane[4] = {1469598103934665603ull ^ row.size(), 0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full,
                      0x165667b19e3779f9ull};
  std::size_t i = 0;
  const auto word = [&row](std::size_t at) {
    uint32_t u = 0;
    std::memcpy(&u, &row[at], sizeof u);
    return uint64_t{u};
  };
  for (; i + 4 <= row.size(); i += 4) {
    for (std::size_t l = 0; l < 4; ++l) lane[l] = (lane[l] ^ word(i + l)) * kPrime;
  }
  for (std::size_t l = 0; i < row.size(); ++i, ++l) lane[l] = (lane[l] ^ word(i)) * kPrime;
  const auto fmix = [](uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
  };
  const auto rotl = [](uint64_t x, int r) { return r == 0 ? x : (x << r) | (x >> (64 - r)); };
  return fmix(lane[0]) ^ rotl(fmix(lane[1]), 16) ^ rotl(fmix(lane[2]), 32) ^ rotl(fmix(lane[3]), 48);
}

std::vector<std::optional<uint64_t>> row_digests(const Request& r) {
  std::vector<std::optional<uint64_t>> out;
  for (const std::vector<float>& row : r.logits)
    out.push_back(row.empty() ? std::nullopt : std::optional<uint64_t>(hash_row(row)));
  return out;
}

void record_finished(const Engine& e, std::map<RequestId, FinishedSnapshot>& snapshots) {
  for (const auto& [id, r] : e.requests()) {
    if (!r->finished() || snapshots.count(id)) continue;
    snapshots[id] = {r->finish(), r->time.finish_step, r->tokens(), row_digests(*r), false};
  }
}

// The logits a request holds now are the ones it finished with: the same digests, or (once
// released) the same number of rows, all empty.
bool logits_unchanged(const Request& r, const FinishedSnapshot& s) {
  if (!s.released) return row_digests(r) == s.rows;
  return r.logits.size() == s.rows.size() &&
         std::all_of(r.logits.begin(), r.logits.end(), [](const std::vector<float>& row) { return row.empty(); });
}

// The cancels of a workload that arrived after their request had finished (Engine::cancel
// ignores them), each checked as a no-op: the request keeps the terminal state, tokens and
// logits it finished with. Returns how many there were; the first difference fails `check`.
int64_t check_late_cancels(const Engine& engine, const Workload& w, const WorkloadRun& run,
                           const std::map<RequestId, FinishedSnapshot>& snapshots, CheckResult& check) {
  int64_t late = 0;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    if (!w.requests[i].cancel_step || run.ids[i] < 0) continue;
    const Request& r = engine.request(run.ids[i]);
    if (r.cancel_requested) continue;  // it took effect: check_cancellations covers it
    ++late;
    const std::string who = "request " + std::to_string(run.ids[i]) + " (cancel at step " +
                            std::to_string(*w.requests[i].cancel_step) + ", after it finished)";
    auto it = snapshots.find(run.ids[i]);
    std::string diff;
    if (!r.finished() || it == snapshots.end())
      diff = "the cancel was ignored but the request never finished";
    else if (it->second.finish_step > *w.requests[i].cancel_step)
      diff = "it finished at step " + std::to_string(it->second.finish_step) + ", after the cancel";
    else if (r.finish() != it->second.finish || r.time.finish_step != it->second.finish_step)
      diff = "its terminal state changed from " + std::string(to_string(it->second.finish)) + " to " +
             to_string(r.finish());
    else if (r.tokens() != it->second.tokens)
      diff = "its tokens changed after it finished";
    else if (!logits_unchanged(r, it->second))
      diff = "its logits changed after it finished";
    if (!diff.empty() && check.passed) {
      check.passed = false;
      check.detail = who + ": " + diff;
    }
  }
  return late;
}
}  // namespace

void check_against_reference(const ReferenceModel<double>& oracle, const Request& r, double tol, CheckResult& logits,
                             CheckResult& greedy, const std::string& label, OracleMemo* memo, OracleStats* stats) {
  std::optional<OracleJob> job = OracleJob::of(r, label, r.logits);
  if (!job) return;
  OracleStats local;
  auto rows = compare_job(oracle, *job, memo, stats != nullptr ? *stats : local);
  if (!rows) {
    logits.passed = false;
    logits.detail = label + ": reference failed: " + rows.status().message();
    return;
  }
  apply_comparisons(*job, *rows, tol, logits, greedy);
}

namespace {

// One preemption mode's run of the workload and what verify's checks read afterwards. Held
// by pointer: the engine's observers point into it.
struct ModeRun {
  PreemptionMode mode = PreemptionMode::kRecompute;
  std::string m;  // the mode's name, in every check's name
  LiveEngine live;
  Result<WorkloadRun> run = Status::error("not run");
  std::vector<RequestId> ids;  // every request the engine knows (workload and forks); none if the run failed
  std::map<RequestId, FinishedSnapshot> finished_at;
  TimelineWitness witness;
  EventLog kv_log;  // kvproof's KV-event stream, when published
  std::optional<kv_events::EngineKvEvents> kv_stream;

  Engine& engine() const { return *live.engine; }
  bool ran() const { return run.is_ok(); }
};

// The checks of one mode, in report order; determinism only with speculation.
struct ModeChecks {
  explicit ModeChecks(const std::string& m)
      : inv("invariants[" + m + "]"),
        terminal("terminal-states[" + m + "]"),
        leak("no-leak[" + m + "]"),
        timeline("latency-timeline[" + m + "]"),
        logits("logits-vs-reference[" + m + "]"),
        greedy("greedy-tokens[" + m + "]"),
        recompute("recompute-bitwise[" + m + "]"),
        isolation("non-interference[" + m + "]"),
        determinism("determinism[" + m + "]"),
        cancellation("cancellation[" + m + "]") {}
  CheckResult inv, terminal, leak, timeline, logits, greedy, recompute, isolation, determinism, cancellation;
};

// Runs the workload on a fresh engine with the step checks installed (invariants after every
// plan and step, progress, the timeline's witness, the KV-event stream), each request checked
// against the oracle as soon as it finishes. Errors: the engine could not be built (a failed
// run is the invariants check's failure, not an error).
Status run_mode(const Model& model, const VerifyOptions& o, const Workload& workload, OracleChecks& oracle, ModeRun& r,
                ModeChecks& c, int stream) {
  auto live = make_engine(model, o, options_setup(o, r.mode));
  if (!live) return live.status();
  r.live = std::move(*live);
  Engine& engine = r.engine();
  install_step_checks(engine, c.inv);
  if (o.kv_events_publisher != nullptr) {
    if (r.mode != o.modes.front()) {  // this mode's engine starts with an empty cache
      kv_events::EventBatch cleared;
      cleared.ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      cleared.events.push_back(kv_events::AllBlocksCleared{});
      o.kv_events_publisher->publish(std::move(cleared));
    }
    engine.set_kv_event_log(&r.kv_log);
    r.kv_stream.emplace(engine.kv(), o.kv_events_publisher);
    r.kv_log.set_listener([&r](const KvEvent& e) { r.kv_stream->on_event(e); });
  }
  engine.set_plan_observer([&c, &r](const Engine& e, const BatchPlan& plan) {
    record_timeline(e, plan, /*after_step=*/false, r.witness);
    return check_plan(e, plan, c.inv);
  });
  // Finished requests are snapshotted by check_finished below, after every step and before
  // run_workload issues the next step's cancels: once per step, not here as well.
  engine.set_step_observer([&c, &r](const Engine& e, const BatchPlan& plan) {
    Status s = check_state(e, plan, c.inv);
    record_timeline(e, plan, /*after_step=*/true, r.witness);
    if (r.kv_stream) r.kv_stream->end_step();
    return s;
  });
  // Each request goes to the oracle as soon as it finishes, its logits with it (without
  // speculation, whose comparison with plain decoding reads every row at the end; else a
  // copy): one run never holds every request's logits at once, so verify's memory stays
  // near the weights and the pools. Later bitwise comparisons read the per-row digests of
  // the snapshot.
  const bool release = !o.speculation.enabled();
  const double tol = tolerance_for(o).value;
  std::set<RequestId> checked;
  const auto check_finished = [&](Engine& e) {
    record_finished(e, r.finished_at);
    for (auto& [id, snap] : r.finished_at) {
      if (!checked.insert(id).second) continue;
      const Request& req = e.request(id);
      if (req.finish() == FinishReason::kRejected) continue;
      std::vector<std::vector<float>> rows = release ? std::move(*e.take_logits(id)) : req.logits;
      snap.released = release;
      if (auto job = OracleJob::of(req, "request " + std::to_string(id), std::move(rows)))
        oracle.submit(std::move(*job), tol, c.logits, c.greedy, stream);
    }
    return Status::ok();
  };
  ProgressWatch progress;
  r.run = run_workload(engine, workload, o.max_steps, [&](Engine& e) {
    KVP_RETURN_IF_ERROR(check_progress(e, progress));
    return check_finished(e);
  });
  (void)check_finished(engine);
  if (!r.run && c.inv.passed) {
    c.inv.passed = false;
    c.inv.detail = "engine run failed: " + r.run.status().message();
  }
  if (r.run)
    for (const auto& [id, req] : engine.requests()) r.ids.push_back(id);
  return Status::ok();
}

// Every request ended exactly once, in a reported state.
void check_terminal_states(const ModeRun& r, CheckResult& terminal) {
  for (RequestId id : r.ids) {
    ++terminal.count;
    const Request& req = r.engine().request(id);
    if ((!req.finished() || req.finish() == FinishReason::kNone) && terminal.passed) {
      terminal.passed = false;
      terminal.detail = "request " + std::to_string(id) + " did not reach a terminal state";
    }
  }
}

// Queue time, TTFT, TPOT and end-to-end from each request's timeline: the same steps,
// derived again from the plans as they ran.
void check_latency_timeline(const ModeRun& r, CheckResult& timeline) {
  if (!r.ran()) return;
  if (Status s = check_timeline(r.engine(), r.witness, &timeline.count); !s) {
    timeline.passed = false;
    timeline.detail = s.message();
  }
}

// No leak, then every block free after a flush of the prefix cache.
void check_leaks(ModeRun& r, CheckResult& leak) {
  if (!r.ran()) return;
  Engine& engine = r.engine();
  Status s = check_no_leak(engine.kv());
  if (s) s = engine.flush_prefix_cache_when_idle();
  if (s) {
    if (r.kv_stream) r.kv_stream->end_step();  // the flush's removals, as one last batch
    s = check_all_free(engine.kv());
  }
  leak.count = engine.kv().device_allocator().num_blocks() + engine.kv().host_allocator().num_blocks();
  if (!s) {
    leak.passed = false;
    leak.detail = s.message();
  }
}

// Positions recomputed after a preemption gave the logits' bits of the first computation.
void check_recompute(const ModeRun& r, CheckResult& recompute) {
  for (RequestId id : r.ids) {
    const Request& req = r.engine().request(id);
    if (req.finish() == FinishReason::kRejected) continue;
    recompute.count += req.num_preemptions();
    if (req.recomputed_logit_mismatches > 0 && recompute.passed) {
      recompute.passed = false;
      recompute.detail = "request " + std::to_string(id) + ": " + std::to_string(req.recomputed_logit_mismatches) +
                         " recomputed positions differ bitwise";
    }
  }
}

// Which finished requests non-interference re-runs: the most preempted, plus one parallel
// sample (it shared blocks and copied on write). Sampled requests under speculation are left
// out (their draws depend on the schedule; see verify.h): determinism checks them.
struct IsolationSample {
  std::vector<RequestId> rerun;
  std::vector<RequestId> sampled_under_speculation;
  bool any_eligible = false;
};

IsolationSample pick_isolation_sample(const ModeRun& r, const VerifyOptions& o) {
  IsolationSample out;
  const Engine& engine = r.engine();
  std::vector<RequestId>& sample = out.rerun;
  for (RequestId id : r.ids) {
    const Request& req = engine.request(id);
    if (req.finish() != FinishReason::kLength && req.finish() != FinishReason::kStop) continue;
    if (o.speculation.enabled() && !req.spec.sampling.greedy()) {
      out.sampled_under_speculation.push_back(id);
      continue;
    }
    sample.push_back(id);
  }
  out.any_eligible = !sample.empty();
  std::stable_sort(sample.begin(), sample.end(), [&](RequestId a, RequestId b) {
    return engine.request(a).num_preemptions() > engine.request(b).num_preemptions();
  });
  auto first_fork =
      std::find_if(sample.begin(), sample.end(), [&](RequestId id) { return engine.request(id).parent >= 0; });
  const auto keep = static_cast<std::size_t>(std::max(0, o.isolation_samples - 1));
  if (first_fork != sample.end() && static_cast<std::size_t>(first_fork - sample.begin()) >= keep) {
    std::rotate(sample.begin() + static_cast<std::ptrdiff_t>(std::min(keep, sample.size())), first_fork,
                first_fork + 1);
  }
  sample.resize(std::min<std::size_t>(sample.size(), static_cast<std::size_t>(o.isolation_samples)));
  return out;
}

// One sampled request re-run alone under `setup`: what differs from its run in the mode
// (empty: nothing), or why it could not run.
struct SoloRun {
  Status engine = Status::ok();  // the engine could not be built (verify's error)
  std::string failed;            // the run failed
  std::string diff;              // tokens or logits differ
};

SoloRun run_alone(const Model& model, const EngineOptions& o, int64_t max_steps, const ModeRun& r, RequestId id,
                  const EngineSetup& setup) {
  SoloRun out;
  const Request& original = r.engine().request(id);
  // The device pool holds this request's whole life and no more, and there is no host pool:
  // a request alone is never preempted (sized for max_model_len, with a host pool as large,
  // two re-runs at once held 100 MB of pools on SmolLM2-135M). Margins: speculation's
  // lookahead, the watermark, two blocks.
  const int64_t tokens =
      (static_cast<int64_t>(original.spec.prompt.size()) + std::max<int64_t>(1, original.num_generated()) +
       (o.speculation.enabled() ? o.speculation.k + 1 : 0)) *
      std::max<int64_t>(1, original.spec.n);
  int64_t need =
      std::min<int64_t>(setup.num_blocks, (tokens + setup.block_size - 1) / setup.block_size + o.watermark_blocks + 2);
  if (uses_kv_groups(model.config, o)) {
    // Every KV-cache group's table holds the request (a windowed one holds a prompt chunk
    // before its window releases), and engine_config turns these blocks of every layer into
    // num_layers / group_size as many group blocks: fewer than num_groups as many when the
    // last group of a type is short (5 layers as 3 groups of 2). Found by
    // scripts/verify-random.py --models random: a Gemma 2 of 5 layers was rejected alone.
    const KvGroupLayout layout = kv_group_layout(model.config);
    need = (need * layout.num_groups() * layout.group_size + model.config.num_layers - 1) / model.config.num_layers;
  }
  EngineSetup sized = setup;
  sized.num_blocks = static_cast<int32_t>(need);
  sized.num_host_blocks = 0;  // nothing to swap out to: the request is alone
  auto alone = make_engine(model, o, sized);
  if (!alone) {
    out.engine = alone.status();
    return out;
  }
  // The request as the engine ran it (a parallel sample is a plain request with its seed).
  WorkloadRequest wr;
  wr.spec = original.spec;
  wr.spec.max_tokens = std::max<int64_t>(1, original.num_generated());
  // Each row is digested as soon as it is captured and dropped: a re-run never holds its
  // request's logits (100 positions of SmolLM2's vocabulary are 20 MB).
  std::vector<std::optional<uint64_t>> digests;
  const auto digest_rows = [&digests](Engine& e) {
    for (const auto& [rid, req] : e.requests()) {
      if (req->parent >= 0) continue;  // the request's parallel samples: only it is compared
      for (auto& [p, row] : e.take_captured_logits(rid)) {
        if (static_cast<int64_t>(digests.size()) <= p) digests.resize(static_cast<std::size_t>(p) + 1);
        digests[static_cast<std::size_t>(p)] = hash_row(row);
      }
    }
    return Status::ok();
  };
  auto solo = run_workload(*alone->engine, Workload{"solo", {wr}}, max_steps, digest_rows);
  if (!solo) {
    out.failed = solo.status().message();
    return out;
  }
  (void)digest_rows(*alone->engine);
  const Request& again = alone->engine->request(solo->ids[0]);
  if (again.finish() == FinishReason::kRejected) {  // the sizing above is wrong: say so, not "tokens differ"
    out.failed = "rejected by a pool of " + std::to_string(sized.num_blocks) + " blocks sized to hold it";
    return out;
  }
  const std::vector<std::optional<uint64_t>>& rows = r.finished_at.at(id).rows;
  if (again.tokens() != original.tokens())
    out.diff = "tokens differ";
  else if (again.logits.size() != rows.size())
    out.diff =
        "logits for " + std::to_string(again.logits.size()) + " vs " + std::to_string(rows.size()) + " positions";
  // Positions served from the prefix cache in one run have no logits there: compare the rest.
  for (std::size_t p = 0; out.diff.empty() && p < digests.size(); ++p)
    if (digests[p] && rows[p] && *digests[p] != *rows[p])
      out.diff = "logits at position " + std::to_string(p) + " differ bitwise";
  return out;
}

// Non-interference: each sampled request re-run alone under another schedule (block size,
// chunk, preemption mode) gives the same tokens and the same logits' bits. The re-runs are
// independent (an engine each, reading the finished mode run), so with more than one
// thread they run that many at a time, the threads split between their engines; their
// outcomes are read in sample order, so the check says the same however many ran at once
// (and an engine's bits do not depend on its threads). Errors: an engine could not be built.
Status check_non_interference(const Model& model, const VerifyOptions& o, const ModeRun& r,
                              const std::vector<RequestId>& sample, CheckResult& isolation) {
  const int32_t alt_block = o.block_size == 16 ? 8 : 16;
  const int32_t blocks = static_cast<int32_t>((o.max_model_len + alt_block - 1) / alt_block) + 2;
  const int32_t alt_chunk = std::max(1, o.prefill_chunk_size / 2 - 1);
  const PreemptionMode alt_mode = r.mode == PreemptionMode::kSwap ? PreemptionMode::kRecompute : PreemptionMode::kSwap;
  const EngineSetup setup{alt_block, blocks, blocks, alt_chunk, alt_mode};
  const std::size_t workers =
      std::max<std::size_t>(1, std::min(static_cast<std::size_t>(std::max(o.num_threads, 1)), sample.size()));
  EngineOptions eo = o;
  eo.num_threads = std::max(1, o.num_threads / static_cast<int>(workers));
  std::vector<SoloRun> runs(sample.size());
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t i = next++; i < sample.size(); i = next++)
      runs[i] = run_alone(model, eo, o.max_steps, r, sample[i], setup);
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (std::size_t i = 0; i < sample.size(); ++i) {
    const SoloRun& run = runs[i];
    KVP_RETURN_IF_ERROR(run.engine);
    ++isolation.count;
    const std::string who = "request " + std::to_string(sample[i]);
    if (!run.failed.empty()) {
      isolation.passed = false;
      isolation.detail = who + " alone: " + run.failed;
      continue;
    }
    if (!run.diff.empty() && isolation.passed) {
      isolation.passed = false;
      isolation.detail = who + ": " + run.diff + " when run alone (block size " + std::to_string(alt_block) +
                         ", chunk " + std::to_string(alt_chunk) + ", " + mode_name(alt_mode) + ")";
    }
  }
  if (isolation.passed && isolation.count > 0) {
    int64_t forked = 0;
    for (RequestId id : sample) forked += r.engine().request(id).parent >= 0 ? 1 : 0;
    isolation.detail = std::to_string(forked) + " of them parallel samples (forked, copy-on-write)";
  }
  return Status::ok();
}

// Sampled requests under speculation: the strongest check that holds for them is
// determinism, the same workload on an identical engine (same schedule) giving them the
// same tokens and logits bit for bit. Errors: the twin engine could not be built.
Status check_determinism(const Model& model, const VerifyOptions& o, const Workload& workload, const ModeRun& r,
                         const std::vector<RequestId>& sampled, CheckResult& determinism) {
  if (sampled.empty()) {
    determinism.applies = false;
    determinism.detail = "not applicable: no sampled request finished normally";
    return Status::ok();
  }
  auto twin = make_engine(model, o, options_setup(o, r.mode));
  if (!twin) return twin.status();
  auto again = run_workload(*twin->engine, workload, o.max_steps);
  for (RequestId id : sampled) {
    ++determinism.count;
    std::string diff;
    if (!again) {
      diff = "the re-run failed: " + again.status().message();
    } else if (!twin->engine->requests().count(id)) {
      diff = "unknown in the re-run";
    } else {
      const Request& a = r.engine().request(id);
      const Request& b = twin->engine->request(id);
      if (a.tokens() != b.tokens())
        diff = "tokens differ in an identical re-run";
      else if (a.logits != b.logits)
        diff = "logits differ bitwise in an identical re-run";
    }
    if (!diff.empty() && determinism.passed) {
      determinism.passed = false;
      determinism.detail = "request " + std::to_string(id) + ": " + diff;
    }
  }
  if (determinism.passed)
    determinism.detail =
        "sampled requests under speculation, re-run under the same schedule: tokens and logits "
        "bitwise equal";
  return Status::ok();
}

// Each cancelled request ended at its cancellation's step boundary with its blocks released
// (checked after every step too, as part of the invariants); a cancel that arrived after its
// request finished is a no-op, checked as one.
void check_cancellation(const ModeRun& r, const Workload& workload, CheckResult& cancellation) {
  const Engine& engine = r.engine();
  std::map<std::string, int64_t> cancelled_in;
  for (RequestId id : r.ids) {
    const Request& req = engine.request(id);
    if (!req.cancel_requested) continue;
    ++cancellation.count;
    ++cancelled_in[req.cancelled_in.empty() ? "finished first" : req.cancelled_in];
  }
  const int64_t late_cancels = r.ran() ? check_late_cancels(engine, workload, *r.run, r.finished_at, cancellation) : 0;
  if (Status s = check_cancellations(engine); r.ran() && !s) {
    if (cancellation.passed) cancellation.detail = s.message();
    cancellation.passed = false;
  } else if (cancellation.passed) {
    for (const auto& [state, n] : cancelled_in)
      cancellation.detail +=
          (cancellation.detail.empty() ? "cancelled while " : ", ") + state + " " + std::to_string(n);
    if (late_cancels > 0)
      cancellation.detail += (cancellation.detail.empty() ? "no cancel took effect: " : "; ") +
                             std::to_string(late_cancels) +
                             " arrived after its request finished (checked as a no-op: terminal state, tokens and "
                             "logits unchanged)";
  }
  cancellation.count += late_cancels;
  cancellation.applies = std::any_of(workload.requests.begin(), workload.requests.end(),
                                     [](const WorkloadRequest& w) { return w.cancel_step.has_value(); });
  if (!cancellation.applies) cancellation.detail = "not applicable: the workload cancels nothing";
}

// What applies: greedy tokens only with a greedy sampled token; recompute only after a
// preemption; non-interference only with a request that finished normally.
void mark_what_applies(const ModeRun& r, bool any_isolation_eligible, ModeChecks& c) {
  int64_t finished_normally = 0;
  bool any_greedy = false;
  for (RequestId id : r.ids) {
    const Request& req = r.engine().request(id);
    if (req.finish() == FinishReason::kStop || req.finish() == FinishReason::kLength) ++finished_normally;
    if (req.finish() != FinishReason::kRejected && req.spec.sampling.greedy() &&
        req.num_generated() > static_cast<int64_t>(req.spec.forced_tokens.size()))
      any_greedy = true;
  }
  c.greedy.applies = any_greedy;
  if (!c.greedy.applies) c.greedy.detail = "not applicable: no greedy request generated a token";
  c.recompute.applies = c.recompute.count > 0;
  if (!c.recompute.applies && c.recompute.detail.empty()) c.recompute.detail = "not applicable: no preemption happened";
  c.isolation.applies = any_isolation_eligible;
  if (!c.isolation.applies) {
    c.isolation.detail = finished_normally == 0
                             ? "not applicable: no request finished normally (stop or length)"
                             : "not applicable: every finished request was sampled under speculation (their draws "
                               "depend on the schedule); determinism[" +
                                   r.m + "] re-runs them under the same one";
  }
}

// Speculative decoding against plain decoding on the same workload and schedule: greedy
// tokens equal, logits bitwise equal where the tokens agree. Errors: the plain engine could
// not be built.
Status check_speculative_vs_plain(const Model& model, const VerifyOptions& o, const Workload& workload,
                                  const ModeRun& r, CheckResult& same) {
  VerifyOptions plain_options = o;
  plain_options.speculation = SpeculationParams{};
  auto plain = make_engine(model, plain_options, options_setup(o, r.mode));
  if (!plain) return plain.status();
  auto plain_run = run_workload(*plain->engine, workload, o.max_steps);
  if (!r.ran() || !plain_run) {
    same.passed = false;
    same.detail = "a run failed";
    return Status::ok();
  }
  for (std::size_t i = 0; i < r.run->ids.size(); ++i)
    compare_runs(r.engine(), *plain->engine, r.run->ids[i], plain_run->ids[i], same);
  const EngineMetrics sm = r.engine().metrics();
  if (same.passed)
    same.detail = std::string(to_string(o.speculation.proposer)) + " k=" + std::to_string(o.speculation.k) +
                  ": acceptance " + percent(sm.acceptance_rate) + ", mean accepted " + fmt(sm.mean_accepted_length) +
                  ", target forwards/token " + fmt(sm.forwards_per_token) + " (plain " +
                  fmt(plain->engine->metrics().forwards_per_token) + ")";
  return Status::ok();
}

// One mode's checks, held until the oracle's verdicts are in (OracleChecks writes its
// logits and greedy checks), then appended to the report in order.
struct ModeOutcome {
  std::string m;
  bool ran = false;
  std::unique_ptr<ModeChecks> c;   // the oracle's jobs point into it
  std::unique_ptr<ModeRun> r;      // the run, until its checks are done
  std::vector<CheckResult> after;  // the KV-event stream's and speculation's checks
  EngineMetrics metrics;
};

// One mode's run; its logits and greedy checks are queued on `oracle`'s stream `stream` as
// requests finish, and the stream closed. The leak check (the last to change the engine) and
// the KV-event stream's are made here, before another mode's engine publishes.
Status run_and_close_mode(const Model& model, const VerifyOptions& o, const Workload& workload, OracleChecks& oracle,
                          PreemptionMode mode, ModeOutcome& out, int stream) {
  struct Close {
    OracleChecks& oracle;
    int stream;
    ~Close() { oracle.close(stream); }  // on every path: later streams wait for it
  } close{oracle, stream};
  out.r = std::make_unique<ModeRun>();
  ModeRun& r = *out.r;
  r.mode = mode;
  r.m = mode_name(mode);
  out.m = r.m;
  out.c = std::make_unique<ModeChecks>(r.m);
  KVP_RETURN_IF_ERROR(run_mode(model, o, workload, oracle, r, *out.c, stream));
  out.ran = r.ran();
  check_leaks(r, out.c->leak);  // flushes the prefix cache: its removals are in the stream
  if (r.kv_stream) {
    r.kv_stream->end_step();
    out.after.push_back(kv_events::check_engine_stream("kv-event-stream[" + r.m + "]", r.kv_log.events(),
                                                       r.kv_stream->batches(), /*published=*/true));
  }
  out.metrics = r.engine().metrics();
  return Status::ok();
}

// The checks of a finished mode run but the oracle's, in turn; some re-run engines of their
// own (non-interference, determinism, speculation against plain decoding). They read the
// run (none changes its engine) and no other state of verify, so they may overlap the next
// mode's run. The run is freed at the end.
Status check_mode(const Model& model, const VerifyOptions& o, const Workload& workload, ModeOutcome& out) {
  ModeRun& r = *out.r;
  ModeChecks& c = *out.c;
  check_terminal_states(r, c.terminal);
  check_latency_timeline(r, c.timeline);
  check_recompute(r, c.recompute);
  const IsolationSample sample = pick_isolation_sample(r, o);
  KVP_RETURN_IF_ERROR(check_non_interference(model, o, r, sample.rerun, c.isolation));
  if (o.speculation.enabled())
    KVP_RETURN_IF_ERROR(check_determinism(model, o, workload, r, sample.sampled_under_speculation, c.determinism));
  check_cancellation(r, workload, c.cancellation);
  mark_what_applies(r, sample.any_eligible, c);
  if (o.speculation.enabled()) {
    CheckResult same("speculative-vs-plain[" + r.m + "]");
    KVP_RETURN_IF_ERROR(check_speculative_vs_plain(model, o, workload, r, same));
    out.after.push_back(same);
  }
  out.r.reset();
  return Status::ok();
}

// A mode's checks into the report, the oracle's verdicts in.
void report_mode(const VerifyOptions& o, ModeOutcome& out, VerifyReport& report) {
  ModeChecks& c = *out.c;
  if (c.logits.passed) {
    const Tolerance tol = tolerance_for(o);
    c.logits.detail = "tolerance " + fmt(tol.value) + " (" + tol.source + ")";
    if (!o.kv_scales_source.empty()) c.logits.detail += "; fp8 KV scales " + o.kv_scales_source;
  }
  // Vacuous only when nothing about the engine's outputs was checked: a run whose requests
  // were all cancelled still had its computed positions checked against the oracle.
  if (out.ran && c.logits.count == 0)
    report.nothing_verified.push_back("engine outputs[" + out.m + "] (no position's logits were checked)");
  for (CheckResult* check : {&c.inv, &c.terminal, &c.leak, &c.timeline, &c.logits, &c.greedy, &c.recompute,
                             &c.isolation, &c.determinism, &c.cancellation}) {
    if (check == &c.determinism && !o.speculation.enabled()) continue;
    if (out.ran && check->applies && check->count == 0) report.nothing_verified.push_back(check->name);
    report.checks.push_back(*check);
  }
  for (CheckResult& check : out.after) report.checks.push_back(std::move(check));
  report.runs.emplace_back(out.m, out.metrics);
}

}  // namespace

Result<VerifyReport> run_verify(const Model& model, const Workload& workload_in, const VerifyOptions& o) {
  VerifyReport report;
  report.allow_empty = o.allow_empty;
  Workload workload = workload_in;
  for (WorkloadRequest& r : workload.requests) r.spec.capture_logits = true;
  ReferenceModel<double> oracle(model, o.num_threads);
  // With more than one thread, the oracle compares each finished request on a thread of its
  // own while the engine runs on; with one, at once. Its products take all the threads: the
  // engine's small products leave them idle most of the time (on SmolLM2-135M here, 43.6 s
  // with one thread for the oracle's products, 40.5 and 46.8 s with both: within this
  // machine's noise). The verdicts are the same bits either way (OracleChecks; the oracle's
  // logits do not depend on its threads).
  OracleChecks::Options oo;
  oo.reuse = o.oracle_memo;
  oo.background = o.num_threads > 1;
  // A mode waiting for the oracle to finish the one before it may hold half the engine's
  // fp32 weights in rows (OracleChecks::Options), 24 to 256 MB.
  const int64_t weight_bytes = model.config.num_parameters() * static_cast<int64_t>(sizeof(float));
  oo.max_waiting_bytes = std::clamp<int64_t>(weight_bytes / 2, oo.max_pending_bytes, 256ll << 20);
  oracle.set_threads(o.num_threads);
  // Each (tokens, engine row) is compared with the oracle once per verify: the second
  // preemption mode runs the same sequences, and a bitwise-equal row needs no new oracle run.
  OracleChecks checks(oracle, oo);
  std::vector<ModeOutcome> modes(o.modes.size());
  std::vector<std::future<Status>> mode_checks(o.modes.size());
  const auto wait_for_checks = [&]() -> Status {
    Status first = Status::ok();
    for (std::future<Status>& f : mode_checks) {
      if (!f.valid()) continue;
      Status s = f.get();
      if (first.is_ok() && !s.is_ok()) first = std::move(s);
    }
    return first;
  };
  // With more than one thread the modes run at once, each on its own engine with its share
  // of the threads (an engine's bits do not depend on its threads), then its own checks
  // (above all the non-interference re-runs). The engines' small decode products are bound
  // by memory and leave a core idle; the oracle and the other mode's work fill it. Each
  // mode's oracle jobs are a stream of their own, compared in mode order
  // (OracleChecks), and each check reads only its own mode's run: the same verdicts, the
  // same oracle work (tests/differential_test.cc, under ThreadSanitizer in CI). With one
  // thread, a KV-event publisher (one engine's stream at a time), or a CUDA backend (each
  // engine uploads its own copy of the weights: two at once would hold two; on cuda-emu,
  // SmolLM2-135M's peak went from 3.3 to 4.4 GB), the modes run in turn; with more than one
  // thread, a mode's checks still overlap the next mode's run. The cpu backend's engines
  // read the caller's weights.
  const bool at_once =
      o.num_threads > 1 && o.kv_events_publisher == nullptr && o.modes.size() > 1 && o.backend == BackendKind::kCpu;
  if (at_once) {
    VerifyOptions each = o;
    each.num_threads = std::max(1, o.num_threads / static_cast<int>(o.modes.size()));
    for (std::size_t i = 0; i < o.modes.size(); ++i) {
      mode_checks[i] = std::async(std::launch::async, [&, i, each] {
        KVP_RETURN_IF_ERROR(
            run_and_close_mode(model, each, workload, checks, o.modes[i], modes[i], static_cast<int>(i)));
        return check_mode(model, o, workload, modes[i]);
      });
    }
  } else {
    for (std::size_t i = 0; i < o.modes.size(); ++i) {
      if (Status s = run_and_close_mode(model, o, workload, checks, o.modes[i], modes[i], static_cast<int>(i));
          !s.is_ok()) {
        (void)wait_for_checks();
        return s;
      }
      ModeOutcome& out = modes[i];
      if (o.num_threads > 1) {
        mode_checks[i] = std::async(std::launch::async, [&] { return check_mode(model, o, workload, out); });
      } else {
        KVP_RETURN_IF_ERROR(check_mode(model, o, workload, out));
      }
    }
  }
  KVP_RETURN_IF_ERROR(wait_for_checks());
  checks.finish();
  for (ModeOutcome& m : modes) report_mode(o, m, report);
  report.oracle = checks.stats();
  report.tolerance = tolerance_for(o).value;
  return report;
}

}  // namespace kvp::verify
