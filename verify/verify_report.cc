// VerifyReport's verdict and its forms: the text table, JSON, JUnit and the Markdown summary.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/report.h"
#include "verify/verify.h"

namespace kvp::verify {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

bool VerifyReport::passed() const {
  return std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.passed; }) &&
         (allow_empty || nothing_verified.empty());
}

std::string VerifyReport::table() const {
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "%-34s %-6s %10s %10s  %s\n", "check", "result", "count", "worst", "detail");
  out << line;
  for (const CheckResult& c : checks) {
    // n/a: the workload gave the check nothing to look at (its detail says why); a check
    // that applied and saw nothing is listed under "nothing verified for" and fails the run.
    const char* result = !c.passed ? "FAIL" : !c.applies ? "n/a" : "PASS";
    std::snprintf(line, sizeof line, "%-34s %-6s %10lld %10s  %s\n", c.name.c_str(), result,
                  static_cast<long long>(c.count), c.worst_error > 0 ? fmt(c.worst_error).c_str() : "-",
                  c.detail.c_str());
    out << line;
  }
  for (const auto& [mode, m] : runs) {
    const EngineCounters& k = m.counters;
    std::snprintf(line, sizeof line,
                  "run[%s]: %lld steps, %lld tokens; preemptions %lld, swaps out/in %lld/%lld, copy-on-writes %lld, "
                  "prefix-hit tokens %lld (%.0f%%), cancellations %lld, rejections %lld, poisoned blocks %lld, "
                  "KV utilization %.2f, peak pool %.0f%%\n",
                  mode.c_str(), static_cast<long long>(k.steps), static_cast<long long>(k.scheduled_tokens),
                  static_cast<long long>(k.preemptions), static_cast<long long>(k.swaps_out),
                  static_cast<long long>(k.swaps_in), static_cast<long long>(k.copy_on_writes),
                  static_cast<long long>(k.prefix_hit_tokens), 100 * m.prefix_hit_rate,
                  static_cast<long long>(k.cancellations), static_cast<long long>(k.rejections),
                  static_cast<long long>(k.poisoned_blocks), m.kv_utilization, 100 * k.peak_pool_occupancy);
    out << line;
    if (k.graph_steps > 0) {
      std::snprintf(line, sizeof line, "cuda graphs[%s]: %lld of %lld steps replayed from decode graphs\n",
                    mode.c_str(), static_cast<long long>(k.graph_steps), static_cast<long long>(k.steps));
      out << line;
    }
    if (k.spec_steps > 0) {
      std::snprintf(
          line, sizeof line,
          "speculation[%s]: %lld verification rows, %lld drafts, %lld accepted (%.1f%%), mean accepted length "
          "%.2f, target forwards per generated token %.3f\n",
          mode.c_str(), static_cast<long long>(k.spec_steps), static_cast<long long>(k.spec_proposed),
          static_cast<long long>(k.spec_accepted), 100 * m.acceptance_rate, m.mean_accepted_length,
          m.forwards_per_token);
      out << line;
    }
  }
  if (oracle.sequences_run + oracle.comparisons_reused > 0) {
    out << "oracle: " << oracle.sequences_run << " sequences run (" << oracle.positions_run << " positions, "
        << oracle.positions_restored << " more from the dense caches of shared prefixes), " << oracle.comparisons_reused
        << " comparisons reused (same tokens, bitwise-equal engine rows)\n";
  }
  if (!nothing_verified.empty()) {
    out << "nothing verified for:";
    for (std::size_t i = 0; i < nothing_verified.size(); ++i) out << (i ? ", " : " ") << nothing_verified[i];
    out << (allow_empty ? " (allowed by --allow-empty)\n" : "\n");
  }
  out << "verdict: " << (passed() ? "PASS" : "FAIL") << "\n";
  return out.str();
}

nlohmann::json VerifyReport::to_json() const {
  nlohmann::json j;
  j["passed"] = passed();
  for (const CheckResult& c : checks)
    j["checks"].push_back({{"name", c.name},
                           {"passed", c.passed},
                           {"outcome", !c.passed      ? "failed"
                                       : !c.applies   ? "not applicable"
                                       : c.count == 0 ? "nothing verified"
                                                      : "checked"},
                           {"count", c.count},
                           {"worst_error", c.worst_error},
                           {"detail", c.detail}});
  for (const auto& [mode, m] : runs) j["runs"][mode] = m.to_json();
  j["oracle"] = {{"sequences_run", oracle.sequences_run},
                 {"positions_run", oracle.positions_run},
                 {"positions_restored", oracle.positions_restored},
                 {"comparisons_reused", oracle.comparisons_reused}};
  j["nothing_verified"] = nothing_verified;
  j["allow_empty"] = allow_empty;
  return j;
}

std::string VerifyReport::to_junit() const {
  const bool vacuous = !nothing_verified.empty() && !allow_empty;
  std::string empty_list;
  for (const std::string& n : nothing_verified) empty_list += (empty_list.empty() ? "" : ", ") + n;
  std::vector<JUnitCase> cases;
  cases.push_back({"something-verified",
                   vacuous ? std::optional<std::string>("nothing verified for: " + empty_list) : std::nullopt, ""});
  for (const CheckResult& c : checks)
    cases.push_back({c.name, c.passed ? std::nullopt : std::optional<std::string>(c.detail),
                     "count " + std::to_string(c.count) + ", worst " + fmt(c.worst_error) + "; " + c.detail});
  return junit_xml("kvproof.verify", cases);
}

Summary VerifyReport::to_summary(std::vector<std::string> context, std::string reproducer) const {
  Summary s;
  s.title = "kvproof verify";
  s.passed = passed();
  s.context = std::move(context);
  s.reproducer = std::move(reproducer);
  s.columns = {"count", "worst"};
  int64_t failed = 0;
  for (const CheckResult& c : checks) {
    failed += c.passed ? 0 : 1;
    s.rows.push_back({c.name,
                      !c.passed    ? "FAIL"
                      : !c.applies ? "n/a"
                                   : "PASS",
                      {std::to_string(c.count), c.worst_error > 0 ? fmt(c.worst_error) : "-"},
                      c.detail,
                      ""});
  }
  if (!nothing_verified.empty() && !allow_empty) {
    std::string list;
    for (const std::string& n : nothing_verified) list += (list.empty() ? "" : ", ") + n;
    s.rows.insert(s.rows.begin(), {"something-verified", "FAIL", {"0", "-"}, "nothing verified for: " + list, ""});
  }
  s.verdict_detail = std::to_string(failed) + " of " + std::to_string(checks.size()) + " checks failed" +
                     (!nothing_verified.empty() && !allow_empty ? "; nothing verified for some" : "");
  s.notes = report_lines_after(table(), 1 + checks.size());  // the runs, speculation and oracle lines
  return s;
}

}  // namespace kvp::verify

namespace kvp::verify {

std::vector<Plot> VerifyReport::plots() const {
  Plot by_position("line", "Error against the fp64 oracle, by position", "position in the sequence",
                   "worst |engine - oracle| / max |oracle| of the row", true);
  Plot by_request("scatter", "Error against the fp64 oracle, by request", "request", "its worst relative error", true);
  for (const CheckResult& c : checks) {
    if (c.worst_by_position.empty() && c.worst_by_request.empty()) continue;
    by_position.series.emplace_back(c.name, std::vector<double>{}, c.worst_by_position);
    PlotSeries requests(c.name);
    for (const auto& [label, worst] : c.worst_by_request) {
      // "request 7": plotted at 7; a label without a number at its place in the list.
      const std::size_t digits = label.find_last_not_of("0123456789");
      const std::string number = digits == std::string::npos ? label : label.substr(digits + 1);
      requests.x.push_back(number.empty() ? static_cast<double>(requests.x.size()) : std::stod(number));
      requests.y.push_back(worst);
    }
    by_request.series.push_back(std::move(requests));
  }
  if (by_position.series.empty()) return {};
  for (Plot* p : {&by_position, &by_request}) p->hlines.push_back({tolerance, "tolerance " + fmt(tolerance)});
  by_position.caption =
      "Each position's worst error over the requests compared, one line per preemption mode (modes whose rows are the "
      "same bits draw one line over the other). An error growing with "
      "position points at the cache (a stale or misplaced block, a wrong RoPE position); a line above the "
      "tolerance fails logits-vs-reference.";
  by_request.caption =
      "Each request's worst error over its positions. A request far above the others read state it should not "
      "have (another request's, or a freed block).";
  return {by_position, by_request};
}

}  // namespace kvp::verify
