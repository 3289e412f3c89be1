// Gemma 2 and Gemma 3 (text): their config.json as published, transformers' defaults, and the
// oracle's forward pass against a second, deliberately naive implementation written here
// from transformers' modelling code (modeling_gemma2.py / modeling_gemma3.py): loops over
// plain vectors in double, no Eigen products, no panels, no shared helpers with reference/.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "model/presets.h"
#include "reference/reference_model.h"

namespace kvp {
namespace {

using nlohmann::json;

// google/gemma-3-270m, config.json (Gemma3ForCausalLM; every key the math reads, as published).
const json kGemma3_270m = json::parse(R"({
  "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": 1,
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 640, "initializer_range": 0.02, "intermediate_size": 2048,
  "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                  "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                  "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
                  "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                  "sliding_attention", "full_attention"],
  "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
  "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": null, "rope_theta": 1000000.0,
  "sliding_window": 512, "torch_dtype": "bfloat16", "use_bidirectional_attention": false, "use_cache": true,
  "vocab_size": 262144})");

// google/gemma-3-1b-it, config.json: the older form, sliding_window_pattern instead of layer_types.
const json kGemma3_1b = json::parse(R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
  "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
  "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 262144})");

// google/gemma-2-2b, config.json (Gemma2ForCausalLM).
const json kGemma2_2b = json::parse(R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
  "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
  "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
  "use_cache": true, "vocab_size": 256000})");

TEST(Gemma, PublishedGemma3ConfigsLoadAsTheirPresets) {
  for (const auto& [name, j] : {std::pair{"gemma-3-270m", kGemma3_270m}, {"gemma-3-1b", kGemma3_1b}}) {
    auto c = ModelConfig::from_json(j);
    ASSERT_TRUE(c.is_ok()) << name << ": " << c.status().message();
    EXPECT_EQ(*c, *preset_config(name)) << name;
    auto again = ModelConfig::from_json(c->to_json());
    ASSERT_TRUE(again.is_ok()) << name << ": " << again.status().message();
    EXPECT_EQ(*again, *c) << name;
  }
  const ModelConfig c = *ModelConfig::from_json(kGemma3_270m);
  EXPECT_EQ(c.architecture, Architecture::kGemma3);
  EXPECT_TRUE(c.gemma());
  EXPECT_TRUE(c.qk_norm());
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.kv_window(), 0);  // a hybrid: the full layers keep every block
  for (int64_t l = 0; l < 18; ++l) EXPECT_EQ(c.layer_window(l), (l + 1) % 6 == 0 ? 0 : 512) << "layer " << l;
  EXPECT_TRUE(c.layer_uses_local_rope(0));
  EXPECT_FALSE(c.layer_uses_local_rope(5));
  EXPECT_EQ(c.attention_scale(), 0.0625f);
  EXPECT_EQ(c.embed_scale(), static_cast<float>(std::sqrt(640.0)));
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
}

TEST(Gemma, Gemma2ConfigReadsItsCapsAndAlternatingLayers) {
  auto c = ModelConfig::from_json(kGemma2_2b);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->architecture, Architecture::kGemma2);
  EXPECT_FALSE(c->qk_norm());
  EXPECT_EQ(c->attn_logit_softcapping, 50.0);
  EXPECT_EQ(c->final_logit_softcapping, 30.0);
  EXPECT_EQ(c->query_pre_attn_scalar, 256.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  for (int64_t l = 0; l < 26; ++l) EXPECT_EQ(c->layer_window(l), l % 2 == 0 ? 4096 : 0) << "layer " << l;
  EXPECT_FALSE(c->layer_uses_local_rope(0));  // one RoPE base
  auto again = ModelConfig::from_json(c->to_json());
  ASSERT_TRUE(again.is_ok()) << again.status().message();
  EXPECT_EQ(*again, *c);
  // transformers' defaults where keys are absent: caps 50 and 30, scalar 256, window 4096,
  // head_dim 256 (not hidden / heads), tied.
  json j = kGemma2_2b;
  for (const char* key :
       {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "sliding_window", "head_dim"})
    j.erase(key);
  auto d = ModelConfig::from_json(j);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(*d, *c);
  // null caps: none.
  j = kGemma2_2b;
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  EXPECT_EQ(ModelConfig::from_json(j)->attn_logit_softcapping, 0.0);
  EXPECT_EQ(ModelConfig::from_json(j)->final_logit_softcapping, 0.0);
}

// transformers v5 splits Gemma 3's rope by layer type: the full layers' entry is rope_scaling
// (with its theta), the sliding layers' theta is rope_local_base_freq.
TEST(Gemma, RopeParametersByLayerTypeAndTheOlderPattern) {
  json j = kGemma3_1b;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("rope_local_base_freq");
  j["sliding_window_pattern"] = 3;
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 2e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 5000.0}}}};
  auto c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->rope_theta, 2e6);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_local_base_freq, 5000.0);
  for (int64_t l = 0; l < 26; ++l) EXPECT_EQ(c->layer_window(l) > 0, (l + 1) % 3 != 0) << "layer " << l;
  j["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  auto bad = ModelConfig::from_json(j);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("rope_parameters.sliding_attention.rope_type"), std::string::npos)
      << bad.status().message();
}

TEST(Gemma, WhatGemmaCannotBeIsRefusedByName) {
  const auto refused = [](json j, const std::string& fragment) {
    auto c = ModelConfig::from_json(j);
    ASSERT_FALSE(c.is_ok()) << j.dump();
    EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status().message();
  };
  json j = kGemma3_270m;
  j["hidden_activation"] = "gelu";
  refused(j, "key 'hidden_activation'");
  j = kGemma3_270m;
  j["attention_bias"] = true;
  refused(j, "key 'attention_bias'");
  j = kGemma3_270m;
  j["use_bidirectional_attention"] = true;
  refused(j, "key 'use_bidirectional_attention'");
  j = kGemma3_270m;
  j["tie_word_embeddings"] = false;
  refused(j, "ties its LM head");
  j = kGemma3_270m;
  j["layer_types"].erase(0);
  refused(j, "'layer_types' has 17 entries for 18 layers");
  j = kGemma3_1b;
  j["sliding_window_pattern"] = 0;
  refused(j, "'sliding_window_pattern' must be > 0");
  j = kGemma3_270m;
  j["model_type"] = "gemma3";  // the multimodal Gemma3ForConditionalGeneration's
  refused(j, "'model_type': 'gemma3' is not supported");
  // Gemma's keys on another architecture would change its math: refused there.
  ModelConfig llama = *preset_config("tiny");
  llama.query_pre_attn_scalar = 16.0;
  EXPECT_FALSE(llama.validate().is_ok());
}

// ---- the naive Gemma, from transformers' modelling code ----

using Vec = std::vector<double>;

Vec row_of(const MatrixF& m, int64_t r) {
  Vec v(static_cast<std::size_t>(m.cols()));
  for (int64_t i = 0; i < m.cols(); ++i) v[static_cast<std::size_t>(i)] = m(r, i);
  return v;
}
Vec matvec(const MatrixF& w, const Vec& x) {
  Vec y(static_cast<std::size_t>(w.rows()), 0.0);
  for (int64_t r = 0; r < w.rows(); ++r)
    for (int64_t i = 0; i < w.cols(); ++i)
      y[static_cast<std::size_t>(r)] += double(w(r, i)) * x[static_cast<std::size_t>(i)];
  return y;
}
// Gemma2RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), the gain `1.0 + self.weight.float()`
// an fp32 add as transformers computes it (then widened: the rest runs in double).
Vec gemma_rms_norm(const Vec& x, const VectorF& w, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  ms /= static_cast<double>(x.size());
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    y[i] = x[i] / std::sqrt(ms + eps) * double(1.0f + w[static_cast<Eigen::Index>(i)]);
  return y;
}
double gelu_pytorch_tanh(double z) {
  const double pi = 3.14159265358979323846;
  return 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (z + 0.044715 * z * z * z)));
}
double cap(double s, double c) { return c > 0 ? c * std::tanh(s / c) : s; }
// rotate_half RoPE of one head at `pos` with base `theta` (default rope type).
void rope(double* h, int64_t d, int64_t pos, double theta) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle =
        static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    const double x1 = h[i], x2 = h[i + d / 2];
    h[i] = x1 * std::cos(angle) - x2 * std::sin(angle);
    h[i + d / 2] = x2 * std::cos(angle) + x1 * std::sin(angle);
  }
}

// Every position's logits of `tokens`, one token at a time with a growing K/V history.
std::vector<Vec> naive_gemma(const Model& m, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = m.config;
  const int64_t d = c.head_dim, group = c.num_heads / c.num_kv_heads;
  std::vector<std::vector<Vec>> keys(static_cast<std::size_t>(c.num_layers)), values(keys.size());  // [layer][pos]
  std::vector<Vec> out;
  for (std::size_t pos = 0; pos < tokens.size(); ++pos) {
    Vec x = row_of(m.weights.embed_tokens, tokens[pos]);
    const double normalizer = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));  // an fp32 tensor
    for (double& v : x) v *= normalizer;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& w = m.weights.layers[static_cast<std::size_t>(l)];
      const bool sliding = c.layer_window(l) > 0;
      const double theta = (c.architecture == Architecture::kGemma3 && sliding) ? c.rope_local_base_freq : c.rope_theta;
      const Vec h = gemma_rms_norm(x, w.input_layernorm, c.rms_norm_eps);
      Vec q = matvec(w.q_proj, h), k = matvec(w.k_proj, h);
      const Vec v = matvec(w.v_proj, h);
      for (int64_t head = 0; head < c.num_heads; ++head) {
        if (c.architecture == Architecture::kGemma3) {
          const Vec part =
              gemma_rms_norm(Vec(q.begin() + head * d, q.begin() + (head + 1) * d), w.q_norm, c.rms_norm_eps);
          std::copy(part.begin(), part.end(), q.begin() + head * d);
        }
        rope(q.data() + head * d, d, static_cast<int64_t>(pos), theta);
      }
      for (int64_t kvh = 0; kvh < c.num_kv_heads; ++kvh) {
        if (c.architecture == Architecture::kGemma3) {
          const Vec part =
              gemma_rms_norm(Vec(k.begin() + kvh * d, k.begin() + (kvh + 1) * d), w.k_norm, c.rms_norm_eps);
          std::copy(part.begin(), part.end(), k.begin() + kvh * d);
        }
        rope(k.data() + kvh * d, d, static_cast<int64_t>(pos), theta);
      }
      keys[static_cast<std::size_t>(l)].push_back(k);
      values[static_cast<std::size_t>(l)].push_back(v);
      // sliding_window_overlay: key j is seen by query pos when j > pos - W (and j <= pos).
      Vec attn(static_cast<std::size_t>(c.q_dim()), 0.0);
      for (int64_t head = 0; head < c.num_heads; ++head) {
        const int64_t kvh = head / group;
        std::vector<int64_t> seen;
        for (int64_t j = 0; j <= static_cast<int64_t>(pos); ++j)
          if (!sliding || j > static_cast<int64_t>(pos) - c.sliding_window) seen.push_back(j);
        Vec scores;
        for (int64_t j : seen) {
          double s = 0;
          for (int64_t e = 0; e < d; ++e)
            s += q[static_cast<std::size_t>(head * d + e)] *
                 keys[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)][static_cast<std::size_t>(kvh * d + e)];
          scores.push_back(cap(s * std::pow(c.query_pre_attn_scalar, -0.5), c.attn_logit_softcapping));
        }
        double mx = scores[0], sum = 0;
        for (double s : scores) mx = std::max(mx, s);
        for (double& s : scores) sum += (s = std::exp(s - mx));
        for (std::size_t i = 0; i < seen.size(); ++i)
          for (int64_t e = 0; e < d; ++e)
            attn[static_cast<std::size_t>(head * d + e)] +=
                scores[i] / sum *
                values[static_cast<std::size_t>(l)][static_cast<std::size_t>(seen[i])]
                      [static_cast<std::size_t>(kvh * d + e)];
      }
      const Vec o = gemma_rms_norm(matvec(w.o_proj, attn), w.post_attention_layernorm, c.rms_norm_eps);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      const Vec h2 = gemma_rms_norm(x, w.pre_feedforward_layernorm, c.rms_norm_eps);
      Vec g = matvec(w.gate_proj, h2);
      const Vec u = matvec(w.up_proj, h2);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = gelu_pytorch_tanh(g[i]) * u[i];
      const Vec mlp = gemma_rms_norm(matvec(w.down_proj, g), w.post_feedforward_layernorm, c.rms_norm_eps);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
    }
    Vec logits = matvec(m.weights.embed_tokens, gemma_rms_norm(x, m.weights.norm, c.rms_norm_eps));  // tied
    for (double& z : logits) z = cap(z, c.final_logit_softcapping);
    out.push_back(logits);
  }
  return out;
}

// A small config of each architecture with everything that differs from Llama switched on:
// head_dim (6) not hidden / heads (4), query_pre_attn_scalar (5) not head_dim, GQA, a window
// of 3 over a 9-token prompt, layer types mixed, caps that bend the scores and logits.
ModelConfig small_gemma(Architecture arch) {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = 23;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_layers = 3;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 6;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.query_pre_attn_scalar = 5.0;
  c.sliding_window = 3;
  if (arch == Architecture::kGemma2) {
    c.rope_theta = 10000.0;
    c.attn_logit_softcapping = 1.5;
    c.final_logit_softcapping = 2.0;
    c.sliding_layers = {true, false, true};
  } else {
    c.rope_theta = 1000000.0;
    c.rope_local_base_freq = 100.0;
    c.sliding_layers = {true, true, false};
  }
  return c;
}

TEST(Gemma, OracleMatchesANaiveGemmaWrittenFromTransformersDefinition) {
  const std::vector<int32_t> prompt = {3, 17, 5, 22, 0, 9, 9, 14, 1};
  for (Architecture arch : {Architecture::kGemma2, Architecture::kGemma3}) {
    const ModelConfig c = small_gemma(arch);
    ASSERT_TRUE(c.validate().is_ok()) << c.validate().message();
    const Model m = make_random_model(c, 7);
    const std::vector<Vec> want = naive_gemma(m, prompt);
    const ReferenceModel<double> oracle(m);
    // The block path (the whole prompt at once) and the per-token path.
    auto cache = oracle.make_cache(16);
    const auto block = oracle.forward(prompt, cache);
    ASSERT_TRUE(block.is_ok()) << block.status().message();
    auto cache1 = oracle.make_cache(16);
    const auto seq = oracle.forward_sequential(prompt, cache1);
    ASSERT_TRUE(seq.is_ok()) << seq.status().message();
    double worst = 0, spread = 0;
    for (std::size_t p = 0; p < prompt.size(); ++p) {
      for (int64_t v = 0; v < c.vocab_size; ++v) {
        const double w = want[p][static_cast<std::size_t>(v)];
        worst = std::max({worst, std::abs((*block)(static_cast<Eigen::Index>(p), v) - w),
                          std::abs((*seq)(static_cast<Eigen::Index>(p), v) - w)});
        spread = std::max(spread, std::abs(w));
      }
    }
    EXPECT_LT(worst, 1e-9) << architecture_class_name(arch);
    EXPECT_GT(spread, 0.1) << "logits too flat to tell anything apart";
    if (c.final_logit_softcapping > 0) {
      EXPECT_LT(spread, c.final_logit_softcapping);
    }
  }
}

}  // namespace
}  // namespace kvp
