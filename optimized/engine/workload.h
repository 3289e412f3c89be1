// Workloads: requests with arrival and cancellation steps, from a JSON file or a built-in
// traffic shape, and the loop that drives an Engine through one.
//
// JSON (every field but the prompt optional):
//   {"requests": [
//     {"prompt": [1, 2, 3]            | "prompt_len": 40,
//      "shared_prefix": {"group": "system", "len": 32},   // first len tokens shared by the group
//      "max_tokens": 16, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0,
//      "tenant": 0, "stop_token": 2, "arrival_step": 0, "cancel_step": 12,
//      "n": 1,                                              // parallel samples (forks)
//      "speculate": "off" | "ngram" | "draft", "k": 4}      // speculative decoding (default:
//                                                           // the engine's; "k" alone: ngram)
//   ]}
// Generated tokens (prompt_len, shared prefixes) are drawn from the workload seed, so a
// workload names the same token ids on every machine.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "optimized/engine/engine.h"
#include "optimized/engine/request.h"

namespace kvp {

struct WorkloadRequest {
  RequestSpec spec;
  int64_t arrival_step = 0;
  std::optional<int64_t> cancel_step;
};

struct Workload {
  std::string name;
  std::vector<WorkloadRequest> requests;
};

// Errors name the request index and the field: "requests[3].max_tokens: must be >= 1".
Result<Workload> parse_workload(const nlohmann::json& j, int64_t vocab_size, uint64_t seed);
Result<Workload> load_workload(const std::filesystem::path& path, int64_t vocab_size, uint64_t seed);

// Built-in shapes: short-chat, long-docs, many-users, shared-prefix, mixed (all of them,
// with cancellations and two tenants), multi-tenant (three tenants sending an identical
// public system prompt and private prefixes: the isolation audit's default).
std::vector<std::string> builtin_workload_names();
Result<Workload> builtin_workload(const std::string& name, int64_t vocab_size, uint64_t seed);

struct WorkloadRun {
  std::vector<RequestId> ids;  // per workload request
  int64_t steps = 0;
};
// Adds requests at their arrival steps, cancels at their cancel steps, and steps the engine
// until every request has ended, calling `after_step` (when given) after each step. Error: a
// step or after_step failed, or `max_steps` passed (no progress).
Result<WorkloadRun> run_workload(Engine& engine, const Workload& w, int64_t max_steps,
                                 const std::function<Status(Engine&)>& after_step = {});

}  // namespace kvp
