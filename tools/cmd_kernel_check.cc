#include <cstdio>
#include <fstream>

#include "kernel_check/attention_plugin_loader.h"
#include "kernel_check/kernel_check.h"
#include "tools/bad_input.h"
#include "tools/commands.h"

namespace kvp::tools {

namespace {

namespace kc = verify::kernel_check;

struct KernelCheckFlags {
  std::string plugin, grid = "quick", shard, json_out, junit_out, summary_out, html_out, command_line;
  int64_t case_id = -1;
  double timeout_s = 30.0;
  int64_t max_failures = 0;
  bool in_process = false;
  std::vector<std::string> merge;
  std::vector<std::string> properties;
};

void add_kernel_check_flags(CLI::App& cmd, KernelCheckFlags& f) {
  cmd.add_option("--plugin", f.plugin,
                 "the plug-in: a shared library exporting kvp_attention_plugin_v2 (or, built for ABI version 1, "
                 "kvp_attention_plugin_v1), or python:FILE.py:FUNCTION / python:MODULE:FUNCTION, a Python kernel "
                 "(docs/plugins.md)");
  cmd.add_option("--grid", f.grid, "quick (seconds, CI) or full (every block size and dtype, contexts past 32k)")
      ->check(CLI::IsMember({"quick", "full"}));
  cmd.add_option("--case", f.case_id, "run only this case of the grid (the reproducer a failure prints)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--shard", f.shard,
                 "I/N: run the I-th of N disjoint parts of the grid (join the reports with --merge)");
  cmd.add_option("--timeout", f.timeout_s, "seconds a case may run before it is killed (default 30)")
      ->check(CLI::Range(0.01, 86400.0));
  cmd.add_option("--max-failures", f.max_failures, "stop after this many failing cases (default 0: run them all)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--properties", f.properties,
                 "the properties a case must hold to pass, comma-separated (default: all); the others are still "
                 "measured and reported as not required. run-error, crash and timeout always gate. Properties: "
                 "accuracy, no-poison-leak, finite-output, guard-zones, inputs-unchanged, batch-invariance, "
                 "repeatability, run-error, crash, timeout")
      ->delimiter(',');
  cmd.add_flag("--in-process", f.in_process,
               "run the cases in this process, not in a forked worker process (for a debugger; a crash ends the run)");
  cmd.add_option("--json", f.json_out, "write the report as JSON to this file");
  cmd.add_option("--junit", f.junit_out, "write the report as JUnit XML to this file");
  cmd.add_option(
      "--summary", f.summary_out,
      "append the report as GitHub-flavoured Markdown to this file (a CI job summary: $GITHUB_STEP_SUMMARY)");
  cmd.add_option("--html", f.html_out,
                 "write the report as one self-contained HTML page to this file, with each case's error and the "
                 "failing cases per property plotted");
  cmd.add_option("--merge", f.merge, "join these shard JSON reports into one verdict (no --plugin)");
}

// --merge: the shards' JSON reports joined into one verdict.
Result<int> merge_shards(const KernelCheckFlags& f) {
  if (!f.plugin.empty()) return Status::error("--merge joins reports; it takes no --plugin");
  if (!f.summary_out.empty())
    return Status::error("--summary is written by each shard's run, not by --merge (it has no cases to list)");
  if (!f.html_out.empty())
    return Status::error("--html is written by each shard's run, not by --merge (it has no cases to plot)");
  std::vector<nlohmann::json> reports;
  for (const std::string& path : f.merge) {
    std::ifstream in(path);
    if (!in) return Status::error(path + ": cannot open");
    try {
      reports.push_back(nlohmann::json::parse(in));
    } catch (const nlohmann::json::exception& e) {
      return Status::error(path + ": not JSON: " + e.what());
    }
  }
  auto merged = kc::merge_reports(reports);
  if (!merged) return merged.status();
  const auto& s = (*merged)["summary"];
  std::printf("kernel-check --merge: %zu reports, %lld cases, %lld passed, %lld failed, %lld skipped\n%s\n",
              reports.size(), static_cast<long long>(s["cases"].get<int64_t>()),
              static_cast<long long>(s["passed"].get<int64_t>()), static_cast<long long>(s["failed"].get<int64_t>()),
              static_cast<long long>(s["skipped"].get<int64_t>()), (*merged)["verdict"] == "pass" ? "PASS" : "FAIL");
  if (!f.json_out.empty()) std::ofstream(f.json_out) << merged->dump(2) << "\n";
  return (*merged)["verdict"] == "pass" ? kExitOk : kExitCheckFailed;
}

Result<kc::Options> options_from(const KernelCheckFlags& f) {
  kc::Options options;
  options.grid = f.grid == "full" ? kc::Grid::kFull : kc::Grid::kQuick;
  KVP_RETURN_IF_ERROR(kc::check_property_names(f.properties));
  options.required_properties = f.properties;
  if (f.case_id >= 0) options.case_id = f.case_id;
  options.timeout_s = f.timeout_s;
  options.isolate = !f.in_process;
  options.max_failures = f.max_failures;
  if (!f.shard.empty()) {
    int i = -1, n = -1;
    char tail = 0;
    if (std::sscanf(f.shard.c_str(), "%d/%d%c", &i, &n, &tail) != 2 || n < 1 || i < 0 || i >= n)
      return Status::error("--shard " + f.shard + ": want I/N with 0 <= I < N");
    options.shard_index = i;
    options.shard_count = n;
  }
  return options;
}

Result<int> run_kernel_check_command(const KernelCheckFlags& f) {
  if (!f.merge.empty()) return merge_shards(f);
  if (f.plugin.empty()) return Status::error("--plugin is required (or --merge REPORT...)");
  auto options = options_from(f);
  if (!options) return options.status();
  auto plugin = verify::AttentionPlugin::load(f.plugin);
  if (!plugin) return plugin.status();
  auto report = kc::run_kernel_check(**plugin, *options);
  if (!report) return report.status();
  std::printf("%s", report->summary().c_str());
  if (!f.json_out.empty()) std::ofstream(f.json_out) << report->to_json().dump(2) << "\n";
  if (!f.junit_out.empty()) std::ofstream(f.junit_out) << report->to_junit();
  if (!f.summary_out.empty() || !f.html_out.empty())
    KVP_RETURN_IF_ERROR(verify::write_summary_and_page(f.summary_out, f.html_out, report->to_summary(f.command_line),
                                                       [&] { return report->plots(); }));
  return report->passed() ? kExitOk : kExitCheckFailed;
}

}  // namespace

void add_kernel_check_command(CLI::App& app, int& exit_code, const std::string& command_line) {
  auto flags = std::make_shared<KernelCheckFlags>();
  flags->command_line = command_line;
  CLI::App* cmd = app.add_subcommand(
      "kernel-check",
      "Run kvproof's adversarial attention grid on a paged-attention plug-in (docs/plugins.md) against an "
      "fp64 reference; exit 1 when a case fails");
  add_kernel_check_flags(*cmd, *flags);
  cmd->callback([flags, &exit_code] { set_exit_code("kernel-check", run_kernel_check_command(*flags), exit_code); });
}

}  // namespace kvp::tools
