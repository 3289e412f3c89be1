// kvproof simulate: capacity questions answered by the engine's own scheduler and KV-cache
// manager on the cost-model backend (simulate/simulate.h). Flags -> options -> runs ->
// table, JSON, CSV. Exit 0: ran; 2: bad flags, traffic or settings, or a run failed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/html_report.h"
#include "simulate/report.h"
#include "simulate/simulate.h"
#include "tools/bad_input.h"
#include "tools/commands.h"

#ifndef KVPROOF_SHARED_TRACES_DIR
#define KVPROOF_SHARED_TRACES_DIR "../shared/traces"
#endif

namespace kvp::tools {

namespace {

// A progress bar on stderr, drawn only on a terminal and only once a run has taken a second.
class ProgressBar {
 public:
  explicit ProgressBar(std::string title) : title_(std::move(title)), tty_(isatty(fileno(stderr)) != 0) {}
  void update(double fraction) {
    if (!tty_) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (elapsed < 1.0 && fraction < 1.0) return;
    if (elapsed < 1.0 && !drawn_) return;
    const int width = 40;
    const int filled = static_cast<int>(fraction * width);
    std::fprintf(stderr, "\r%s [%s%s] %3.0f%% %.1f s", title_.c_str(),
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), '.').c_str(), 100 * fraction, elapsed);
    drawn_ = true;
  }
  ~ProgressBar() {
    if (drawn_) std::fprintf(stderr, "\n");
  }

 private:
  std::string title_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

}  // namespace

namespace {

// The command's flags as given; settings_from turns the named ones into SimOptions.
struct SimulateFlags {
  sim::SimOptions sim;
  std::string trace, shape, policy = "paged", admission = "optimistic", preemption = "recompute";
  std::string prefix_sharing = "on";
  std::string kv_dtype = "bf16";
  double speed = 1, duration = 0;
  int64_t num_requests = 0;
  std::string json_path, csv_path, summary_path, html_path, command_line;
  std::vector<std::string> sweep;
};

void add_simulate_flags(CLI::App* cmd, SimulateFlags& f) {
  cmd->add_option("--model", f.sim.model,
                  "llama-2-7b, llama-2-13b, llama-3-8b, mistral-7b, qwen2.5-7b, gemma-3-1b, gemma-3-27b")
      ->capture_default_str();
  cmd->add_option("--gpu", f.sim.gpu, "a100-40gb, a100-80gb, h100-80gb, h200-141gb")->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", f.sim.gpu_memory_utilization, "share of GPU memory the engine uses")
      ->capture_default_str();
  cmd->add_option("--trace", f.trace,
                  "trace file: .csv (Azure LLM 2023: TIMESTAMP,ContextTokens,GeneratedTokens) or .jsonl; default: "
                  "the Azure conversation trace in ../shared/traces when present");
  cmd->add_option("--shape", f.shape, "built-in synthetic traffic: chat, long-docs, shared-prefix, bursty, max-len");
  cmd->add_option("--requests", f.num_requests, "at most this many requests (a shape: how many to generate)");
  cmd->add_option("--duration", f.duration, "only requests arriving in the first SECONDS (after --speed/--rate)");
  cmd->add_option("--speed", f.speed, "replay speed factor (2 = arrivals twice as fast)")->capture_default_str();
  cmd->add_option("--rate", f.sim.rate, "rescale arrivals to this many requests/s (0: as recorded)");
  cmd->add_option("--policy", f.policy, "paged, contiguous-max, contiguous-pow2, contiguous-oracle")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", f.kv_dtype,
                  "KV cache element type: bf16, f16, f32, fp8-e4m3, fp8-e5m2 (bytes per token; what fp8 costs in "
                  "accuracy, kvproof verify --kv-dtype measures)")
      ->capture_default_str();
  cmd->add_option("--block-size", f.sim.block_size, "tokens per KV block (paged)")->capture_default_str();
  cmd->add_option("--admission", f.admission, "optimistic or conservative")->capture_default_str();
  cmd->add_option("--preemption", f.preemption, "recompute or swap")->capture_default_str();
  cmd->add_option("--max-model-len", f.sim.max_model_len, "maximum context (0: the model's)")->capture_default_str();
  cmd->add_option("--max-num-seqs", f.sim.max_num_seqs, "running sequences at most")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f.sim.max_num_batched_tokens, "tokens per step at most")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", f.sim.prefill_chunk_size, "prompt tokens per request per step at most")
      ->capture_default_str();
  cmd->add_option("--prefix-sharing", f.prefix_sharing, "on or off (prefix cache)")->capture_default_str();
  cmd->add_option("--n", f.sim.n, "parallel samples per request (paged policy)")->capture_default_str();
  cmd->add_option("--ttft-slo", f.sim.ttft_slo_s, "time-to-first-token target, seconds")->capture_default_str();
  cmd->add_option("--tpot-slo", f.sim.tpot_slo_s, "time-per-output-token target, seconds")->capture_default_str();
  cmd->add_option("--sample-interval", f.sim.sample_interval_s, "memory and queue samples every SECONDS simulated")
      ->capture_default_str();
  cmd->add_option("--seed", f.sim.seed, "seed of synthetic traffic and prompt token ids")->capture_default_str();
  cmd->add_flag("--check", f.sim.check,
                "run every invariant checker after every step and recount every memory sample (slow)");
  cmd->add_option("--json", f.json_path, "write every run (with timeline and latencies) as JSON");
  cmd->add_option("--summary", f.summary_path,
                  "append the runs' table as GitHub-flavoured Markdown to this file (a CI job summary: "
                  "$GITHUB_STEP_SUMMARY)");
  cmd->add_option("--html", f.html_path,
                  "write the runs as one self-contained HTML page to this file, with the memory and queue timelines "
                  "and the TTFT distribution plotted");
  cmd->add_option("--csv", f.csv_path, "write one CSV row per run");
  cmd->add_option("--sweep", f.sweep,
                  "key=v1,v2,... (repeatable): block-size, admission, preemption, max-model-len, rate, policy, "
                  "prefix-sharing, max-num-seqs, n, gpu, model; one run per combination");
}

// The named settings (policy, admission, ...) applied as a sweep would apply them.
Result<sim::SimOptions> settings_from(const SimulateFlags& f) {
  sim::SimOptions base = f.sim;
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"policy", f.policy},
                                   {"admission", f.admission},
                                   {"preemption", f.preemption},
                                   {"prefix-sharing", f.prefix_sharing},
                                   {"model", base.model},
                                   {"gpu", base.gpu},
                                   {"kv-dtype", f.kv_dtype}}) {
    KVP_RETURN_IF_ERROR(sim::apply_setting(base, key, value));
  }
  if (!(f.speed > 0)) return Status::error("--speed must be > 0");
  return base;
}

// --trace, or --shape, or by default the Azure conversation trace beside the checkout (the
// 'chat' shape, said so, when it is absent); reshaped by --speed, --duration, --requests.
Result<Traffic> traffic_from(const SimulateFlags& f, const sim::SimOptions& base) {
  if (!f.trace.empty() && !f.shape.empty()) return Status::error("give --trace or --shape, not both");
  std::string trace = f.trace, shape = f.shape;
  if (trace.empty() && shape.empty()) {
    const std::filesystem::path azure = std::filesystem::path(KVPROOF_SHARED_TRACES_DIR) / "azure_llm_2023_conv.csv";
    if (std::filesystem::exists(azure)) {
      trace = azure.string();
    } else {
      std::fprintf(stderr,
                   "kvproof simulate: the Azure conversation trace is absent (%s); using the synthetic "
                   "'chat' shape instead\n",
                   azure.string().c_str());
      shape = "chat";
    }
  }
  Traffic traffic;
  if (!trace.empty()) {
    auto t = load_traffic(trace);
    if (!t) return t.status();
    traffic = std::move(*t);
  } else {
    auto spec = builtin_traffic(shape, 0, f.num_requests > 0 ? f.num_requests : 0,
                                base.max_model_len > 0 ? base.max_model_len : 4096, base.seed);
    if (!spec) return spec.status();
    traffic = generate_traffic(*spec);
  }
  reshape_traffic(traffic, f.speed, 0, f.duration, f.num_requests);
  if (traffic.requests.empty()) return Status::error("the traffic has no requests");
  return traffic;
}

// One run per sweep point, each with its progress bar.
Result<std::vector<sim::SimRun>> run_sweep(const sim::SimOptions& base, const std::vector<std::string>& sweep,
                                           const Traffic& traffic) {
  auto points = sim::expand_sweep(base, sweep);
  if (!points) return points.status();
  std::vector<sim::SimRun> runs;
  for (std::size_t k = 0; k < points->size(); ++k) {
    sim::SweepPoint& p = (*points)[k];
    const std::string title = points->size() > 1 ? "run " + std::to_string(k + 1) + "/" + std::to_string(points->size())
                                                 : std::string("simulate");
    auto bar = std::make_shared<ProgressBar>(title);
    p.options.progress = [bar](double fraction) { bar->update(fraction); };
    auto report = sim::simulate(p.options, traffic);
    p.options.progress = nullptr;
    if (!report) return Status::error((p.label.empty() ? "" : p.label + ": ") + report.status().message());
    runs.push_back({p.label, std::move(*report)});
  }
  return runs;
}

// The table on stdout, then --json and --csv.
Status report_runs(const std::vector<sim::SimRun>& runs, const SimulateFlags& f, bool checked) {
  std::printf("%s", sim::format_header(runs.front().report).c_str());
  double wall = 0;
  int64_t token_steps = 0;
  for (const sim::SimRun& r : runs) {
    wall += r.report.wall_s;
    token_steps += r.report.token_steps;
  }
  std::printf("%zu run(s): %lld token-steps simulated in %.2f s (%.2f M token-steps/s)%s\n\n", runs.size(),
              static_cast<long long>(token_steps), wall, wall > 0 ? static_cast<double>(token_steps) / wall / 1e6 : 0.0,
              checked ? ", every invariant checker after every step, every memory sample recounted" : "");
  std::printf("%s", sim::format_table(runs).c_str());
  if (!f.summary_path.empty() || !f.html_path.empty()) {
    verify::Summary s;
    s.title = "kvproof simulate";
    s.verdict_detail = std::to_string(runs.size()) + " run(s), " + std::to_string(token_steps) +
                       " token-steps simulated" +
                       (checked ? "; every invariant checker after every step, every memory sample recounted" : "");
    std::istringstream header(sim::format_header(runs.front().report));
    for (std::string line; std::getline(header, line);) s.context.push_back(line);
    s.reproducer = f.command_line;
    s.raw_markdown = sim::format_table(runs);
    KVP_RETURN_IF_ERROR(
        verify::write_summary_and_page(f.summary_path, f.html_path, s, [&] { return sim::plots(runs); }));
  }
  if (!f.json_path.empty() && !write_file(f.json_path, sim::to_json(runs).dump(1) + "\n"))
    return Status::error(f.json_path + ": cannot write");
  if (!f.csv_path.empty() && !write_file(f.csv_path, sim::to_csv(runs)))
    return Status::error(f.csv_path + ": cannot write");
  return Status::ok();
}

Status run_simulate(const SimulateFlags& f) {
  auto base = settings_from(f);
  if (!base) return base.status();
  auto traffic = traffic_from(f, *base);
  if (!traffic) return traffic.status();
  auto runs = run_sweep(*base, f.sweep, *traffic);
  if (!runs) return runs.status();
  return report_runs(*runs, f, base->check);
}

}  // namespace

void add_simulate_command(CLI::App& app, int& exit_code, const std::string& command_line) {
  auto flags = std::make_shared<SimulateFlags>();
  flags->command_line = command_line;
  CLI::App* cmd = app.add_subcommand(
      "simulate",
      "Capacity decisions: the engine's scheduler and KV-cache manager on a GPU cost model, on real traffic");
  add_simulate_flags(cmd, *flags);
  cmd->callback([flags, &exit_code] {
    if (Status s = run_simulate(*flags); !s) bad_input_reporter("simulate", exit_code)(s.message());
  });
}

}  // namespace kvp::tools
