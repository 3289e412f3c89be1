// kvproof simulate: capacity questions answered by the engine's own scheduler and KV-cache
// manager on the cost-model backend (simulate/simulate.h). Flags -> options -> runs ->
// table, JSON, CSV. Exit 0: ran; 2: bad flags, traffic or settings, or a run failed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulate/report.h"
#include "simulate/simulate.h"
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

void add_simulate_command(CLI::App& app, int& exit_code) {
  struct Options {
    sim::SimOptions sim;
    std::string trace, shape, policy = "paged", admission = "optimistic", preemption = "recompute";
    std::string prefix_sharing = "on";
    double speed = 1, duration = 0;
    int64_t num_requests = 0;
    std::string json_path, csv_path;
    std::vector<std::string> sweep;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "simulate",
      "Capacity decisions: the engine's scheduler and KV-cache manager on a GPU cost model, on real traffic");
  cmd->add_option("--model", opt->sim.model, "llama-2-7b, llama-2-13b, llama-3-8b, mistral-7b, qwen2.5-7b")
      ->capture_default_str();
  cmd->add_option("--gpu", opt->sim.gpu, "a100-40gb, a100-80gb, h100-80gb, h200-141gb")->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", opt->sim.gpu_memory_utilization, "share of GPU memory the engine uses")
      ->capture_default_str();
  cmd->add_option("--trace", opt->trace,
                  "trace file: .csv (Azure LLM 2023: TIMESTAMP,ContextTokens,GeneratedTokens) or .jsonl; default: "
                  "the Azure conversation trace in ../shared/traces when present");
  cmd->add_option("--shape", opt->shape, "built-in synthetic traffic: chat, long-docs, shared-prefix, bursty, max-len");
  cmd->add_option("--requests", opt->num_requests, "at most this many requests (a shape: how many to generate)");
  cmd->add_option("--duration", opt->duration, "only requests arriving in the first SECONDS (after --speed/--rate)");
  cmd->add_option("--speed", opt->speed, "replay speed factor (2 = arrivals twice as fast)")->capture_default_str();
  cmd->add_option("--rate", opt->sim.rate, "rescale arrivals to this many requests/s (0: as recorded)");
  cmd->add_option("--policy", opt->policy, "paged, contiguous-max, contiguous-pow2, contiguous-oracle")
      ->capture_default_str();
  cmd->add_option("--block-size", opt->sim.block_size, "tokens per KV block (paged)")->capture_default_str();
  cmd->add_option("--admission", opt->admission, "optimistic or conservative")->capture_default_str();
  cmd->add_option("--preemption", opt->preemption, "recompute or swap")->capture_default_str();
  cmd->add_option("--max-model-len", opt->sim.max_model_len, "maximum context (0: the model's)")->capture_default_str();
  cmd->add_option("--max-num-seqs", opt->sim.max_num_seqs, "running sequences at most")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", opt->sim.max_num_batched_tokens, "tokens per step at most")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", opt->sim.prefill_chunk_size, "prompt tokens per request per step at most")
      ->capture_default_str();
  cmd->add_option("--prefix-sharing", opt->prefix_sharing, "on or off (prefix cache)")->capture_default_str();
  cmd->add_option("--n", opt->sim.n, "parallel samples per request (paged policy)")->capture_default_str();
  cmd->add_option("--ttft-slo", opt->sim.ttft_slo_s, "time-to-first-token target, seconds")->capture_default_str();
  cmd->add_option("--tpot-slo", opt->sim.tpot_slo_s, "time-per-output-token target, seconds")->capture_default_str();
  cmd->add_option("--sample-interval", opt->sim.sample_interval_s, "memory and queue samples every SECONDS simulated")
      ->capture_default_str();
  cmd->add_option("--seed", opt->sim.seed, "seed of synthetic traffic and prompt token ids")->capture_default_str();
  cmd->add_flag("--check", opt->sim.check,
                "run every invariant checker after every step and recount every memory sample (slow)");
  cmd->add_option("--json", opt->json_path, "write every run (with timeline and latencies) as JSON");
  cmd->add_option("--csv", opt->csv_path, "write one CSV row per run");
  cmd->add_option("--sweep", opt->sweep,
                  "key=v1,v2,... (repeatable): block-size, admission, preemption, max-model-len, rate, policy, "
                  "prefix-sharing, max-num-seqs, n, gpu, model; one run per combination");
  cmd->callback([opt, &exit_code] {
    auto fail = [&exit_code](const std::string& message) {
      std::fprintf(stderr, "kvproof simulate: %s\n", message.c_str());
      exit_code = kExitBadInput;
    };
    sim::SimOptions base = opt->sim;
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"policy", opt->policy},
                                     {"admission", opt->admission},
                                     {"preemption", opt->preemption},
                                     {"prefix-sharing", opt->prefix_sharing},
                                     {"model", base.model},
                                     {"gpu", base.gpu}}) {
      if (Status s = sim::apply_setting(base, key, value); !s) return fail(s.message());
    }
    if (!(opt->speed > 0)) return fail("--speed must be > 0");

    // Traffic.
    Traffic traffic;
    if (!opt->trace.empty() && !opt->shape.empty()) return fail("give --trace or --shape, not both");
    std::string trace = opt->trace;
    if (trace.empty() && opt->shape.empty()) {
      const std::filesystem::path azure = std::filesystem::path(KVPROOF_SHARED_TRACES_DIR) / "azure_llm_2023_conv.csv";
      if (std::filesystem::exists(azure)) {
        trace = azure.string();
      } else {
        std::fprintf(stderr,
                     "kvproof simulate: the Azure conversation trace is absent (%s); using the synthetic "
                     "'chat' shape instead\n",
                     azure.string().c_str());
        opt->shape = "chat";
      }
    }
    if (!trace.empty()) {
      auto t = load_traffic(trace);
      if (!t) return fail(t.status().message());
      traffic = std::move(*t);
    } else {
      auto spec = builtin_traffic(opt->shape, 0, opt->num_requests > 0 ? opt->num_requests : 0,
                                  base.max_model_len > 0 ? base.max_model_len : 4096, base.seed);
      if (!spec) return fail(spec.status().message());
      traffic = generate_traffic(*spec);
    }
    reshape_traffic(traffic, opt->speed, 0, opt->duration, opt->num_requests);
    if (traffic.requests.empty()) return fail("the traffic has no requests");

    auto points = sim::expand_sweep(base, opt->sweep);
    if (!points) return fail(points.status().message());
    std::vector<sim::SimRun> runs;
    for (std::size_t k = 0; k < points->size(); ++k) {
      sim::SweepPoint& p = (*points)[k];
      const std::string title = points->size() > 1
                                    ? "run " + std::to_string(k + 1) + "/" + std::to_string(points->size())
                                    : std::string("simulate");
      auto bar = std::make_shared<ProgressBar>(title);
      p.options.progress = [bar](double f) { bar->update(f); };
      auto report = sim::simulate(p.options, traffic);
      p.options.progress = nullptr;
      if (!report) return fail((p.label.empty() ? "" : p.label + ": ") + report.status().message());
      runs.push_back({p.label, std::move(*report)});
    }
    std::printf("%s", sim::format_header(runs.front().report).c_str());
    double wall = 0;
    int64_t token_steps = 0;
    for (const sim::SimRun& r : runs) {
      wall += r.report.wall_s;
      token_steps += r.report.token_steps;
    }
    std::printf("%zu run(s): %lld token-steps simulated in %.2f s (%.2f M token-steps/s)%s\n\n", runs.size(),
                static_cast<long long>(token_steps), wall,
                wall > 0 ? static_cast<double>(token_steps) / wall / 1e6 : 0.0,
                base.check ? ", every invariant checker after every step, every memory sample recounted" : "");
    std::printf("%s", sim::format_table(runs).c_str());
    if (!opt->json_path.empty() && !write_file(opt->json_path, sim::to_json(runs).dump(1) + "\n"))
      return fail(opt->json_path + ": cannot write");
    if (!opt->csv_path.empty() && !write_file(opt->csv_path, sim::to_csv(runs)))
      return fail(opt->csv_path + ": cannot write");
  });
}

}  // namespace kvp::tools
