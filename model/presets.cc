#include "model/presets.h"

#include <algorithm>
#include <cmath>

#include "common/parallel.h"
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

// tiny as MistralForCausalLM with a sliding window of 20 positions on every layer: not a
// multiple of a block, and verify's workloads (prompts up to 120 tokens) span several windows.
ModelConfig tiny_mistral_sw_config() {
  ModelConfig c = tiny_config();
  c.architecture = Architecture::kMistral;
  c.sliding_window = 20;
  return c;
}

// tiny as Qwen2ForCausalLM with use_sliding_window, window 20 and max_window_layers 2: a
// hybrid, layers 0 and 1 attend to everything, layers 2 and 3 through the window.
ModelConfig tiny_qwen2_hybrid_config() {
  ModelConfig c = tiny_config();
  c.architecture = Architecture::kQwen2;
  c.qkv_bias = true;
  c.sliding_window = 20;
  c.sliding_layers = {false, false, true, true};
  return c;
}

// tiny as Gemma2ForCausalLM (head_dim 32 independent of hidden / heads = 16, query_pre_attn_scalar
// 24, not head_dim), layers alternating sliding (0, 2) and full (1, 3) with a window of 20.
// The caps are much smaller than Gemma 2's published 50 and 30 so that they bend these random
// weights' scores and logits (about unit and 2.5 standard deviations): with 50 and 30, tanh
// is within 0.1% of the identity here and a dropped cap would hide inside the tolerance.
ModelConfig tiny_gemma2_config() {
  ModelConfig c = tiny_config();
  c.architecture = Architecture::kGemma2;
  c.num_heads = 4;
  c.head_dim = 32;
  c.tie_word_embeddings = true;
  c.rms_norm_eps = 1e-6;
  c.query_pre_attn_scalar = 24.0;
  c.attn_logit_softcapping = 2.0;
  c.final_logit_softcapping = 3.0;
  c.sliding_window = 20;
  c.sliding_layers = {true, false, true, false};
  return c;
}

// tiny as Gemma3ForCausalLM: q/k norms, five layers of window 20 to one full (layer 5 of 6),
// local RoPE base 10,000 beside a global 1,000,000, no caps (Gemma 3's published defaults),
// MQA as in the 270M and 1B.
ModelConfig tiny_gemma3_config() {
  ModelConfig c = tiny_config();
  c.architecture = Architecture::kGemma3;
  c.num_layers = 6;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 32;
  c.tie_word_embeddings = true;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.rope_local_base_freq = 10000.0;
  c.query_pre_attn_scalar = 32.0;
  c.sliding_window = 20;
  c.sliding_layers = {true, true, true, true, true, false};
  return c;
}

// google/gemma-3-270m and google/gemma-3-1b-it, config.json (Gemma3ForCausalLM, model_type
// gemma3_text): head_dim 256, 4 query heads and one KV head, window 512, layer_types five
// sliding to one full, rope_theta 1e6 with rope_local_base_freq 1e4, query_pre_attn_scalar 256,
// no caps, vocabulary 262,144, 32,768 positions, tied embeddings, eps 1e-6. 270M: hidden 640,
// intermediate 2048, 18 layers; 1B: hidden 1152, intermediate 6912, 26 layers, eos [1, 106].
ModelConfig gemma3_config(int64_t hidden, int64_t intermediate, int64_t layers, std::vector<int32_t> eos) {
  ModelConfig c;
  c.architecture = Architecture::kGemma3;
  c.vocab_size = 262144;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 256;
  c.max_position_embeddings = 32768;
  c.rope_theta = 1000000.0;
  c.rope_local_base_freq = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.query_pre_attn_scalar = 256.0;
  c.sliding_window = 512;
  for (int64_t l = 0; l < layers; ++l) c.sliding_layers.push_back((l + 1) % 6 != 0);
  c.eos_token_ids = std::move(eos);
  return c;
}

// Real shapes: each config.json as published on the Hugging Face Hub (every key that the
// math reads), with seeded random weights instead of the trained ones.
ModelConfig real_config(Architecture arch, int64_t vocab, int64_t hidden, int64_t intermediate, int64_t layers,
                        int64_t heads, int64_t kv_heads, int64_t max_positions, double theta, double eps, bool tied,
                        std::vector<int32_t> eos) {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = max_positions;
  c.rope_theta = theta;
  c.rms_norm_eps = eps;
  c.tie_word_embeddings = tied;
  c.qkv_bias = arch == Architecture::kQwen2;
  c.eos_token_ids = std::move(eos);
  return c;
}

// HuggingFaceTB/SmolLM2-135M, config.json (snapshot 93efa2f097d58c2a74874c7e644dbc9b0cee75a2).
ModelConfig smollm2_135m_config() {
  return real_config(Architecture::kLlama, 49152, 576, 1536, 30, 9, 3, 8192, 100000.0, 1e-5, true, {0});
}

// Qwen/Qwen2.5-0.5B, config.json (snapshot 060db6499f32faf8b98477b0a26969ef7d8b9987):
// q/k/v biases, use_sliding_window false.
ModelConfig qwen25_05b_config() {
  return real_config(Architecture::kQwen2, 151936, 896, 4864, 24, 14, 2, 32768, 1000000.0, 1e-6, true, {151643});
}

// meta-llama/Llama-3.2-1B, config.json (snapshot 4e20de362430cd3b72f300e6b0f18e50e7166e08):
// rope_scaling llama3, factor 32, low/high frequency factors 1 and 4, original 8192 positions.
ModelConfig llama32_1b_config() {
  ModelConfig c =
      real_config(Architecture::kLlama, 128256, 2048, 8192, 16, 32, 8, 131072, 500000.0, 1e-5, true, {128001});
  c.head_dim = 64;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 32.0, 1.0, 4.0, 8192};
  return c;
}

// TinyLlama/TinyLlama-1.1B-Chat-v1.0, config.json (revision fe8a4ea1ffedaf415f4da2f062534de366a451e6).
ModelConfig tinyllama_11b_config() {
  return real_config(Architecture::kLlama, 32000, 2048, 5632, 22, 32, 4, 2048, 10000.0, 1e-5, false, {2});
}

// Uniform in [-a, a] has variance a^2 / 3. Element i is draw i of the stream `seed`: one
// thread draws the stream in order (the plain definition), more draw chunks of it
// (Rng::from_draw), the same bits; the threads also share the first touch of the fresh
// pages, which costs about as much as the draws.
void fill_uniform(float* data, std::size_t n, double stddev, uint64_t seed, int threads) {
  const double a = stddev * std::sqrt(3.0);
  const std::size_t chunk = threads > 1 ? std::size_t{1} << 18 : std::max<std::size_t>(n, 1);
  const std::size_t chunks = (n + chunk - 1) / chunk;
  const auto fill = [&](std::size_t c) {
    Rng rng = Rng::from_draw(seed, c * chunk);
    for (std::size_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i)
      data[i] = static_cast<float>(rng.uniform(-a, a));
  };
  for_each_slice(static_cast<int64_t>(chunks), threads, [&](int64_t c) { fill(static_cast<std::size_t>(c)); });
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny",           "small",        "tiny-draft",   "small-draft",  "tiny-mistral-sw",
          "tiny-gemma2",    "tiny-gemma3",  "smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b",
          "tinyllama-1.1b", "gemma-3-270m", "gemma-3-1b"};
}

Result<ModelConfig> preset_config(std::string_view name) {
  if (name == "tiny") return tiny_config();
  if (name == "small") return small_config();
  if (name == "tiny-mistral-sw") return tiny_mistral_sw_config();
  if (name == "tiny-qwen2-hybrid") return tiny_qwen2_hybrid_config();
  if (name == "tiny-gemma2") return tiny_gemma2_config();
  if (name == "tiny-gemma3") return tiny_gemma3_config();
  if (name == "gemma-3-270m") return gemma3_config(640, 2048, 18, {1});
  if (name == "gemma-3-1b") return gemma3_config(1152, 6912, 26, {1, 106});
  if (name == "smollm2-135m") return smollm2_135m_config();
  if (name == "qwen2.5-0.5b") return qwen25_05b_config();
  if (name == "llama-3.2-1b") return llama32_1b_config();
  if (name == "tinyllama-1.1b") return tinyllama_11b_config();
  if (name == "tiny-draft" || name == "small-draft") {
    const ModelConfig c = name == "tiny-draft" ? tiny_config() : small_config();
    return c.first_layers(default_draft_layers(c));
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  return Status::error("unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

Result<Model> make_preset(std::string_view name, uint64_t seed, int threads) {
  if (name == "tiny-draft" || name == "small-draft") {
    const ModelConfig target = name == "tiny-draft" ? tiny_config() : small_config();
    return make_draft_model(make_random_model(target, seed, threads), default_draft_layers(target));
  }
  auto c = preset_config(name);
  if (!c) return c.status();
  return make_random_model(*c, seed, threads);
}

Model make_random_model(const ModelConfig& config, uint64_t seed, int threads) {
  Model m{config, allocate_weights(config, /*zeroed=*/false)};  // every tensor is drawn below
  uint64_t stream = 0;
  for (const NamedTensor& t : named_tensors(m.config, m.weights)) {
    std::size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<std::size_t>(d);
    const uint64_t s = mix_seed(seed, ++stream);
    if (t.name.ends_with(".bias")) {
      // Biases of the size Qwen2's q/k/v biases have relative to the projections' outputs
      // (unit variance): large enough that dropping one changes every logit.
      fill_uniform(t.data, n, 0.5, s, threads);
      continue;
    }
    if (t.shape.size() == 1) {
      // Norm gains near 1 (Gemma stores the gain minus 1: norm_gain).
      Rng rng(s);
      const double base = config.gemma() ? 0.0 : 1.0;
      for (std::size_t i = 0; i < n; ++i) t.data[i] = static_cast<float>(base + rng.uniform(-0.1, 0.1));
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
    fill_uniform(t.data, n, stddev, s, threads);
  }
  return m;
}

int32_t default_draft_layers(const ModelConfig& target) {
  return static_cast<int32_t>(std::max<int64_t>(1, target.num_layers / 4));
}

Model make_draft_model(const Model& target, int32_t num_layers) {
  KVP_CHECK(num_layers >= 1 && num_layers <= target.config.num_layers);
  Model m;
  m.config = target.config.first_layers(num_layers);
  m.weights.embed_tokens = target.weights.embed_tokens;
  m.weights.layers.assign(target.weights.layers.begin(), target.weights.layers.begin() + num_layers);
  m.weights.norm = target.weights.norm;
  m.weights.lm_head = target.weights.lm_head;
  return m;
}

}  // namespace kvp
