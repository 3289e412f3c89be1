#include <cstdio>
#include <fstream>

#include "tools/bad_input.h"
#include "tools/commands.h"
#include "verify/attention_plugin_loader.h"
#include "verify/kernel_check.h"

namespace kvp::tools {

void add_kernel_check_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::string plugin, grid = "quick", shard, json_out, junit_out;
    int64_t case_id = -1;
    double timeout_s = 30.0;
    int64_t max_failures = 0;
    bool in_process = false;
    std::vector<std::string> merge;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "kernel-check",
      "Run kvproof's adversarial attention grid on a paged-attention plug-in (docs/plugins.md) against an "
      "fp64 reference; exit 1 when a case fails");
  cmd->add_option("--plugin", opt->plugin, "the plug-in: a shared library exporting kvp_attention_plugin_v1");
  cmd->add_option("--grid", opt->grid, "quick (seconds, CI) or full (every block size and dtype, contexts past 32k)")
      ->check(CLI::IsMember({"quick", "full"}));
  cmd->add_option("--case", opt->case_id, "run only this case of the grid (the reproducer a failure prints)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--shard", opt->shard,
                  "I/N: run the I-th of N disjoint parts of the grid (join the reports with --merge)");
  cmd->add_option("--timeout", opt->timeout_s, "seconds a case may run before it is killed (default 30)")
      ->check(CLI::Range(0.01, 86400.0));
  cmd->add_option("--max-failures", opt->max_failures, "stop after this many failing cases (default 0: run them all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--in-process", opt->in_process,
                "run the cases in this process, not one forked child per case (for a debugger; a crash ends the run)");
  cmd->add_option("--json", opt->json_out, "write the report as JSON to this file");
  cmd->add_option("--junit", opt->junit_out, "write the report as JUnit XML to this file");
  cmd->add_option("--merge", opt->merge, "join these shard JSON reports into one verdict (no --plugin)");
  cmd->callback([opt, &exit_code] {
    auto fail = bad_input_reporter("kernel-check", exit_code);
    namespace kc = verify::kernel_check;
    if (!opt->merge.empty()) {
      if (!opt->plugin.empty()) return fail("--merge joins reports; it takes no --plugin");
      std::vector<nlohmann::json> reports;
      for (const std::string& path : opt->merge) {
        std::ifstream in(path);
        if (!in) return fail(path + ": cannot open");
        try {
          reports.push_back(nlohmann::json::parse(in));
        } catch (const nlohmann::json::exception& e) {
          return fail(path + ": not JSON: " + e.what());
        }
      }
      auto merged = kc::merge_reports(reports);
      if (!merged) return fail(merged.status().message());
      const auto& s = (*merged)["summary"];
      std::printf(
          "kernel-check --merge: %zu reports, %lld cases, %lld passed, %lld failed, %lld skipped\n%s\n", reports.size(),
          static_cast<long long>(s["cases"].get<int64_t>()), static_cast<long long>(s["passed"].get<int64_t>()),
          static_cast<long long>(s["failed"].get<int64_t>()), static_cast<long long>(s["skipped"].get<int64_t>()),
          (*merged)["verdict"] == "pass" ? "PASS" : "FAIL");
      if (!opt->json_out.empty()) std::ofstream(opt->json_out) << merged->dump(2) << "\n";
      exit_code = (*merged)["verdict"] == "pass" ? kExitOk : kExitCheckFailed;
      return;
    }
    if (opt->plugin.empty()) return fail("--plugin is required (or --merge REPORT...)");
    kc::Options options;
    options.grid = opt->grid == "full" ? kc::Grid::kFull : kc::Grid::kQuick;
    if (opt->case_id >= 0) options.case_id = opt->case_id;
    options.timeout_s = opt->timeout_s;
    options.isolate = !opt->in_process;
    options.max_failures = opt->max_failures;
    if (!opt->shard.empty()) {
      int i = -1, n = -1;
      char tail = 0;
      if (std::sscanf(opt->shard.c_str(), "%d/%d%c", &i, &n, &tail) != 2 || n < 1 || i < 0 || i >= n)
        return fail("--shard " + opt->shard + ": want I/N with 0 <= I < N");
      options.shard_index = i;
      options.shard_count = n;
    }
    auto plugin = verify::AttentionPlugin::load(opt->plugin);
    if (!plugin) return fail(plugin.status().message());
    auto report = kc::run_kernel_check(**plugin, options);
    if (!report) return fail(report.status().message());
    std::printf("%s", report->summary().c_str());
    if (!opt->json_out.empty()) std::ofstream(opt->json_out) << report->to_json().dump(2) << "\n";
    if (!opt->junit_out.empty()) std::ofstream(opt->junit_out) << report->to_junit();
    exit_code = report->passed() ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace kvp::tools
