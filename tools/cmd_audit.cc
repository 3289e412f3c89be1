#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "tools/commands.h"
#include "tools/kv_events_publish.h"
#include "tools/run_inputs.h"
#include "verify/audit.h"
#include "verify/kv_events_audit.h"
#include "verify/kv_events_zmq.h"

namespace kvp::tools {

void add_audit_command(CLI::App& app, int& exit_code) {
  struct Options {
    RunInputs inputs;
    std::string preemption = "recompute", json_out, event_log, kv_events, replay;
    KvEventsPublishOptions publish;
    double duration = 10;
    BackendChoice backend;
    verify::VerifyOptions v;
    bool allow_empty = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "audit",
      "Cache-isolation evidence: poison-on-free, an ownership check of every block read, the event log re-checked "
      "by the independent replayer; exit 1 on any violation");
  opt->inputs.add_options(*cmd, "multi-tenant");
  add_pool_options(*cmd, opt->v);
  opt->backend.add_options(*cmd);
  cmd->add_option("--preemption", opt->preemption, "recompute or swap")->check(CLI::IsMember({"recompute", "swap"}));
  cmd->add_flag("--global-prefix-sharing", opt->v.global_prefix_sharing,
                "share prefixes across tenants (off by default)");
  cmd->add_option("--event-log", opt->event_log, "write the KV-cache event log (JSON lines) to this file");
  cmd->add_option("--json", opt->json_out, "write the report as JSON to this file");
  cmd->add_option(
      "--kv-events", opt->kv_events,
      "instead of running kvproof's engine, audit a recorded vLLM-format KV-event stream (docs/kv-events.md): "
      "sequence gaps, removals of blocks never stored, blocks stored twice, block sizes, namespaces "
      "(cache salt, LoRA), references after AllBlocksCleared, the mirror at the end; a recording FILE, or "
      "tcp://HOST:PORT to subscribe to a live stream");
  cmd->add_option("--replay", opt->replay,
                  "with --kv-events tcp://..: the publisher's replay endpoint, to recover lost batches");
  cmd->add_option("--duration", opt->duration, "with --kv-events tcp://..: seconds to listen (default 10)")
      ->check(CLI::Range(0.01, 86400.0));
  opt->publish.add_options(*cmd);
  cmd->add_flag("--allow-empty", opt->allow_empty,
                "pass even when the isolation evidence is vacuous (no reuse within a tenant, or no identical "
                "prefix across tenants)");
  cmd->callback([opt, &exit_code] {
    auto fail = [&](const std::string& msg) {
      std::fprintf(stderr, "kvproof audit: %s\n", msg.c_str());
      exit_code = kExitBadInput;
    };
    if (!opt->kv_events.empty()) {
      Result<kv_events::KvEventAudit> audit = Status::error("unset");
      if (opt->kv_events.rfind("tcp://", 0) == 0 || opt->kv_events.rfind("ipc://", 0) == 0) {
        kv_events::SubscribeOptions so;
        so.endpoint = opt->kv_events;
        so.replay_endpoint = opt->replay;
        so.duration_s = opt->duration;
        auto sub = kv_events::subscribe(so);
        if (!sub) return fail(sub.status().message());
        audit = kv_events::audit_kv_events(sub->batches, opt->kv_events);
        audit->frames = sub->frames + sub->replayed;
      } else {
        audit = kv_events::audit_recording(opt->kv_events);
      }
      if (!audit) return fail(audit.status().message());
      std::printf("%s", audit->summary().c_str());
      if (!opt->json_out.empty())
        std::ofstream(opt->json_out) << audit->to_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                                     << "\n";
      exit_code = audit->passed() ? kExitOk : kExitCheckFailed;
      return;
    }
    auto loaded = opt->inputs.load();
    if (!loaded) return fail(loaded.status().message());
    const Model& model = loaded->first;
    const Workload& workload = loaded->second;
    verify::AuditOptions a;
    a.engine = opt->v;
    if (Status s = opt->backend.apply(a.engine); !s) return fail(s.message());
    a.engine.modes = {opt->preemption == "swap" ? PreemptionMode::kSwap : PreemptionMode::kRecompute};
    a.engine.max_model_len = std::min<int64_t>(a.engine.max_model_len, model.config.max_position_embeddings);
    a.event_log_path = opt->event_log;
    a.allow_empty = opt->allow_empty;
    std::printf("kvproof audit: %s, backend %s, KV %s, block size %d, %d blocks + %d host, %s sharing, %s\n",
                opt->inputs.describe(workload).c_str(), a.engine.backend.c_str(), opt->backend.kv_dtype.c_str(),
                a.engine.block_size, a.engine.num_blocks, a.engine.num_host_blocks,
                a.engine.global_prefix_sharing ? "global" : "tenant-scoped", opt->preemption.c_str());
    auto started = opt->publish.start();
    if (!started) return fail(started.status().message());
    const std::unique_ptr<kv_events::Publisher> publisher = std::move(*started);
    a.kv_events_publisher = publisher.get();
    auto report = verify::run_audit(model, workload, a);
    if (publisher) publisher->serve_replay(1000);  // a late subscriber asks for the start
    if (!report) return fail(report.status().message());
    std::printf("%s", report->summary().c_str());
    if (!opt->json_out.empty()) std::ofstream(opt->json_out) << report->to_json().dump(2) << "\n";
    exit_code = report->passed() ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace kvp::tools
