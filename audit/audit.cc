#include "audit/audit.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "audit/kv_events/kv_events_audit.h"
#include "kernels/kv_index.h"
#include "optimized/checkers/engine_invariants.h"
#include "optimized/checkers/event_log_replay.h"
#include "optimized/checkers/invariants.h"
#include "optimized/kv/event_log.h"
#include "verify/kv_events_engine.h"

namespace kvp::verify {

namespace {

// Both halves of isolation from the event log (who allocated each block, which prefix hits
// handed it to whom) and the requests' tokens (which requests of different tenants had an
// identical prefix of whole blocks). See audit.h.
void collect_isolation_evidence(const EventLog& log, const Engine& engine, int32_t block_size, AuditReport& report) {
  std::map<int64_t, int64_t> tenant_of;     // sequence -> tenant
  std::map<int64_t, int64_t> owner_tenant;  // device block -> tenant of the sequence that wrote it
  for (const std::string& line : log.lines()) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    const std::string ev = j.value("ev", "");
    const auto seq_tenant = [&](const char* key) { return tenant_of[j.value(key, int64_t{-1})]; };
    if (ev == "add") {
      tenant_of[j.value("seq", int64_t{-1})] = j.value("tenant", int64_t{0});
    } else if (ev == "fork") {
      tenant_of[j.value("child", int64_t{-1})] = seq_tenant("parent");
    } else if (ev == "alloc") {
      owner_tenant[j.value("block", int64_t{-1})] = seq_tenant("seq");
    } else if (ev == "cow") {
      owner_tenant[j.value("dst", int64_t{-1})] = seq_tenant("seq");
    } else if (ev == "swap_in" && j.contains("pairs") && j["pairs"].is_array()) {
      for (const auto& p : j["pairs"])
        if (p.is_array() && p.size() == 2 && p[1].is_number_integer())
          owner_tenant[p[1].get<int64_t>()] = seq_tenant("seq");
    } else if (ev == "share" && j.value("reason", "") == "prefix_hit") {
      // A windowed KV-cache group's entry before its window is a share of block -1: the hit
      // hands it no block.
      if (j.value("block", int64_t{-1}) < 0) continue;
      const int64_t reader = seq_tenant("seq");
      const int64_t owner = owner_tenant[j.value("block", int64_t{-1})];
      if (reader == owner) {
        ++report.reuses_within_tenant[reader];
      } else {
        ++report.tenant_pairs[{std::min(reader, owner), std::max(reader, owner)}].shared_blocks;
      }
    }
  }
  std::vector<const Request*> requests;
  for (const auto& [id, r] : engine.requests())
    if (r->finish() != FinishReason::kRejected) requests.push_back(r.get());
  for (std::size_t a = 0; a < requests.size(); ++a) {
    for (std::size_t b = a + 1; b < requests.size(); ++b) {
      const Request& x = *requests[a];
      const Request& y = *requests[b];
      if (x.spec.tenant == y.spec.tenant) continue;
      const auto& tx = x.spec.prompt;
      const auto& ty = y.spec.prompt;
      const std::size_t n = std::min(tx.size(), ty.size());
      std::size_t same = 0;
      while (same < n && tx[same] == ty[same]) ++same;
      const auto blocks = static_cast<int64_t>(same) / block_size;
      if (blocks == 0) continue;
      TenantPairEvidence& e =
          report.tenant_pairs[{std::min(x.spec.tenant, y.spec.tenant), std::max(x.spec.tenant, y.spec.tenant)}];
      ++e.identical_prefix_requests;
      e.longest_identical_blocks = std::max(e.longest_identical_blocks, blocks);
    }
  }
}

}  // namespace

bool AuditReport::passed() const {
  for (const CheckResult& c : checks)
    if (!c.passed) return false;
  return true;
}

namespace {

// The audited run and what the checks read afterwards. Held by pointer: the engine's
// observers and the event log's listener point into it.
struct AuditRun {
  LiveEngine live;
  std::ofstream log_file;
  std::unique_ptr<EventLog> log;
  std::optional<kv_events::EngineKvEvents> kv_stream;  // kvproof's KV-event stream, one batch a step
  Result<WorkloadRun> run = Status::error("not run");
  std::set<int32_t> seen;  // every block a plan read
  Engine& engine() const { return *live.engine; }
};

struct AuditChecks {
  CheckResult inv{"invariants-every-step"}, reads{"ownership-of-every-read"}, scope{"backend-read-scope"},
      stale{"no-stale-read (NaN scan)"}, replay{"event-log-replay"}, logits{"logits-vs-reference"},
      greedy{"greedy-tokens"}, terminal{"terminal-states"}, evidence{"isolation-evidence"};
};

// Runs the workload with every plan's reads checked against ownership (I4 and the rest of
// check_plan), every step's state checked, the event log kept (and written when asked) and
// the KV-event stream published when asked. Errors: the engine or the log file.
Status run_audited(const Model& model, const VerifyOptions& o, const Workload& workload, const AuditOptions& options,
                   AuditRun& a, AuditChecks& c, AuditReport& report) {
  const PreemptionMode mode = o.modes.empty() ? PreemptionMode::kRecompute : o.modes.front();
  auto live = make_engine(model, o, options_setup(o, mode));
  if (!live) return live.status();
  a.live = std::move(*live);
  Engine& engine = a.engine();
  if (!options.event_log_path.empty()) {
    a.log_file.open(options.event_log_path, std::ios::trunc);
    if (!a.log_file) return Status::error(options.event_log_path + ": cannot open for writing");
  }
  a.log = std::make_unique<EventLog>(options.event_log_path.empty() ? nullptr : &a.log_file);
  engine.set_kv_event_log(a.log.get());
  a.kv_stream.emplace(engine.kv(), options.kv_events_publisher);
  a.log->set_listener([&a](const KvEvent& e) { a.kv_stream->on_event(e); });
  engine.set_plan_observer([&a, &c, &report](const Engine& e, const BatchPlan& plan) -> Status {
    ++report.plans;
    ++c.reads.count;
    PlanReadStats stats;
    if (Status s = kvp::check_plan(e, plan, &stats); !s) {
      CheckResult& blamed = s.message().find("I4:") != std::string::npos ? c.reads : c.inv;
      blamed.passed = false;
      blamed.detail = s.message();
      return s;
    }
    report.block_reads += stats.block_reads;
    report.kv_reads += stats.kv_position_reads;
    a.seen.insert(stats.blocks.begin(), stats.blocks.end());
    return Status::ok();
  });
  engine.set_step_observer([&a, &c](const Engine& e, const BatchPlan& plan) {
    Status s = check_state(e, plan, c.inv);
    a.kv_stream->end_step();
    return s;
  });
  ProgressWatch progress;
  a.run = run_workload(engine, workload, o.max_steps, [&](Engine& e) { return check_progress(e, progress); });
  a.kv_stream->end_step();
  a.log->set_listener(nullptr);
  c.scope.count = a.live.backend->audited_block_reads();
  if (!a.run && c.inv.passed && c.reads.passed) {
    CheckResult& blamed = a.run.status().message().find("audit:") != std::string::npos ? c.scope : c.inv;
    blamed.passed = false;
    blamed.detail = "engine run failed: " + a.run.status().message();
  }
  report.blocks_checked = static_cast<int64_t>(a.seen.size());
  const EngineMetrics metrics = engine.metrics();
  report.prefix_hit_tokens = metrics.counters.prefix_hit_tokens;
  report.poisoned_blocks = metrics.counters.poisoned_blocks;
  return Status::ok();
}

// Every request ended; no logit is NaN (a read of a poisoned, freed block: I7); logits and
// greedy tokens against the oracle.
void check_outputs(const Model& model, const VerifyOptions& o, const AuditRun& a, AuditChecks& c, AuditReport& report) {
  if (!a.run) return;
  const ReferenceModel<double> oracle(model, o.num_threads);
  for (const auto& [i, owned] : a.engine().requests()) {
    const Request& r = *owned;
    ++c.terminal.count;
    if (!r.finished() && c.terminal.passed) {
      c.terminal.passed = false;
      c.terminal.detail = "request " + std::to_string(i) + " did not end";
    }
    for (std::size_t p = 0; p < r.logits.size(); ++p) {
      for (float v : r.logits[p]) {
        ++report.logits_scanned;
        if (std::isnan(v) && c.stale.passed) {
          c.stale.passed = false;
          c.stale.detail = "request " + std::to_string(i) + " (tenant " + std::to_string(r.spec.tenant) +
                           ") position " + std::to_string(p) + ": NaN logit, a read of a poisoned (freed) block";
        }
      }
    }
    if (r.finish() != FinishReason::kRejected)
      check_against_reference(oracle, r, tolerance_for(o).value, c.logits, c.greedy, "request " + std::to_string(i));
  }
}

// The event log replayed by the independent replayer; block reuse counted from it.
void check_event_log(const EventLog& log, const AuditOptions& options, CheckResult& replay, AuditReport& report) {
  std::map<int64_t, int64_t> allocs;  // allocations of a block that held state before
  for (const std::string& line : log.lines()) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("ev", "") == "alloc" && j.contains("block") &&
        ++allocs[j["block"].get<int64_t>()] > 1)
      ++report.block_reuses;
  }
  report.event_log_lines = static_cast<int64_t>(log.lines().size());
  const ReplayResult rr = replay_event_log(log.text());
  replay.count = rr.lines;
  if (!rr.ok()) {
    replay.passed = false;
    replay.detail = rr.message;
  } else {
    replay.detail = options.event_log_path.empty() ? "in memory" : "written to " + options.event_log_path;
  }
}

// Both halves of cache isolation: reuse within a tenant, and identical prefixes across
// tenants kept apart; vacuous, and failing unless allowed, when either is missing.
void check_isolation_evidence(const AuditRun& a, const VerifyOptions& o, const AuditOptions& options,
                              CheckResult& evidence, AuditReport& report) {
  if (a.run) collect_isolation_evidence(*a.log, a.engine(), o.block_size, report);
  int64_t within = 0, identical_across = 0;
  for (const auto& [t, n] : report.reuses_within_tenant) within += n;
  for (const auto& [pair, e] : report.tenant_pairs) identical_across += e.identical_prefix_requests;
  evidence.count = within + identical_across;
  std::string missing;
  if (within == 0) missing = "the cache never reused a block within a tenant";
  if (report.tenants >= 2 && !o.global_prefix_sharing && identical_across == 0)
    missing += (missing.empty() ? "" : ", and ") + std::string("no two tenants had an identical prefix");
  // "none shared" is the event log's word, not an assumption: a prefix hit that handed one
  // tenant's block to another fails here too (the invariants and the read checks fail on it
  // first, each in its own way).
  std::string crossed;
  if (!o.global_prefix_sharing)
    for (const auto& [pair, e] : report.tenant_pairs)
      if (e.shared_blocks > 0)
        crossed += (crossed.empty() ? "" : "; ") + std::to_string(e.shared_blocks) + " blocks between tenants " +
                   std::to_string(pair.first) + " and " + std::to_string(pair.second);
  if (!crossed.empty()) {
    evidence.passed = false;
    evidence.detail = "prefix hits shared blocks across tenants: " + crossed;
  } else if (!missing.empty()) {
    evidence.passed = options.allow_empty;
    evidence.detail =
        "isolation not demonstrated: " + missing + (options.allow_empty ? " (allowed by --allow-empty)" : "");
  } else {
    evidence.detail = std::to_string(within) + " prefix-cache hits within a tenant; " +
                      std::to_string(identical_across) + " cross-tenant request pairs with identical prefixes" +
                      (o.global_prefix_sharing ? " (global sharing)" : ", none shared");
  }
}

}  // namespace

Result<AuditReport> run_audit(const Model& model, const Workload& workload_in, const AuditOptions& options) {
  VerifyOptions o = options.engine;
  o.poison_on_free = true;
  o.audit_reads = true;
  Workload workload = workload_in;
  std::set<int64_t> tenants;
  for (WorkloadRequest& r : workload.requests) {
    r.spec.capture_logits = true;
    tenants.insert(r.spec.tenant);
  }
  AuditReport report;
  report.tenants = static_cast<int64_t>(tenants.size());
  AuditChecks c;
  auto a = std::make_unique<AuditRun>();
  KVP_RETURN_IF_ERROR(run_audited(model, o, workload, options, *a, c, report));
  check_outputs(model, o, *a, c, report);
  c.stale.count = report.logits_scanned;
  check_event_log(*a->log, options, c.replay, report);
  check_isolation_evidence(*a, o, options, c.evidence, report);
  // The stream checked by the KV-event auditor, and against the event log it came from.
  const CheckResult kv_stream_check = kv_events::check_engine_stream(
      "kv-event-stream", a->log->events(), a->kv_stream->batches(), options.kv_events_publisher != nullptr);
  report.checks = {c.inv,    c.reads,  c.scope,    c.stale,    c.replay,
                   c.logits, c.greedy, c.terminal, c.evidence, kv_stream_check};
  return report;
}

std::string AuditReport::summary() const {
  std::ostringstream out;
  char line[512];
  for (const CheckResult& c : checks) {
    std::snprintf(line, sizeof line, "%-28s %-5s %10lld  %s\n", c.name.c_str(), c.passed ? "PASS" : "FAIL",
                  static_cast<long long>(c.count), c.detail.c_str());
    out << line;
  }
  std::snprintf(line, sizeof line,
                "covered: %lld tenants, %lld plans, %lld block reads (%lld K/V position reads per layer and head), "
                "%lld distinct blocks, %lld block reuses, %lld prefix-hit tokens, %lld poisoned blocks, "
                "%lld logits scanned, %lld event-log lines\n",
                static_cast<long long>(tenants), static_cast<long long>(plans), static_cast<long long>(block_reads),
                static_cast<long long>(kv_reads), static_cast<long long>(blocks_checked),
                static_cast<long long>(block_reuses), static_cast<long long>(prefix_hit_tokens),
                static_cast<long long>(poisoned_blocks), static_cast<long long>(logits_scanned),
                static_cast<long long>(event_log_lines));
  out << line;
  for (const auto& [tenant, n] : reuses_within_tenant) {
    std::snprintf(line, sizeof line, "tenant %lld: %lld blocks reused from its own requests through the prefix cache\n",
                  static_cast<long long>(tenant), static_cast<long long>(n));
    out << line;
  }
  for (const auto& [pair, e] : tenant_pairs) {
    std::snprintf(line, sizeof line,
                  "tenants %lld and %lld: %lld request pairs with an identical prefix (up to %lld blocks), %lld blocks "
                  "shared between them\n",
                  static_cast<long long>(pair.first), static_cast<long long>(pair.second),
                  static_cast<long long>(e.identical_prefix_requests),
                  static_cast<long long>(e.longest_identical_blocks), static_cast<long long>(e.shared_blocks));
    out << line;
  }
  out << "verdict: " << (passed() ? "PASS" : "FAIL") << "\n";
  return out.str();
}

nlohmann::json AuditReport::to_json() const {
  nlohmann::json j;
  j["passed"] = passed();
  for (const CheckResult& c : checks)
    j["checks"].push_back({{"name", c.name}, {"passed", c.passed}, {"count", c.count}, {"detail", c.detail}});
  j["covered"] = {{"tenants", tenants},
                  {"plans", plans},
                  {"block_reads", block_reads},
                  {"kv_position_reads", kv_reads},
                  {"distinct_blocks", blocks_checked},
                  {"block_reuses", block_reuses},
                  {"prefix_hit_tokens", prefix_hit_tokens},
                  {"poisoned_blocks", poisoned_blocks},
                  {"logits_scanned", logits_scanned},
                  {"event_log_lines", event_log_lines}};
  nlohmann::json within = nlohmann::json::object();
  for (const auto& [t, n] : reuses_within_tenant) within[std::to_string(t)] = n;
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& [p, e] : tenant_pairs)
    pairs.push_back({{"tenants", {p.first, p.second}},
                     {"identical_prefix_requests", e.identical_prefix_requests},
                     {"longest_identical_blocks", e.longest_identical_blocks},
                     {"shared_blocks", e.shared_blocks}});
  j["isolation_evidence"] = {{"reuses_within_tenant", within}, {"tenant_pairs", pairs}};
  return j;
}

Summary AuditReport::to_summary(std::vector<std::string> context, std::string reproducer) const {
  Summary s;
  s.title = "kvproof audit";
  s.passed = passed();
  s.context = std::move(context);
  s.reproducer = std::move(reproducer);
  s.columns = {"count"};
  int64_t failed = 0;
  for (const CheckResult& c : checks) {
    failed += c.passed ? 0 : 1;
    s.rows.push_back({c.name, c.passed ? "PASS" : "FAIL", {std::to_string(c.count)}, c.detail, ""});
  }
  s.verdict_detail = std::to_string(failed) + " of " + std::to_string(checks.size()) + " checks failed";
  s.notes = report_lines_after(summary(), checks.size());  // the coverage and tenant lines
  return s;
}

std::vector<Plot> AuditReport::plots() const {
  Plot within("bar", "Reuse within each tenant (prefix-cache hits from the tenant's own blocks)", "tenant",
              "blocks reused");
  std::set<int64_t> tenant_ids;
  for (const auto& [t, n] : reuses_within_tenant) tenant_ids.insert(t);
  for (const auto& [pair, e] : tenant_pairs) tenant_ids.insert({pair.first, pair.second});
  PlotSeries reused("blocks reused within the tenant");
  for (int64_t t : tenant_ids) {
    within.categories.push_back("tenant " + std::to_string(t));
    const auto it = reuses_within_tenant.find(t);
    reused.y.push_back(static_cast<double>(it == reuses_within_tenant.end() ? 0 : it->second));
  }
  within.series.push_back(std::move(reused));
  within.caption =
      "The half of isolation that shows the cache works: a tenant's requests with a common prefix share its blocks. "
      "No bar at all means the evidence below is vacuous (nothing could have leaked).";
  std::vector<Plot> plots;
  if (!tenant_ids.empty()) plots.push_back(std::move(within));
  if (!tenant_pairs.empty()) {
    Plot across("bar", "Across tenants: identical prefixes and the blocks shared", "tenant pair", "count");
    PlotSeries identical("request pairs with an identical prefix of whole blocks");
    PlotSeries shared("blocks shared through the prefix cache");
    for (const auto& [pair, e] : tenant_pairs) {
      across.categories.push_back(std::to_string(pair.first) + " & " + std::to_string(pair.second));
      identical.y.push_back(static_cast<double>(e.identical_prefix_requests));
      shared.y.push_back(static_cast<double>(e.shared_blocks));
    }
    across.series = {std::move(identical), std::move(shared)};
    across.caption =
        "The half that shows isolation: requests of different tenants with the same prefix, which a shared cache "
        "would have served from one another's blocks. Tenant-scoped, the shared bars stay at 0; with global "
        "sharing they are the reuse allowed.";
    plots.push_back(std::move(across));
  }
  return plots;
}

}  // namespace kvp::verify
