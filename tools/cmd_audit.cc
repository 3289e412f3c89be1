#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tools/audit.h"
#include "tools/commands.h"
#include "tools/model_source.h"

namespace kvp::tools {

void add_audit_command(CLI::App& app, int& exit_code) {
  struct Options {
    ModelSource source;
    std::string workload_file, shape = "multi-tenant", preemption = "recompute", json_out, event_log;
    uint64_t seed = 0;
    VerifyOptions v;
  };
  auto opt = std::make_shared<Options>();
  opt->source.preset = "tiny";
  CLI::App* cmd = app.add_subcommand("audit",
      "Cache-isolation evidence: poison-on-free, an ownership check of every block read, the event log re-checked "
      "by the independent replayer; exit 1 on any violation");
  cmd->add_option("--preset", opt->source.preset, "built-in model (default tiny)");
  cmd->add_option("--checkpoint", opt->source.checkpoint, "Hugging Face checkpoint directory (instead of --preset)");
  cmd->add_option("--workload", opt->workload_file, "JSON workload file (instead of --shape)");
  cmd->add_option("--shape", opt->shape, "built-in traffic shape (default multi-tenant)");
  cmd->add_option("--seed", opt->seed, "seed of the workload's generated tokens");
  cmd->add_option("--block-size", opt->v.block_size, "tokens per KV block")->check(CLI::Range(1, 1024));
  cmd->add_option("--num-blocks", opt->v.num_blocks, "device KV blocks")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--host-blocks", opt->v.num_host_blocks, "host (swap) KV blocks")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--preemption", opt->preemption, "recompute or swap")->check(CLI::IsMember({"recompute", "swap"}));
  cmd->add_flag("--global-prefix-sharing", opt->v.global_prefix_sharing, "share prefixes across tenants (off by default)");
  cmd->add_option("--event-log", opt->event_log, "write the KV-cache event log (JSON lines) to this file");
  cmd->add_option("--json", opt->json_out, "write the report as JSON to this file");
  cmd->callback([opt, &exit_code] {
    auto fail = [&](const std::string& msg) {
      std::fprintf(stderr, "kvproof audit: %s\n", msg.c_str());
      exit_code = kExitBadInput;
    };
    ModelSource source = opt->source;
    if (!source.checkpoint.empty()) source.preset.clear();
    auto model = source.load();
    if (!model) return fail(model.status().message());
    auto workload = opt->workload_file.empty() ? builtin_workload(opt->shape, model->config.vocab_size, opt->seed)
                                               : load_workload(opt->workload_file, model->config.vocab_size, opt->seed);
    if (!workload) return fail(workload.status().message());
    AuditOptions a;
    a.engine = opt->v;
    a.engine.modes = {opt->preemption == "swap" ? PreemptionMode::kSwap : PreemptionMode::kRecompute};
    a.engine.max_model_len = std::min<int64_t>(a.engine.max_model_len, model->config.max_position_embeddings);
    a.event_log_path = opt->event_log;
    std::printf("kvproof audit: %s, workload %s (%zu requests), block size %d, %d blocks + %d host, %s sharing, %s\n",
                source.describe().c_str(), workload->name.c_str(), workload->requests.size(), a.engine.block_size,
                a.engine.num_blocks, a.engine.num_host_blocks, a.engine.global_prefix_sharing ? "global" : "tenant-scoped",
                opt->preemption.c_str());
    auto report = run_audit(*model, *workload, a);
    if (!report) return fail(report.status().message());
    std::printf("%s", report->summary().c_str());
    if (!opt->json_out.empty()) std::ofstream(opt->json_out) << report->to_json().dump(2) << "\n";
    exit_code = report->passed() ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace kvp::tools
