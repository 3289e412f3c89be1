#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "optimized/engine/workload.h"
#include "tools/commands.h"
#include "tools/kv_events_publish.h"
#include "tools/run_inputs.h"
#include "verify/attention_plugin_loader.h"
#include "verify/verify.h"

namespace kvp::tools {

void add_verify_command(CLI::App& app, int& exit_code) {
  struct Options {
    RunInputs inputs;
    std::string preemption = "both", admission = "optimistic";
    BackendChoice backend;
    std::string json_out, junit_out;
    std::string speculate = "off";
    std::string attention_plugin;
    KvEventsPublishOptions publish;
    verify::VerifyOptions v;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Run a workload through the paged engine and check it against the reference model; exit 1 on any failure");
  opt->inputs.add_options(*cmd, "mixed");
  add_pool_options(*cmd, opt->v);
  cmd->add_option("--chunk", opt->v.prefill_chunk_size, "prefill chunk size per request per step")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-batched-tokens", opt->v.max_num_batched_tokens, "token budget per step")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-num-seqs", opt->v.max_num_seqs, "running requests at most")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--max-model-len", opt->v.max_model_len, "longest context")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--preemption", opt->preemption, "recompute, swap or both (one run each)")
      ->check(CLI::IsMember({"recompute", "swap", "both"}));
  cmd->add_option("--admission", opt->admission, "optimistic or conservative")
      ->check(CLI::IsMember({"optimistic", "conservative"}));
  opt->backend.add_options(*cmd);
  cmd->add_option("--tolerance", opt->v.tolerance,
                  "logit tolerance relative to the row's largest reference logit (default: the KV dtype's, printed "
                  "with the logits check)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("!--no-prefix-caching", opt->v.prefix_caching, "turn the prefix cache off");
  cmd->add_flag("!--no-oracle-reuse", opt->v.oracle_memo,
                "run the oracle for every request, even when the same tokens with bitwise-equal engine rows were "
                "already compared");
  cmd->add_flag("--allow-empty", opt->v.allow_empty,
                "pass even if nothing was verified (no request finished normally, or a check saw nothing)");
  cmd->add_option("--speculate", opt->speculate,
                  "speculative decoding of every request (ngram: prompt lookup; draft: a draft model of the "
                  "model's first layers), checked against plain decoding bitwise")
      ->check(CLI::IsMember({"off", "ngram", "draft"}));
  cmd->add_option("--k", opt->v.speculation.k, "draft tokens per step")->check(CLI::Range(1, 64));
  cmd->add_option("--draft-layers", opt->v.draft_layers, "layers of the draft model (default: a quarter)")
      ->check(CLI::Range(1, 1 << 10));
  cmd->add_option("--attention-plugin", opt->attention_plugin,
                  "the cpu backend's attention from this plug-in (a host one taking f32 KV in the kvproof layout; "
                  "docs/plugins.md)");
  opt->publish.add_options(*cmd);
  cmd->add_option("--json", opt->json_out, "write the report as JSON to this file");
  cmd->add_option("--junit", opt->junit_out, "write the report as JUnit XML to this file");
  cmd->callback([opt, &exit_code] {
    auto fail = [&](const std::string& msg) {
      std::fprintf(stderr, "kvproof verify: %s\n", msg.c_str());
      exit_code = kExitBadInput;
    };
    auto loaded = opt->inputs.load();
    if (!loaded) return fail(loaded.status().message());
    const Model& model = loaded->first;
    const Workload& workload = loaded->second;
    verify::VerifyOptions v = opt->v;
    if (Status s = opt->backend.apply(v); !s) return fail(s.message());
    std::unique_ptr<verify::AttentionPlugin> plugin;
    if (!opt->attention_plugin.empty()) {
      auto loaded_plugin = verify::AttentionPlugin::load(opt->attention_plugin);
      if (!loaded_plugin) return fail(loaded_plugin.status().message());
      plugin = std::move(loaded_plugin).value();
      if (Status s = check_plugin_for_cpu_backend(plugin->descriptor()); !s) return fail(s.message());
      v.attention_plugin = &plugin->descriptor();
    }
    v.modes.clear();
    if (opt->preemption != "swap") v.modes.push_back(PreemptionMode::kRecompute);
    if (opt->preemption != "recompute") v.modes.push_back(PreemptionMode::kSwap);
    v.admission = opt->admission == "conservative" ? AdmissionRule::kConservative : AdmissionRule::kOptimistic;
    v.max_model_len = std::min<int64_t>(v.max_model_len, model.config.max_position_embeddings);
    v.speculation.proposer = opt->speculate == "ngram"   ? ProposerKind::kNgram
                             : opt->speculate == "draft" ? ProposerKind::kDraft
                                                         : ProposerKind::kOff;

    std::printf("kvproof verify: %s, backend %s, KV %s, block size %d, %d blocks + %d host, chunk %d\n",
                opt->inputs.describe(workload).c_str(), v.backend.c_str(), opt->backend.kv_dtype.c_str(), v.block_size,
                v.num_blocks, v.num_host_blocks, v.prefill_chunk_size);
    if (plugin) std::printf("attention: plug-in %s (%s)\n", plugin->name().c_str(), plugin->path().c_str());
    if (v.speculation.enabled())
      std::printf("speculative decoding: %s, k = %d, against plain decoding\n", to_string(v.speculation.proposer),
                  v.speculation.k);
    auto started = opt->publish.start();
    if (!started) return fail(started.status().message());
    const std::unique_ptr<kv_events::Publisher> publisher = std::move(*started);
    v.kv_events_publisher = publisher.get();
    auto report = verify::run_verify(model, workload, v);
    if (publisher) publisher->serve_replay(1000);  // a late subscriber asks for the start
    if (!report) return fail(report.status().message());
    std::printf("%s", report->table().c_str());
    if (!opt->json_out.empty()) {
      std::ofstream(opt->json_out) << report->to_json().dump(2) << "\n";
    }
    if (!opt->junit_out.empty()) {
      std::ofstream(opt->junit_out) << report->to_junit();
    }
    exit_code = report->passed() ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace kvp::tools
