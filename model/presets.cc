#include "model/presets.h"

#include <algorithm>
#include <cmath>

#include "common/rng.h"

namespace kvp {

namespace {

constexpr double kLogitStd = 2.5;

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_layers = 4;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = false;
  return c;
}

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 2048;
  c.hidden_size = 256;
  c.intermediate_size = 768;
  c.num_layers = 6;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 32;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 4096;
  c.tie_word_embeddings = false;
  return c;
}

// Uniform in [-a, a] has variance a^2 / 3.
void fill_uniform(float* data, std::size_t n, double stddev, uint64_t seed) {
  Rng rng(seed);
  const double a = stddev * std::sqrt(3.0);
  for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<float>(rng.uniform(-a, a));
}

}  // namespace

std::vector<std::string> preset_names() { return {"tiny", "small", "tiny-draft", "small-draft"}; }

Result<ModelConfig> preset_config(std::string_view name) {
  if (name == "tiny") return tiny_config();
  if (name == "small") return small_config();
  if (name == "tiny-draft" || name == "small-draft") {
    ModelConfig c = name == "tiny-draft" ? tiny_config() : small_config();
    c.num_layers = default_draft_layers(c);
    return c;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  return Status::error("unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

Result<Model> make_preset(std::string_view name, uint64_t seed) {
  if (name == "tiny-draft" || name == "small-draft") {
    const ModelConfig target = name == "tiny-draft" ? tiny_config() : small_config();
    return make_draft_model(make_random_model(target, seed), default_draft_layers(target));
  }
  auto c = preset_config(name);
  if (!c) return c.status();
  return make_random_model(*c, seed);
}

Model make_random_model(const ModelConfig& config, uint64_t seed) {
  Model m{config, allocate_weights(config)};
  uint64_t stream = 0;
  for (const NamedTensor& t : named_tensors(m.config, m.weights)) {
    std::size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<std::size_t>(d);
    const uint64_t s = mix_seed(seed, ++stream);
    if (t.shape.size() == 1) {
      // Norm gains near 1.
      Rng rng(s);
      for (std::size_t i = 0; i < n; ++i) t.data[i] = static_cast<float>(1.0 + rng.uniform(-0.1, 0.1));
      continue;
    }
    const double fan_in = static_cast<double>(t.shape[1]);
    double stddev = 1.0 / std::sqrt(fan_in);  // unit-variance projections
    if (t.name == "model.embed_tokens.weight") {
      // Untied: unit-variance embeddings. Tied: the same matrix makes the logits, so it is
      // scaled for them (RMSNorm makes the input scale irrelevant).
      stddev = config.tie_word_embeddings ? kLogitStd / std::sqrt(fan_in) : 1.0;
    } else if (t.name == "lm_head.weight") {
      stddev = kLogitStd / std::sqrt(fan_in);
    }
    fill_uniform(t.data, n, stddev, s);
  }
  return m;
}

int32_t default_draft_layers(const ModelConfig& target) {
  return static_cast<int32_t>(std::max<int64_t>(1, target.num_layers / 4));
}

Model make_draft_model(const Model& target, int32_t num_layers) {
  KVP_CHECK(num_layers >= 1 && num_layers <= target.config.num_layers);
  Model m;
  m.config = target.config;
  m.config.num_layers = num_layers;
  m.weights.embed_tokens = target.weights.embed_tokens;
  m.weights.layers.assign(target.weights.layers.begin(), target.weights.layers.begin() + num_layers);
  m.weights.norm = target.weights.norm;
  m.weights.lm_head = target.weights.lm_head;
  return m;
}

}  // namespace kvp
