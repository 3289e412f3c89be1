#include "model/model_config.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/presets.h"

namespace kvp {
namespace {

nlohmann::json good() { return preset_config("tiny")->to_json(); }

void expect_error(const nlohmann::json& j, const std::string& fragment) {
  auto c = ModelConfig::from_json(j);
  ASSERT_FALSE(c.is_ok()) << j.dump();
  EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status().message();
}

TEST(ModelConfig, RoundTripsThroughJson) {
  auto c = ModelConfig::from_json(good());
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(*c, *preset_config("tiny"));
}

TEST(ModelConfig, HeadDimDefaultsToHiddenOverHeads) {
  auto j = good();
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  auto c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 8);  // absent means multi-head attention
}

TEST(ModelConfig, RejectsBadValuesNamingTheKey) {
  auto j = good();
  j.erase("vocab_size");
  expect_error(j, "missing required key 'vocab_size'");
  j = good();
  j["hidden_size"] = 0;
  expect_error(j, "hidden_size must be > 0");
  j = good();
  j["num_hidden_layers"] = "4";
  expect_error(j, "'num_hidden_layers' must be an integer");
  j = good();
  j["num_key_value_heads"] = 3;
  expect_error(j, "must be a multiple of num_key_value_heads");
  j = good();
  j["head_dim"] = 15;
  expect_error(j, "head_dim must be even");
  j = good();
  j["rms_norm_eps"] = -1;
  expect_error(j, "rms_norm_eps");
  j = good();
  j["rope_scaling"] = {{"type", "linear"}};
  expect_error(j, "key 'rope_scaling.factor' is required for rope type 'linear'");
  j["rope_scaling"] = {{"type", "su"}, {"factor", 2.0}};
  expect_error(j, "key 'rope_scaling.rope_type' = \"su\" is not implemented");
  j = good();
  j["hidden_act"] = "gelu";
  expect_error(j, "hidden_act");
  j = good();
  j["vocab_size"] = 1ll << 40;
  expect_error(j, "vocab_size");
  j = good();
  j["tie_word_embeddings"] = 1;
  expect_error(j, "tie_word_embeddings");
  expect_error(nlohmann::json::array(), "JSON object");
}

TEST(ModelConfig, KvBytesPerTokenCountsKAndVInEveryLayer) {
  ModelConfig c = *preset_config("tiny");
  // 2 (K, V) x 4 layers x 2 KV heads x 16 dims.
  EXPECT_EQ(c.kv_bytes_per_token(DType::kF32), 2 * 4 * 2 * 16 * 4);
  EXPECT_EQ(c.kv_bytes_per_token(DType::kBF16), 2 * 4 * 2 * 16 * 2);
}

// ModelConfig::validate's size limits on both sides: the largest value accepted, one more
// refused naming the key; and the smallest (1) accepted, 0 refused.
TEST(ModelConfig, SizeLimitsAcceptTheirLimitAndRefuseOnePast) {
  for (const auto& [key, max] : {std::pair<const char*, int64_t>{"vocab_size", int64_t{1} << 24},
                                 {"num_hidden_layers", 1024},
                                 {"intermediate_size", int64_t{1} << 24},
                                 {"max_position_embeddings", int64_t{1} << 24}}) {
    SCOPED_TRACE(key);
    auto j = good();
    j[key] = max;
    const auto at = ModelConfig::from_json(j);
    EXPECT_TRUE(at.is_ok()) << at.status().message();
    j[key] = max + 1;
    expect_error(j, key);
    j[key] = 1;
    EXPECT_TRUE(ModelConfig::from_json(j).is_ok());
    j[key] = 0;
    expect_error(j, key);
  }
}

// transformers v5's rope_parameters carries theta (and the scaling) inside it, with no
// top-level rope_theta: the config loads with its own theta, never the 10000 default.
TEST(ModelConfig, RopeParametersCarryTheirOwnTheta) {
  auto j = good();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  auto c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 32.0},          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
}

// A rope_scaling (or rope_parameters) missing a key its type requires is refused naming the
// key, never defaulted.
TEST(ModelConfig, RopeScalingMissingAKeyItsTypeRequiresIsRefusedByName) {
  const nlohmann::json llama3 = {{"rope_type", "llama3"},
                                 {"factor", 8.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 8192}};
  for (const char* spelling : {"rope_scaling", "rope_parameters"}) {
    auto j = good();
    j[spelling] = llama3;
    ASSERT_TRUE(ModelConfig::from_json(j).is_ok()) << spelling;
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      auto without = j;
      without[spelling].erase(key);
      SCOPED_TRACE(std::string(spelling) + " without " + key);
      expect_error(without, key);
    }
    j[spelling] = {{"rope_type", "linear"}};
    expect_error(j, "factor");
    // attention_factor (YaRN's and LongRoPE's attention scaling) is refused unless it is 1.
    j[spelling] = llama3;
    j[spelling]["attention_factor"] = 1.0;
    EXPECT_TRUE(ModelConfig::from_json(j).is_ok()) << spelling;
    j[spelling]["attention_factor"] = 1.25;
    expect_error(j, std::string(spelling) + ".attention_factor");
  }
}

// The keys docs/checkpoints.md lists in the paragraph that starts with `lead`.
std::vector<std::string> documented_keys(const std::string& lead) {
  std::ifstream in(std::string(KVPROOF_SOURCE_DIR) + "/docs/checkpoints.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto at = doc.find(lead);
  if (at == std::string::npos) return {};
  const std::string paragraph = doc.substr(at, doc.find("\n\n", at) - at);
  const std::string& list = paragraph;
  // Every `name` of lowercase letters and underscores (GCC 12 flags std::regex under ASan
  // with a false -Wmaybe-uninitialized, so the scan is by hand).
  std::vector<std::string> keys;
  for (std::size_t open = list.find('`'); open != std::string::npos;) {
    const std::size_t close = list.find('`', open + 1);
    if (close == std::string::npos) break;
    const std::string name = list.substr(open + 1, close - open - 1);
    if (!name.empty() && name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string::npos) {
      keys.push_back(name);
      open = list.find('`', close + 1);
    } else {
      open = close;  // a span that is not a key: its closing backtick may open the next
    }
  }
  return keys;
}

// Every key docs/checkpoints.md documents as refused is refused, naming it; null (and false,
// for the switches) is accepted.
TEST(ModelConfig, EveryKeyDocumentedAsRefusedIsRefused) {
  const auto set = documented_keys("Refused whenever set to anything but null (");
  const auto switches = documented_keys("Refused whenever set to anything but null or false:");
  EXPECT_EQ(set.size(), 12u);
  EXPECT_EQ(switches.size(), 5u);
  for (const auto* keys : {&set, &switches}) {
    for (const std::string& k : *keys) {
      SCOPED_TRACE(k);
      auto j = good();
      for (const nlohmann::json& value : {nlohmann::json(true), nlohmann::json(30.0), nlohmann::json("x")}) {
        j[k] = value;
        expect_error(j, "key '" + k + "'");
      }
      j[k] = nullptr;
      EXPECT_TRUE(ModelConfig::from_json(j).is_ok());
      j[k] = false;
      EXPECT_EQ(ModelConfig::from_json(j).is_ok(), keys == &switches);
    }
  }
}

}  // namespace
}  // namespace kvp
