#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "kernel_check/attention_plugin_loader.h"
#include "optimized/engine/workload.h"
#include "optimized/kv/kv_groups.h"
#include "tools/bad_input.h"
#include "tools/commands.h"
#include "tools/kv_events_publish.h"
#include "tools/run_inputs.h"
#include "verify/verify.h"

namespace kvp::tools {

namespace {

struct VerifyFlags {
  RunInputs inputs;
  std::string preemption = "both", admission = "optimistic";
  BackendChoice backend;
  std::string json_out, junit_out, summary_out, html_out, command_line;
  std::string speculate = "off";
  std::string attention_plugin;
  KvEventsPublishOptions publish;
  verify::VerifyOptions v;
};

void add_verify_flags(CLI::App& cmd, VerifyFlags& f) {
  f.inputs.add_options(cmd, "mixed");
  add_pool_options(cmd, f.v);
  cmd.add_option("--chunk", f.v.prefill_chunk_size, "prefill chunk size per request per step")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--max-batched-tokens", f.v.max_num_batched_tokens, "token budget per step")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--max-num-seqs", f.v.max_num_seqs, "running requests at most")->check(CLI::Range(1, 1 << 16));
  cmd.add_option("--max-model-len", f.v.max_model_len, "longest context")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd.add_option("--preemption", f.preemption, "recompute, swap or both (one run each)")
      ->check(CLI::IsMember({"recompute", "swap", "both"}));
  cmd.add_option("--admission", f.admission, "optimistic or conservative")
      ->check(CLI::IsMember({"optimistic", "conservative"}));
  f.backend.add_options(cmd);
  cmd.add_option("--tolerance", f.v.tolerance,
                 "logit tolerance relative to the row's largest reference logit (default: the KV dtype's, printed "
                 "with the logits check)")
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_flag("!--no-prefix-caching", f.v.prefix_caching, "turn the prefix cache off");
  cmd.add_flag("!--no-oracle-reuse", f.v.oracle_memo,
               "run the oracle for every request, even when the same tokens with bitwise-equal engine rows were "
               "already compared");
  cmd.add_flag("--allow-empty", f.v.allow_empty,
               "pass even if nothing was verified (no request finished normally, or a check saw nothing)");
  cmd.add_option("--speculate", f.speculate,
                 "speculative decoding of every request (ngram: prompt lookup; draft: a draft model of the "
                 "model's first layers), checked against plain decoding bitwise")
      ->check(CLI::IsMember({"off", "ngram", "draft"}));
  cmd.add_option("--k", f.v.speculation.k, "draft tokens per step")->check(CLI::Range(1, 64));
  cmd.add_option("--draft-layers", f.v.draft_layers, "layers of the draft model (default: a quarter)")
      ->check(CLI::Range(1, 1 << 10));
  cmd.add_option("--attention-plugin", f.attention_plugin,
                 "the backend's attention from this plug-in, taking the pool's KV dtype in the kvproof layout: a "
                 "host one under cpu and cuda-emu, a CUDA one under cuda (docs/plugins.md)");
  f.publish.add_options(cmd);
  cmd.add_option("--json", f.json_out, "write the report as JSON to this file");
  cmd.add_option("--junit", f.junit_out, "write the report as JUnit XML to this file");
  cmd.add_option(
      "--summary", f.summary_out,
      "append the report as GitHub-flavoured Markdown to this file (a CI job summary: $GITHUB_STEP_SUMMARY)");
  cmd.add_option("--html", f.html_out,
                 "write the report as one self-contained HTML page to this file, with the error against the oracle "
                 "plotted by position and by request");
}

// The flags as VerifyOptions for this model (the plug-in, when given, loaded into `plugin`).
Result<verify::VerifyOptions> options_from(const VerifyFlags& f, const Model& model,
                                           std::unique_ptr<verify::AttentionPlugin>& plugin) {
  verify::VerifyOptions v = f.v;
  KVP_RETURN_IF_ERROR(f.backend.apply(v));
  if (!f.attention_plugin.empty()) {
    auto loaded_plugin = verify::AttentionPlugin::load(f.attention_plugin);
    if (!loaded_plugin) return loaded_plugin.status();
    plugin = std::move(loaded_plugin).value();
    KVP_RETURN_IF_ERROR(check_plugin_for_backend(plugin->descriptor(), backend_name(v.backend),
                                                 plugin_device_for(v.backend), v.kv_dtype));
    v.attention_plugin = &plugin->descriptor();
  }
  v.modes.clear();
  if (f.preemption != "swap") v.modes.push_back(PreemptionMode::kRecompute);
  if (f.preemption != "recompute") v.modes.push_back(PreemptionMode::kSwap);
  v.admission = f.admission == "conservative" ? AdmissionRule::kConservative : AdmissionRule::kOptimistic;
  v.max_model_len = std::min<int64_t>(v.max_model_len, model.config.max_position_embeddings);
  v.speculation.proposer = f.speculate == "ngram"   ? ProposerKind::kNgram
                           : f.speculate == "draft" ? ProposerKind::kDraft
                                                    : ProposerKind::kOff;
  return v;
}

Result<int> run_verify_command(const VerifyFlags& f) {
  auto loaded = f.inputs.load(f.backend.threads);
  if (!loaded) return loaded.status();
  Model& model = loaded->first;
  const Workload& workload = loaded->second;
  std::unique_ptr<verify::AttentionPlugin> plugin;
  auto options = options_from(f, model, plugin);
  if (!options) return options.status();
  verify::VerifyOptions& v = *options;
  auto weights = f.backend.apply_weight_dtype(model, v);
  if (!weights) return weights.status();
  KVP_RETURN_IF_ERROR(f.backend.resolve_scales(f.inputs.source.checkpoint, model, prompts_of(workload), v));
  char context[512];
  std::snprintf(context, sizeof context, "%s, backend %s, KV %s, block size %d, %d blocks + %d host, chunk %d",
                f.inputs.describe(workload).c_str(), backend_name(v.backend), f.backend.kv_dtype.c_str(), v.block_size,
                v.num_blocks, v.num_host_blocks, v.prefill_chunk_size);
  std::printf("kvproof verify: %s\n", context);
  std::printf("%s", verify::kv_groups_line(model.config, v).c_str());
  if (!v.kv_scales_source.empty()) std::printf("fp8 KV scales: %s\n", v.kv_scales_source.c_str());
  if (v.weight_dtype != DType::kF32) std::printf("weights: %s\n", weights->c_str());
  if (plugin) std::printf("attention: plug-in %s (%s)\n", plugin->name().c_str(), plugin->path().c_str());
  if (v.speculation.enabled())
    std::printf("speculative decoding: %s, k = %d, against plain decoding\n", to_string(v.speculation.proposer),
                v.speculation.k);
  auto started = f.publish.start();
  if (!started) return started.status();
  const std::unique_ptr<kv_events::Publisher> publisher = std::move(*started);
  v.kv_events_publisher = publisher.get();
  auto report = verify::run_verify(model, workload, v);
  if (publisher) publisher->serve_replay(1000);  // a late subscriber asks for the start
  if (!report) return report.status();
  std::printf("%s", report->table().c_str());
  if (!f.json_out.empty()) std::ofstream(f.json_out) << report->to_json().dump(2) << "\n";
  if (!f.junit_out.empty()) std::ofstream(f.junit_out) << report->to_junit();
  if (!f.summary_out.empty() || !f.html_out.empty())
    KVP_RETURN_IF_ERROR(verify::write_summary_and_page(
        f.summary_out, f.html_out, report->to_summary({context}, f.command_line), [&] { return report->plots(); }));
  return report->passed() ? kExitOk : kExitCheckFailed;
}

}  // namespace

void add_verify_command(CLI::App& app, int& exit_code, const std::string& command_line) {
  auto flags = std::make_shared<VerifyFlags>();
  flags->command_line = command_line;
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Run a workload through the paged engine and check it against the reference model; exit 1 on any failure");
  add_verify_flags(*cmd, *flags);
  cmd->callback([flags, &exit_code] { set_exit_code("verify", run_verify_command(*flags), exit_code); });
}

}  // namespace kvp::tools
