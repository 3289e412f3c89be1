#include "model/model_config.h"

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

}  // namespace
}  // namespace kvp
