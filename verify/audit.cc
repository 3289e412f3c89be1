#include "verify/audit.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/kv_index.h"
#include "optimized/checkers/engine_invariants.h"
#include "optimized/checkers/event_log_replay.h"
#include "optimized/checkers/invariants.h"
#include "optimized/kv/event_log.h"

namespace kvp::verify {

bool AuditReport::passed() const {
  for (const CheckResult& c : checks)
    if (!c.passed) return false;
  return true;
}

Result<AuditReport> run_audit(const Model& model, const Workload& workload_in, const AuditOptions& options) {
  VerifyOptions o = options.engine;
  o.poison_on_free = true;
  o.audit_reads = true;
  const PreemptionMode mode = o.modes.empty() ? PreemptionMode::kRecompute : o.modes.front();
  Workload workload = workload_in;
  std::set<int64_t> tenants;
  for (WorkloadRequest& r : workload.requests) {
    r.spec.capture_logits = true;
    tenants.insert(r.spec.tenant);
  }

  AuditReport report;
  report.tenants = static_cast<int64_t>(tenants.size());
  CheckResult inv("invariants-every-step"), reads("ownership-of-every-read"), scope("backend-read-scope"),
      stale("no-stale-read (NaN scan)"), replay("event-log-replay"), logits("logits-vs-reference"),
      greedy("greedy-tokens"), terminal("terminal-states");

  auto live = make_engine(model, o, {o.block_size, o.num_blocks, o.num_host_blocks, o.prefill_chunk_size, mode});
  if (!live) return live.status();
  Engine& engine = *live->engine;
  std::ofstream log_file;
  if (!options.event_log_path.empty()) {
    log_file.open(options.event_log_path, std::ios::trunc);
    if (!log_file) return Status::error(options.event_log_path + ": cannot open for writing");
  }
  EventLog log(options.event_log_path.empty() ? nullptr : &log_file);
  engine.kv_mutable().set_event_log(&log);
  std::set<int32_t> seen;
  engine.set_plan_observer([&](const Engine& e, const BatchPlan& plan) -> Status {
    ++report.plans;
    ++reads.count;
    PlanReadStats stats;
    if (Status s = kvp::check_plan(e, plan, &stats); !s) {
      CheckResult& blamed = s.message().find("I4:") != std::string::npos ? reads : inv;
      blamed.passed = false;
      blamed.detail = s.message();
      return s;
    }
    report.block_reads += stats.block_reads;
    report.kv_reads += stats.kv_position_reads;
    seen.insert(stats.blocks.begin(), stats.blocks.end());
    return Status::ok();
  });
  engine.set_step_observer([&](const Engine& e, const BatchPlan& plan) { return check_state(e, plan, inv); });

  auto run = run_workload(engine, workload, o.max_steps);
  scope.count = live->backend->audited_block_reads();
  if (!run && inv.passed && reads.passed) {
    CheckResult& blamed = run.status().message().find("audit:") != std::string::npos ? scope : inv;
    blamed.passed = false;
    blamed.detail = "engine run failed: " + run.status().message();
  }
  report.blocks_checked = static_cast<int64_t>(seen.size());
  const EngineMetrics metrics = engine.metrics();
  report.prefix_hit_tokens = metrics.counters.prefix_hit_tokens;
  report.poisoned_blocks = metrics.counters.poisoned_blocks;

  const ReferenceModel<double> oracle(model);
  for (const auto& [i, owned] : engine.requests()) {
    if (!run) break;
    const Request& r = *owned;
    ++terminal.count;
    if (!r.finished() && terminal.passed) {
      terminal.passed = false;
      terminal.detail = "request " + std::to_string(i) + " did not end";
    }
    for (std::size_t p = 0; p < r.logits.size(); ++p) {
      for (float v : r.logits[p]) {
        ++report.logits_scanned;
        if (std::isnan(v) && stale.passed) {
          stale.passed = false;
          stale.detail = "request " + std::to_string(i) + " (tenant " + std::to_string(r.spec.tenant) + ") position " +
                         std::to_string(p) + ": NaN logit, a read of a poisoned (freed) block";
        }
      }
    }
    if (r.finish != FinishReason::kRejected)
      check_against_reference(oracle, r, tolerance_for(o).value, logits, greedy, "request " + std::to_string(i));
  }
  stale.count = report.logits_scanned;

  // Block reuse: allocations of a block that held state before.
  std::map<int64_t, int64_t> allocs;
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
  report.checks = {inv, reads, scope, stale, replay, logits, greedy, terminal};
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
  out << line << "verdict: " << (passed() ? "PASS" : "FAIL") << "\n";
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
  return j;
}

}  // namespace kvp::verify
