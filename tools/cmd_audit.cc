#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "audit/audit.h"
#include "audit/kv_events/kv_events_audit.h"
#include "audit/kv_events/kv_events_zmq.h"
#include "tools/bad_input.h"
#include "tools/commands.h"
#include "tools/kv_events_publish.h"
#include "tools/run_inputs.h"

namespace kvp::tools {

namespace {

struct AuditFlags {
  RunInputs inputs;
  std::string preemption = "recompute", json_out, event_log, kv_events, replay, summary_out, html_out, command_line;
  KvEventsPublishOptions publish;
  double duration = 10;
  BackendChoice backend;
  verify::VerifyOptions v;
  bool allow_empty = false;
};

void add_audit_flags(CLI::App& cmd, AuditFlags& f) {
  f.inputs.add_options(cmd, "multi-tenant");
  add_pool_options(cmd, f.v);
  f.backend.add_options(cmd);
  cmd.add_option("--preemption", f.preemption, "recompute or swap")->check(CLI::IsMember({"recompute", "swap"}));
  cmd.add_flag("--global-prefix-sharing", f.v.global_prefix_sharing, "share prefixes across tenants (off by default)");
  cmd.add_option("--event-log", f.event_log, "write the KV-cache event log (JSON lines) to this file");
  cmd.add_option("--json", f.json_out, "write the report as JSON to this file");
  cmd.add_option(
      "--summary", f.summary_out,
      "append the report as GitHub-flavoured Markdown to this file (a CI job summary: $GITHUB_STEP_SUMMARY)");
  cmd.add_option("--html", f.html_out,
                 "write the report as one self-contained HTML page to this file, with the isolation evidence plotted "
                 "(reuse within and across tenants; for --kv-events, the violations per checker and the blocks held "
                 "per namespace)");
  cmd.add_option("--kv-events", f.kv_events,
                 "instead of running kvproof's engine, audit a recorded vLLM-format KV-event stream "
                 "(docs/kv-events.md): sequence gaps, removals of blocks never stored, blocks stored twice, block "
                 "sizes, namespaces (cache salt, LoRA), references after AllBlocksCleared, the mirror at the end; a "
                 "recording FILE, or tcp://HOST:PORT to subscribe to a live stream");
  cmd.add_option("--replay", f.replay,
                 "with --kv-events tcp://..: the publisher's replay endpoint, to recover lost batches");
  cmd.add_option("--duration", f.duration, "with --kv-events tcp://..: seconds to listen (default 10)")
      ->check(CLI::Range(0.01, 86400.0));
  f.publish.add_options(cmd);
  cmd.add_flag("--allow-empty", f.allow_empty,
               "pass even when the isolation evidence is vacuous (no reuse within a tenant, or no identical "
               "prefix across tenants)");
}

// --kv-events: another engine's stream, recorded or live, through the KV-event auditor.
Result<int> audit_stream(const AuditFlags& f) {
  Result<kv_events::KvEventAudit> audit = Status::error("unset");
  if (f.kv_events.rfind("tcp://", 0) == 0 || f.kv_events.rfind("ipc://", 0) == 0) {
    kv_events::SubscribeOptions so;
    so.endpoint = f.kv_events;
    so.replay_endpoint = f.replay;
    so.duration_s = f.duration;
    auto sub = kv_events::subscribe(so);
    if (!sub) return sub.status();
    audit = kv_events::audit_kv_events(sub->batches, f.kv_events);
    audit->frames = sub->frames + sub->replayed;
  } else {
    audit = kv_events::audit_recording(f.kv_events);
  }
  if (!audit) return audit.status();
  std::printf("%s", audit->summary().c_str());
  if (!f.json_out.empty())
    std::ofstream(f.json_out) << audit->to_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (!f.summary_out.empty() || !f.html_out.empty())
    KVP_RETURN_IF_ERROR(verify::write_summary_and_page(f.summary_out, f.html_out, audit->to_summary(f.command_line),
                                                       [&] { return audit->plots(); }));
  return audit->passed() ? kExitOk : kExitCheckFailed;
}

// kvproof's own engine, audited.
Result<int> audit_engine(const AuditFlags& f) {
  auto loaded = f.inputs.load(f.backend.threads);
  if (!loaded) return loaded.status();
  Model& model = loaded->first;
  const Workload& workload = loaded->second;
  verify::AuditOptions a;
  a.engine = f.v;
  KVP_RETURN_IF_ERROR(f.backend.apply(a.engine));
  auto weights = f.backend.apply_weight_dtype(model, a.engine);
  if (!weights) return weights.status();
  KVP_RETURN_IF_ERROR(f.backend.resolve_scales(f.inputs.source.checkpoint, model, prompts_of(workload), a.engine));
  a.engine.modes = {f.preemption == "swap" ? PreemptionMode::kSwap : PreemptionMode::kRecompute};
  a.engine.max_model_len = std::min<int64_t>(a.engine.max_model_len, model.config.max_position_embeddings);
  a.event_log_path = f.event_log;
  a.allow_empty = f.allow_empty;
  char context[512];
  std::snprintf(context, sizeof context, "%s, backend %s, KV %s, block size %d, %d blocks + %d host, %s sharing, %s",
                f.inputs.describe(workload).c_str(), backend_name(a.engine.backend), f.backend.kv_dtype.c_str(),
                a.engine.block_size, a.engine.num_blocks, a.engine.num_host_blocks,
                a.engine.global_prefix_sharing ? "global" : "tenant-scoped", f.preemption.c_str());
  std::printf("kvproof audit: %s\n", context);
  std::printf("%s", verify::kv_groups_line(model.config, a.engine).c_str());
  if (!a.engine.kv_scales_source.empty()) std::printf("fp8 KV scales: %s\n", a.engine.kv_scales_source.c_str());
  if (a.engine.weight_dtype != DType::kF32) std::printf("weights: %s\n", weights->c_str());
  auto started = f.publish.start();
  if (!started) return started.status();
  const std::unique_ptr<kv_events::Publisher> publisher = std::move(*started);
  a.kv_events_publisher = publisher.get();
  auto report = verify::run_audit(model, workload, a);
  if (publisher) publisher->serve_replay(1000);  // a late subscriber asks for the start
  if (!report) return report.status();
  std::printf("%s", report->summary().c_str());
  if (!f.json_out.empty()) std::ofstream(f.json_out) << report->to_json().dump(2) << "\n";
  if (!f.summary_out.empty() || !f.html_out.empty())
    KVP_RETURN_IF_ERROR(verify::write_summary_and_page(
        f.summary_out, f.html_out, report->to_summary({context}, f.command_line), [&] { return report->plots(); }));
  return report->passed() ? kExitOk : kExitCheckFailed;
}

}  // namespace

void add_audit_command(CLI::App& app, int& exit_code, const std::string& command_line) {
  auto flags = std::make_shared<AuditFlags>();
  flags->command_line = command_line;
  CLI::App* cmd = app.add_subcommand(
      "audit",
      "Cache-isolation evidence: poison-on-free, an ownership check of every block read, the event log re-checked "
      "by the independent replayer; exit 1 on any violation");
  add_audit_flags(*cmd, *flags);
  cmd->callback([flags, &exit_code] {
    set_exit_code("audit", flags->kv_events.empty() ? audit_engine(*flags) : audit_stream(*flags), exit_code);
  });
}

}  // namespace kvp::tools
