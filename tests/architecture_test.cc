// The Llama-family architectures kvproof reads (Llama with rope scaling and biases, Qwen2,
// Mistral), checked against published facts: the models' config.json files as published,
// the llama3 rope formula evaluated independently, and the bias arithmetic.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "model/presets.h"
#include "model/rope.h"
#include "reference/reference_model.h"

namespace kvp {
namespace {

using nlohmann::json;

// ---- the published configs (Hugging Face Hub; snapshots cited in model/presets.cc) ----

const json kSmolLM2 = json::parse(R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
  "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": true,
  "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
  "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_interleaved": false, "rope_scaling": null, "rope_theta": 100000, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true, "vocab_size": 49152})");

const json kQwen25 = json::parse(R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true, "use_mrope": false,
  "use_sliding_window": false, "vocab_size": 151936})");

const json kLlama32 = json::parse(R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");

const json kTinyLlama = json::parse(R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632,
  "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 22, "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0", "use_cache": true, "vocab_size": 32000})");

TEST(Architectures, PublishedConfigsLoadAsTheirPresets) {
  for (const auto& [name, j] : {std::pair{"smollm2-135m", kSmolLM2},
                                {"qwen2.5-0.5b", kQwen25},
                                {"llama-3.2-1b", kLlama32},
                                {"tinyllama-1.1b", kTinyLlama}}) {
    auto c = ModelConfig::from_json(j);
    ASSERT_TRUE(c.is_ok()) << name << ": " << c.status().message();
    EXPECT_EQ(*c, *preset_config(name)) << name;
    // And the preset's own config.json reads back as itself.
    auto again = ModelConfig::from_json(c->to_json());
    ASSERT_TRUE(again.is_ok()) << name << ": " << again.status().message();
    EXPECT_EQ(*again, *c) << name;
  }
  const ModelConfig q = *ModelConfig::from_json(kQwen25);
  EXPECT_EQ(q.architecture, Architecture::kQwen2);
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.o_bias);
  EXPECT_EQ(q.group_size(), 7);
  EXPECT_EQ(q.head_dim, 64);
  const ModelConfig l = *ModelConfig::from_json(kLlama32);
  EXPECT_EQ(l.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(l.rope_scaling.factor, 32.0);
  EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(l.eos_token_ids, std::vector<int32_t>{128001});
}

void expect_refused(json j, const std::string& fragment) {
  auto c = ModelConfig::from_json(j);
  ASSERT_FALSE(c.is_ok()) << j.dump();
  EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status().message();
}

TEST(Architectures, UnimplementedArchitecturesAndKeysAreRefusedByName) {
  json j = kSmolLM2;
  j["architectures"] = {"GemmaForCausalLM"};
  j["model_type"] = "gemma";
  expect_refused(j, "GemmaForCausalLM is not supported");
  j = kSmolLM2;
  j.erase("architectures");
  j["model_type"] = "gemma";
  expect_refused(j, "'model_type': 'gemma' is not supported");
  j = kSmolLM2;
  j["model_type"] = "qwen2";
  expect_refused(j, "does not match architectures LlamaForCausalLM");
  j = kSmolLM2;
  j.erase("architectures");
  j.erase("model_type");
  expect_refused(j, "neither 'architectures' nor 'model_type'");

  const std::pair<const char*, json> math_keys[] = {
      {"final_logit_softcapping", 30.0},
      {"attn_logit_softcapping", 50.0},
      {"quantization_config", {{"quant_method", "gptq"}}},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"use_qk_norm", true},
      {"partial_rotary_factor", 0.5},
      {"hidden_act", "gelu"},
      {"sliding_window", 4096},
      {"layer_types", {"sliding_attention"}},
  };
  for (const auto& [key, value] : math_keys) {
    j = kSmolLM2;
    j[key] = value;
    expect_refused(j, std::string("key '") + key + "'");
  }
  j = kLlama32;
  j["rope_scaling"]["rope_type"] = "yarn";
  expect_refused(j, "key 'rope_scaling.rope_type' = \"yarn\" is not implemented");
  j = kLlama32;
  j["rope_scaling"]["rope_type"] = "dynamic";
  expect_refused(j, "\"dynamic\" is not implemented");
  j = kLlama32;
  j["rope_scaling"].erase("low_freq_factor");
  expect_refused(j, "'rope_scaling.low_freq_factor' is required");
  // Qwen2's window, read as transformers' Qwen2Config reads it (the published
  // Qwen2.5-0.5B config: use_sliding_window false, sliding_window 32768, max_window_layers
  // 24 of 24 layers): sliding_window counts only with use_sliding_window; then the layers from
  // max_window_layers on (or those layer_types names sliding_attention) are windowed.
  j = kQwen25;
  EXPECT_EQ(ModelConfig::from_json(j)->sliding_window, 0);
  j["use_sliding_window"] = true;  // every layer below max_window_layers 24: still no window
  EXPECT_EQ(ModelConfig::from_json(j)->sliding_window, 0);
  j["max_window_layers"] = 21;
  auto hybrid = ModelConfig::from_json(j);
  ASSERT_TRUE(hybrid.is_ok()) << hybrid.status().message();
  for (int64_t l = 0; l < 24; ++l) EXPECT_EQ(hybrid->layer_window(l), l >= 21 ? 32768 : 0) << "layer " << l;
  EXPECT_EQ(*ModelConfig::from_json(hybrid->to_json()), *hybrid);
  EXPECT_EQ(hybrid->to_json().at("max_window_layers"), 21);
  j.erase("max_window_layers");  // transformers' default: 28, past the 24 layers
  EXPECT_EQ(ModelConfig::from_json(j)->sliding_window, 0);
  j["max_window_layers"] = 0;  // every layer windowed: the same as Mistral's
  EXPECT_EQ(ModelConfig::from_json(j)->layer_window(0), 32768);
  EXPECT_TRUE(ModelConfig::from_json(j)->sliding_layers.empty());
  json types = json::array();
  for (int l = 0; l < 24; ++l) types.push_back(l % 3 == 2 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;  // layer_types wins over max_window_layers, in any pattern
  auto pattern = ModelConfig::from_json(j);
  ASSERT_TRUE(pattern.is_ok()) << pattern.status().message();
  for (int64_t l = 0; l < 24; ++l) EXPECT_EQ(pattern->layer_window(l), l % 3 == 2 ? 32768 : 0) << "layer " << l;
  EXPECT_EQ(*ModelConfig::from_json(pattern->to_json()), *pattern);
  EXPECT_FALSE(pattern->to_json().contains("max_window_layers"));  // not a prefix pattern
  EXPECT_EQ(pattern->first_layers(2).sliding_window, 0);           // a draft of two full layers
  EXPECT_EQ(pattern->first_layers(3).layer_window(2), 32768);
  j["layer_types"].erase(0);
  expect_refused(j, "key 'layer_types' has 23 entries for 24 layers");
  j["layer_types"] = types;
  j["layer_types"][0] = "chunked_attention";
  expect_refused(j, "\"chunked_attention\" is not implemented");
  j["layer_types"] = types;
  j["use_sliding_window"] = false;
  expect_refused(j, "names sliding_attention layers but use_sliding_window is false");
  j["use_sliding_window"] = true;
  j.erase("sliding_window");
  expect_refused(j, "sliding_window");
  j["sliding_window"] = 0;
  expect_refused(j, "key 'sliding_window' must be a positive integer with use_sliding_window, got 0");
  j = kSmolLM2;
  j["layer_types"] = json::array();
  for (int l = 0; l < 30; ++l) j["layer_types"].push_back("sliding_attention");
  expect_refused(j, "only full_attention layers are");  // Llama has no window
  ModelConfig mistral_hybrid = *hybrid;
  mistral_hybrid.architecture = Architecture::kMistral;
  mistral_hybrid.qkv_bias = false;
  EXPECT_NE(mistral_hybrid.validate().message().find("per-layer windows (layer_types) are Qwen2ForCausalLM's"),
            std::string::npos);
  j = kSmolLM2;
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["sliding_window"] = nullptr;
  EXPECT_TRUE(ModelConfig::from_json(j).is_ok());  // Mistral without a window is Llama's math
  EXPECT_EQ(ModelConfig::from_json(j)->sliding_window, 0);
  // Mistral's window is read (mistralai/Mistral-7B-v0.1's config.json: 4096), written back and
  // validated; Llama has none, so a value there is refused.
  j["sliding_window"] = 4096;
  auto mistral = ModelConfig::from_json(j);
  ASSERT_TRUE(mistral.is_ok()) << mistral.status().message();
  EXPECT_EQ(mistral->sliding_window, 4096);
  EXPECT_EQ(mistral->layer_window(0), 4096);
  EXPECT_EQ(mistral->to_json().at("sliding_window"), 4096);
  EXPECT_EQ(*ModelConfig::from_json(mistral->to_json()), *mistral);
  for (const json& bad : {json(0), json(-5), json("4096"), json(4096.5)}) {
    j["sliding_window"] = bad;
    expect_refused(j, "sliding_window");
  }
  ModelConfig llama_with_window = *mistral;
  llama_with_window.architecture = Architecture::kLlama;
  EXPECT_NE(llama_with_window.validate().message().find("LlamaForCausalLM has none"), std::string::npos);
  j = kSmolLM2;
  j["eos_token_id"] = 49152;
  expect_refused(j, "eos_token_id 49152 is outside the vocabulary");
}

TEST(Architectures, KeysThatChangeNothingAreIgnoredAndLegacySpellingsRead) {
  json j = kTinyLlama;
  j["some_future_key"] = {1, 2, 3};
  j["attention_dropout"] = 0.1;
  EXPECT_TRUE(ModelConfig::from_json(j).is_ok());
  // Older configs name the rope type 'type'.
  j = kLlama32;
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "linear";
  auto c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  // eos as a list; generation_config.json replaces it.
  j = kLlama32;
  j["eos_token_id"] = {128001, 128008, 128009};
  c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  ASSERT_TRUE(c->apply_generation_config(json{{"eos_token_id", 128009}, {"temperature", 0.6}}).is_ok());
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{128009});
  EXPECT_FALSE(c->apply_generation_config(json{{"eos_token_id", "x"}}).is_ok());
}

// ---- rope scaling against the published formula ----

TEST(Rope, Llama3TableMatchesThePublishedFormulaAtKnownPoints) {
  // Llama-3.2-1B (theta 5e5, head_dim 64, factor 32, low/high 1/4, original 8192); expected
  // values evaluated in double, independently, from transformers' _compute_llama3_parameters:
  // pairs 0-14 keep theta^(-2i/64) (wavelength < 2048), 15-17 are blended, 18-31 are / 32.
  const ModelConfig c = *ModelConfig::from_json(kLlama32);
  const std::vector<double> f = rope_inv_freq<double>(c);
  ASSERT_EQ(f.size(), 32u);
  const std::pair<int, double> known[] = {
      {0, 1.0},
      {1, 0.6636012376960885},
      {14, 0.003211445994752591},
      {15, 0.001290547928209264},
      {16, 0.00042955679655936815},
      {17, 9.70828780262767e-05},
      {18, 1.9461638184831125e-05},
      {31, 9.41830672543491e-08},
  };
  for (const auto& [i, want] : known) EXPECT_NEAR(f[static_cast<std::size_t>(i)], want, 1e-15 * want) << "pair " << i;
  // The float table (the engines') is the double one to float precision.
  const std::vector<float> g = rope_inv_freq<float>(c);
  for (std::size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(g[i], f[i], 2e-6 * f[i]) << "pair " << i;
}

TEST(Rope, LinearDividesEveryFrequencyAndNoScalingKeepsTheEnginesBits) {
  ModelConfig c = *preset_config("tiny");
  const std::vector<float> plain = rope_inv_freq<float>(c);
  // The table the backends computed before rope scaling existed, bit for bit.
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    const float old = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
    EXPECT_EQ(std::memcmp(&old, &plain[static_cast<std::size_t>(i)], sizeof(float)), 0) << "pair " << i;
  }
  c.rope_scaling.type = RopeScaling::Type::kLinear;
  c.rope_scaling.factor = 4.0;
  const std::vector<double> plain64 = rope_inv_freq<double>(*preset_config("tiny"));
  const std::vector<double> scaled = rope_inv_freq<double>(c);
  for (std::size_t i = 0; i < scaled.size(); ++i) EXPECT_DOUBLE_EQ(scaled[i], plain64[i] / 4.0);
}

// ---- biases ----

ModelConfig mini(Architecture arch) {
  ModelConfig c = *preset_config("tiny");
  c.num_layers = 2;
  c.architecture = arch;
  c.qkv_bias = arch == Architecture::kQwen2;
  return c;
}

// A copy of `from`'s weights under config `to` (the biases, where `to` has them, zero).
Model rebias(const Model& from, const ModelConfig& to) {
  Model m = from;
  m.config = to;
  for (LayerWeights& l : m.weights.layers) {
    const auto zero_or_empty = [](VectorF& v, bool keep, Eigen::Index n) { v = keep ? VectorF::Zero(n) : VectorF(); };
    zero_or_empty(l.q_bias, to.qkv_bias, to.q_dim());
    zero_or_empty(l.k_bias, to.qkv_bias, to.kv_dim());
    zero_or_empty(l.v_bias, to.qkv_bias, to.kv_dim());
    zero_or_empty(l.o_bias, to.o_bias, to.hidden_size);
    zero_or_empty(l.gate_bias, to.mlp_bias, to.intermediate_size);
    zero_or_empty(l.up_bias, to.mlp_bias, to.intermediate_size);
    zero_or_empty(l.down_bias, to.mlp_bias, to.hidden_size);
  }
  return m;
}

ReferenceModel<double>::Matrix logits_of(const Model& m) {
  const ReferenceModel<double> ref(m);
  auto cache = ref.make_cache(8);
  const std::vector<int32_t> tokens = {5, 17, 300, 2, 99, 41};
  return *ref.forward(tokens, cache);
}

TEST(Biases, Qwen2WithZeroBiasesIsLlamaBitForBit) {
  const Model llama = make_random_model(mini(Architecture::kLlama), 3);
  const Model qwen = rebias(llama, mini(Architecture::kQwen2));
  ModelConfig both = mini(Architecture::kLlama);
  both.qkv_bias = both.o_bias = both.mlp_bias = true;
  const Model llama_biased = rebias(llama, both);
  const auto a = logits_of(llama);
  EXPECT_TRUE(a == logits_of(qwen));
  EXPECT_TRUE(a == logits_of(llama_biased));
}

TEST(Biases, EveryBiasIsAddedToItsProjection) {
  // A bias b on a projection W is the same as W x + b: with W's rows zero and b = c, the
  // projection's output is c whatever x. So a model whose v_proj is zero with v_bias c has
  // V = c at every position, attention returns c (softmax weights sum to 1), and the layer
  // adds o_proj c to the residual: the same as o_bias = o_proj c with v_proj = 0 and no v bias.
  ModelConfig c = mini(Architecture::kLlama);
  c.qkv_bias = c.o_bias = true;
  Model a = make_random_model(c, 4);
  for (LayerWeights& l : a.weights.layers) {
    l.v_proj.setZero();
    l.o_bias.setZero();
  }
  // Query head h reads KV head h / group: the attention output's head h is v_bias's KV head.
  Model b = a;
  for (std::size_t i = 0; i < b.weights.layers.size(); ++i) {
    const LayerWeights& la = a.weights.layers[i];
    LayerWeights& lb = b.weights.layers[i];
    VectorF per_head(c.q_dim());
    for (int64_t h = 0; h < c.num_heads; ++h)
      per_head.segment(h * c.head_dim, c.head_dim) = la.v_bias.segment((h / c.group_size()) * c.head_dim, c.head_dim);
    // In fp64, then stored as the float every weight is: the only rounding in this test.
    lb.o_bias = (la.o_proj.cast<double>() * per_head.cast<double>()).cast<float>();
    lb.v_bias.setZero();
  }
  const auto la = logits_of(a);
  const auto lb = logits_of(b);
  EXPECT_LT((la - lb).cwiseAbs().maxCoeff(), 1e-5 * la.cwiseAbs().maxCoeff());
  // And the bias is really read: without it the logits move.
  Model none = a;
  for (LayerWeights& l : none.weights.layers) l.v_bias.setZero();
  EXPECT_GT((la - logits_of(none)).cwiseAbs().maxCoeff(), 1e-2 * la.cwiseAbs().maxCoeff());
}

// ---- stop tokens ----

TEST(StopTokens, GenerationStopsAfterTheFirstEosOfTheList) {
  const Model m = *make_preset("tiny");
  const ReferenceModel<float> ref(m);
  const std::vector<int32_t> prompt = {5, 17, 300};
  const auto all = *reference_generate(ref, prompt, 12, {});
  ASSERT_EQ(all.tokens.size(), 12u);
  const int32_t eos = all.tokens[3];
  const auto first =
      static_cast<std::size_t>(std::find(all.tokens.begin(), all.tokens.end(), eos) - all.tokens.begin());
  const std::vector<int32_t> stops = {511, eos};  // a list, the second one generated
  const auto stopped = *reference_generate(ref, prompt, 12, {}, stops);
  ASSERT_EQ(stopped.tokens.size(), first + 1);
  EXPECT_TRUE(std::equal(stopped.tokens.begin(), stopped.tokens.end(), all.tokens.begin()));
  EXPECT_EQ(stopped.tokens.back(), eos);
}

}  // namespace
}  // namespace kvp
