#include <cstdio>
#include <fstream>

#include "golden/golden.h"
#include "tools/bad_input.h"
#include "tools/commands.h"

namespace kvp::tools {

void add_compare_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::string golden, candidate;
    double tolerance = 1e-3;
    std::string json_out, junit_out;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Check a candidate engine's log-probabilities against a golden file (docs/golden.md); exit 1 on a real "
      "divergence");
  cmd->add_option("golden", opt->golden, "golden JSONL file (kvproof reference)")->required();
  cmd->add_option("candidate", opt->candidate, "candidate JSONL file (same schema, role candidate)")->required();
  cmd->add_option("--tolerance", opt->tolerance,
                  "largest |candidate - golden| logprob difference allowed, in nats; also the near-tie margin "
                  "(default 1e-3: fp32 engines; set it for bf16/fp16 ones)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--json", opt->json_out, "write the report as JSON to this file");
  cmd->add_option("--junit", opt->junit_out, "write the report as JUnit XML to this file");
  cmd->callback([opt, &exit_code] {
    auto fail = bad_input_reporter("compare", exit_code);
    auto golden = golden::load_logprob_jsonl(opt->golden);
    if (!golden) return fail(golden.status().message());
    auto candidate = golden::load_logprob_jsonl(opt->candidate);
    if (!candidate) return fail(candidate.status().message());
    auto report = golden::compare_logprobs(*golden, *candidate, opt->tolerance);
    if (!report) return fail(report.status().message());
    std::printf("kvproof compare: %s (%s) against %s (%s)\n", opt->candidate.c_str(),
                candidate->header.producer.c_str(), opt->golden.c_str(),
                golden->header.model.value("source", std::string("?")).c_str());
    std::printf("%s", report->table().c_str());
    if (!opt->json_out.empty()) std::ofstream(opt->json_out) << report->to_json().dump(2) << "\n";
    if (!opt->junit_out.empty()) std::ofstream(opt->junit_out) << report->to_junit();
    exit_code = report->passed() ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace kvp::tools
