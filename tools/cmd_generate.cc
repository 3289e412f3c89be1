#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>

#include <nlohmann/json.hpp>

#include "audit/kv_events/kv_events_zmq.h"
#include "common/sampling.h"
#include "optimized/kv/event_log.h"
#include "reference/reference_model.h"
#include "tools/bad_input.h"
#include "tools/commands.h"
#include "tools/kv_events_publish.h"
#include "tools/model_source.h"
#include "tools/run_inputs.h"
#include "tools/token_list.h"
#include "verify/kv_events_engine.h"
#include "verify/verify.h"

namespace kvp::tools {
namespace {

// One request through the paged engine on the chosen backend, in a pool that holds it whole
// (block size 16, no preemption). Greedy tokens equal the reference's; sampled ones are drawn
// from the engine's per-request stream of the same seed.
Result<GenerateResult> engine_generate(Model& model, const BackendChoice& choice, const std::vector<int32_t>& prompt,
                                       int64_t max_tokens, const SamplingParams& sampling,
                                       const std::vector<int32_t>& stop_tokens, kv_events::Publisher* publisher) {
  verify::EngineOptions o;
  if (Status s = choice.apply(o); !s) return s;
  if (auto w = choice.apply_weight_dtype(model, o); !w) return w.status();
  // fp8 scales: calibrated on the prompt (a preset or checkpoint without scales), else 1.0 or
  // the checkpoint's as --kv-scales says. generate has no checkpoint path here: a checkpoint's
  // own scales are used by verify and audit.
  if (Status s = choice.resolve_scales("", model, {prompt}, o); !s) return s;
  const int64_t length = static_cast<int64_t>(prompt.size()) + max_tokens;
  if (prompt.empty()) return Status::error("--prompt: empty");
  if (length > model.config.max_position_embeddings)
    return Status::error("prompt of " + std::to_string(prompt.size()) + " tokens plus " + std::to_string(max_tokens) +
                         " is over the model's " + std::to_string(model.config.max_position_embeddings) + " positions");
  constexpr int32_t kBlockSize = 16;
  o.block_size = kBlockSize;
  o.num_blocks = static_cast<int32_t>((length + kBlockSize - 1) / kBlockSize + 1);
  o.num_host_blocks = 0;
  o.max_model_len = model.config.max_position_embeddings;
  o.max_num_batched_tokens = std::max<int32_t>(o.max_num_batched_tokens, static_cast<int32_t>(prompt.size()));
  o.prefill_chunk_size = o.max_num_batched_tokens;  // the prompt in one chunk
  auto live = verify::make_engine(model, o, verify::options_setup(o, PreemptionMode::kRecompute));
  if (!live) return live.status();
  RequestSpec spec;
  spec.prompt = prompt;
  spec.max_tokens = max_tokens;
  spec.sampling = sampling;
  spec.capture_logits = true;
  spec.stop_tokens = stop_tokens;
  // The engine's KV-event stream (docs/kv-events.md), published when asked: one batch per step.
  EventLog log;
  kv_events::EngineKvEvents stream(live->engine->kv(), publisher);
  if (publisher != nullptr) {
    live->engine->set_kv_event_log(&log);
    log.set_listener([&](const KvEvent& e) { stream.on_event(e); });
  }
  const RequestId id = live->engine->add_request(spec);
  while (live->engine->has_unfinished()) {
    KVP_RETURN_IF_ERROR(live->engine->step());
    stream.end_step();
  }
  live->engine->set_kv_event_log(nullptr);
  if (publisher != nullptr) publisher->serve_replay(1000);  // a late subscriber asks for the start
  const Request& r = live->engine->request(id);
  if (r.finish() == FinishReason::kRejected) return Status::error("the engine rejected the request");
  GenerateResult out;
  for (int64_t k = 0; k < r.num_generated(); ++k) {
    const auto p = static_cast<std::size_t>(r.num_prompt() + k);
    out.tokens.push_back(r.tokens()[p]);
    out.logits.push_back(r.logits[p - 1]);
  }
  return out;
}

}  // namespace

namespace {

struct GenerateFlags {
  ModelSource source;
  std::string prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  int top_logits = 5;
  bool json = false;
  bool ignore_eos = false;
  BackendChoice backend;
  KvEventsPublishOptions publish;
};

void add_generate_flags(CLI::App& cmd, GenerateFlags& f) {
  f.source.add_options(cmd);
  f.backend.add_options(cmd, {"reference"});
  cmd.add_option("--prompt", f.prompt, "prompt token ids, comma-separated: 1,2,3")->required();
  cmd.add_option("--max-tokens", f.max_tokens, "tokens to generate")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd.add_option("--temperature", f.sampling.temperature, "0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  cmd.add_option("--top-k", f.sampling.top_k, "keep the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  cmd.add_option("--top-p", f.sampling.top_p, "nucleus mass in (0, 1]")->check(CLI::Range(0.0f, 1.0f));
  cmd.add_option("--seed", f.sampling.seed, "sampling seed");
  cmd.add_option("--top-logits", f.top_logits, "with --json: top logits per step")->check(CLI::Range(1, 100));
  cmd.add_flag("--json", f.json, "print JSON with the top logits of every step");
  cmd.add_flag("--ignore-eos", f.ignore_eos,
               "generate max-tokens tokens; by default generation stops after the model's eos_token_id "
               "(config.json / generation_config.json)");
  f.publish.add_options(cmd);  // with an engine backend
}

// The tokens and, per step, the top logits (ties by token id).
void print_json(const GenerateFlags& f, const std::vector<int32_t>& prompt, const GenerateResult& out) {
  nlohmann::json j;
  j["model"] = f.source.describe();
  j["prompt"] = prompt;
  j["tokens"] = out.tokens;
  j["sampling"] = {{"temperature", f.sampling.temperature},
                   {"top_k", f.sampling.top_k},
                   {"top_p", f.sampling.top_p},
                   {"seed", f.sampling.seed}};
  nlohmann::json steps = nlohmann::json::array();
  for (std::size_t i = 0; i < out.tokens.size(); ++i) {
    const std::vector<float>& logits = out.logits[i];
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    const auto k = std::min<std::size_t>(static_cast<std::size_t>(f.top_logits), order.size());
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
    nlohmann::json top = nlohmann::json::array();
    for (std::size_t r = 0; r < k; ++r) top.push_back({{"token", order[r]}, {"logit", logits[order[r]]}});
    steps.push_back({{"token", out.tokens[i]}, {"top", top}});
  }
  j["steps"] = steps;
  std::printf("%s\n", j.dump(2).c_str());
}

Result<int> run_generate(const GenerateFlags& f) {
  auto prompt = parse_token_list(f.prompt);
  if (!prompt) return Status::error("--prompt: " + prompt.status().message());
  KVP_RETURN_IF_ERROR(f.sampling.validate());
  auto model = f.source.load();
  if (!model) return model.status();
  // The reference computes with the bf16 values too (the engine path rounds them as well).
  if (f.backend.weight_dtype == "bf16") round_matrices_to_bf16(*model);
  const std::vector<int32_t> stop = f.ignore_eos ? std::vector<int32_t>{} : model->config.eos_token_ids;
  if (f.publish.enabled() && f.backend.backend == "reference")
    return Status::error("--kv-events-publish: the reference model has no paged KV cache; choose an engine --backend");
  auto started = f.publish.start();
  if (!started) return started.status();
  const std::unique_ptr<kv_events::Publisher> publisher = std::move(*started);
  auto out = f.backend.backend == "reference"
                 ? reference_generate(ReferenceModel<float>(*model), *prompt, f.max_tokens, f.sampling, stop)
                 : engine_generate(*model, f.backend, *prompt, f.max_tokens, f.sampling, stop, publisher.get());
  if (!out) return out.status();
  if (f.json) {
    print_json(f, *prompt, *out);
  } else {
    std::string line;
    for (int32_t t : out->tokens) line += (line.empty() ? "" : ",") + std::to_string(t);
    std::printf("%s\n", line.c_str());
  }
  return kExitOk;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<GenerateFlags>();
  flags->backend.backend = "reference";
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate tokens with the reference model (the oracle, default) or the paged engine on a backend");
  add_generate_flags(*cmd, *flags);
  cmd->callback([flags, &exit_code] { set_exit_code("generate", run_generate(*flags), exit_code); });
}

}  // namespace kvp::tools
