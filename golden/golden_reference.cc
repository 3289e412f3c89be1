#include "golden/golden_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include <openssl/evp.h>

#include "common/rng.h"
#include "common/sampling.h"
#include "reference/reference_model.h"

namespace kvp::golden {
namespace {

using Oracle = ReferenceModel<double>;
using Row = Eigen::Ref<const Eigen::Matrix<double, 1, Eigen::Dynamic>>;

std::string hex(const unsigned char* d, unsigned int n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned int i = 0; i < n; ++i) {
    s += digits[d[i] >> 4];
    s += digits[d[i] & 15];
  }
  return s;
}

struct Sha256 {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  Sha256() { KVP_CHECK(ctx != nullptr && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1); }
  ~Sha256() { EVP_MD_CTX_free(ctx); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void add(const void* data, std::size_t n) { KVP_CHECK(EVP_DigestUpdate(ctx, data, n) == 1); }
  std::string hex_digest() {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    KVP_CHECK(EVP_DigestFinal_ex(ctx, d, &n) == 1);
    return hex(d, n);
  }
};

// The position's fp64 log-softmax: the token's, and the top k by descending logprob (ties:
// lowest token first).
ScoredPosition score(const Row& logits, int64_t pos, int32_t token, int32_t k) {
  const double m = logits.maxCoeff();
  const double lse = m + std::log((logits.array() - m).exp().sum());
  ScoredPosition s;
  s.pos = pos;
  s.token = token;
  s.logprob = logits(token) - lse;
  std::vector<int32_t> order(static_cast<std::size_t>(logits.size()));
  std::iota(order.begin(), order.end(), 0);
  const auto n = std::min<std::size_t>(static_cast<std::size_t>(k), order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                    [&](int32_t a, int32_t b) { return logits(a) > logits(b) || (logits(a) == logits(b) && a < b); });
  for (std::size_t i = 0; i < n; ++i) s.top.push_back({order[i], logits(order[i]) - lse});
  return s;
}

int32_t next_token(const Row& logits, const SamplingParams& sampling, Rng& rng) {
  if (sampling.greedy()) {
    Eigen::Index best = 0;
    for (Eigen::Index v = 1; v < logits.size(); ++v)
      if (logits(v) > logits(best)) best = v;
    return static_cast<int32_t>(best);
  }
  std::vector<float> rounded(static_cast<std::size_t>(logits.size()));
  for (Eigen::Index v = 0; v < logits.size(); ++v) rounded[static_cast<std::size_t>(v)] = static_cast<float>(logits(v));
  return sample_token(rounded, sampling, rng);
}

Result<ScoredRequest> score_request(const Oracle& oracle, const RequestSpec& spec, int64_t id, int32_t top_k) {
  // Positions per forward(): only a chunk's fp64 logits are held at once (as verify does).
  constexpr int64_t kChunk = 32;
  ScoredRequest r;
  r.id = id;
  r.prompt = spec.prompt;
  r.tokens = spec.prompt;
  r.greedy = spec.sampling.greedy();
  const auto prompt_len = static_cast<int64_t>(spec.prompt.size());
  auto cache = oracle.make_cache(prompt_len + spec.max_tokens);
  Eigen::Matrix<double, 1, Eigen::Dynamic> last;
  for (int64_t begin = 0; begin < prompt_len; begin += kChunk) {
    const int64_t n = std::min(kChunk, prompt_len - begin);
    auto logits =
        oracle.forward(std::span<const int32_t>(spec.prompt.data() + begin, static_cast<std::size_t>(n)), cache);
    if (!logits) return logits.status();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = begin + i + 1;
      if (pos < prompt_len)
        r.positions.push_back(score(logits->row(i), pos, spec.prompt[static_cast<std::size_t>(pos)], top_k));
      else
        last = logits->row(i);
    }
  }
  Rng rng(spec.sampling.seed);
  for (int64_t k = 0; k < spec.max_tokens; ++k) {
    const int32_t token = next_token(last, spec.sampling, rng);
    r.tokens.push_back(token);
    r.positions.push_back(score(last, static_cast<int64_t>(r.tokens.size()) - 1, token, top_k));
    if (spec.is_stop(token) || k + 1 == spec.max_tokens) break;
    auto logits = oracle.forward(std::span<const int32_t>(&token, 1), cache);
    if (!logits) return logits.status();
    last = logits->row(0);
  }
  return r;
}

}  // namespace

nlohmann::json model_identity(const Model& model, const std::string& source) {
  Sha256 config;
  const std::string text = model.config.to_json().dump();
  config.add(text.data(), text.size());
  Sha256 weights;
  // named_tensors lists the tensors' storage; nothing is written through it here.
  for (const NamedTensor& t : named_tensors(model.config, const_cast<ModelWeights&>(model.weights))) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    weights.add(t.name.data(), t.name.size() + 1);
    weights.add(t.data, static_cast<std::size_t>(n) * sizeof(float));
  }
  return {{"source", source},
          {"config_sha256", config.hex_digest()},
          {"weights_sha256", weights.hex_digest()},
          {"vocab_size", model.config.vocab_size}};
}

Result<LogprobFile> make_golden(const Model& model, const Workload& workload, const ReferenceOptions& options) {
  if (options.top_k < 2) return Status::error("top_k: must be >= 2 (the near-tie check needs the top two)");
  if (Status s = model.config.validate(); !s) return s;
  LogprobFile f;
  f.header.role = "golden";
  f.header.producer = "kvproof reference (fp64 oracle)";
  f.header.model = model_identity(model, options.source);
  f.header.model["kv_dtype"] = "f64";  // the oracle's dense cache
  f.header.kv_dtype = "f64";
  f.header.top_k = static_cast<int32_t>(std::min<int64_t>(options.top_k, model.config.vocab_size));
  Oracle oracle(model);
  oracle.set_threads(options.threads);
  for (std::size_t i = 0; i < workload.requests.size(); ++i) {
    const RequestSpec& spec = workload.requests[i].spec;
    const std::string label = "request " + std::to_string(i);
    if (spec.prompt.empty()) return Status::error(label + ": empty prompt");
    if (spec.max_tokens < 1) return Status::error(label + ": max_tokens must be >= 1");
    if (Status s = spec.sampling.validate(); !s) return s.with_context(label);
    const int64_t len = static_cast<int64_t>(spec.prompt.size()) + spec.max_tokens;
    if (len > model.config.max_position_embeddings)
      return Status::error(label + ": prompt + max_tokens = " + std::to_string(len) +
                           " positions, more than the model's max_position_embeddings " +
                           std::to_string(model.config.max_position_embeddings));
    auto r = score_request(oracle, spec, static_cast<int64_t>(i), f.header.top_k);
    if (!r) return r.status().with_context(label);
    f.requests.push_back(std::move(*r));
  }
  return f;
}

}  // namespace kvp::golden
