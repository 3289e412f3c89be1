// `kvproof reference`: the golden file of a workload, from the fp64 oracle (golden/golden.h).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "golden/golden.h"
#include "model/weights.h"
#include "optimized/engine/workload.h"

namespace kvp::golden {

// What names the model in a golden file's header: `source` (how it was loaded), the
// SHA-256 of its config (ModelConfig::to_json, dumped with sorted keys) and of its weights
// (every tensor's name and fp32 bytes, in named_tensors order), and the vocabulary size.
nlohmann::json model_identity(const Model& model, const std::string& source);

struct ReferenceOptions {
  int32_t top_k = 20;  // REQUIRES >= 2
  int threads = 2;     // the oracle's (its bits do not depend on it)
  std::string source;  // model_identity's `source`
};

// One scored request per workload request (id = its index), in workload order: the prompt,
// then for a greedy request the oracle's own greedy continuation (arg-max of the fp64
// logits, lowest token on ties), for a sampled one kvproof's sampler (common/sampling.h) on
// the oracle's logits rounded to fp32 with the request's seed; max_tokens tokens, or fewer
// when a stop token comes. Every position's fp64 log-softmax of the token and the top_k.
// Arrival, cancellation, tenants, parallel samples (n) and speculation do not change the
// oracle's outputs and are not represented. Errors name the request.
Result<LogprobFile> make_golden(const Model& model, const Workload& workload, const ReferenceOptions& options);

}  // namespace kvp::golden
