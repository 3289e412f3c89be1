#include <chrono>
#include <cstdio>
#include <fstream>

#include "golden/golden_reference.h"
#include "tools/bad_input.h"
#include "tools/commands.h"
#include "tools/run_inputs.h"

namespace kvp::tools {

void add_reference_command(CLI::App& app, int& exit_code) {
  struct Options {
    RunInputs inputs;
    std::string out;
    int32_t top_k = 20;
    int threads = 2;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "reference",
      "Write the fp64 oracle's log-probabilities for a workload as a golden file (docs/golden.md), for `kvproof "
      "compare`");
  opt->inputs.add_options(*cmd, "short-chat");
  cmd->add_option("--out", opt->out, "golden JSONL file to write")->required();
  cmd->add_option("--top-k", opt->top_k, "top tokens listed at every position")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--threads", opt->threads, "threads of the oracle (the results do not depend on it)")
      ->check(CLI::Range(1, 256));
  cmd->callback([opt, &exit_code] {
    auto fail = bad_input_reporter("reference", exit_code);
    auto loaded = opt->inputs.load();
    if (!loaded) return fail(loaded.status().message());
    const auto& [model, workload] = *loaded;
    golden::ReferenceOptions ro;
    ro.top_k = opt->top_k;
    ro.threads = opt->threads;
    const ModelSource& s = opt->inputs.source;
    ro.source = !s.checkpoint.empty() ? "checkpoint " + s.checkpoint
                : !s.config.empty()   ? "config " + s.config + " (weight seed " + std::to_string(s.weight_seed) + ")"
                                      : "preset " + s.preset + " (weight seed " + std::to_string(s.weight_seed) + ")";
    const auto start = std::chrono::steady_clock::now();
    auto golden = golden::make_golden(model, workload, ro);
    if (!golden) return fail(golden.status().message());
    std::ofstream out(opt->out);
    out << golden::to_jsonl(*golden);
    out.close();
    if (!out) return fail(opt->out + ": cannot write");
    int64_t positions = 0;
    for (const auto& r : golden->requests) positions += static_cast<int64_t>(r.positions.size());
    std::printf("kvproof reference: %s: %zu requests, %lld positions, top %d, in %.2f s -> %s\n",
                opt->inputs.describe(workload).c_str(), golden->requests.size(), static_cast<long long>(positions),
                golden->header.top_k, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                opt->out.c_str());
    exit_code = kExitOk;
  });
}

}  // namespace kvp::tools
