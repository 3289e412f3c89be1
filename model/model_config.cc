#include "model/model_config.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace kvp {

namespace {

constexpr int64_t kMaxDim = int64_t{1} << 24;  // any single dimension
constexpr int64_t kMaxElements = int64_t{1} << 40;

Status positive(const char* name, int64_t v, int64_t max = kMaxDim) {
  if (v <= 0) return Status::error(std::string(name) + " must be > 0, got " + std::to_string(v));
  if (v > max)
    return Status::error(std::string(name) + " is " + std::to_string(v) + ", above the limit " + std::to_string(max));
  return Status::ok();
}

Result<int64_t> get_int(const nlohmann::json& j, const char* key, std::optional<int64_t> fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return Status::error(std::string("missing required key '") + key + "'");
  }
  if (!it->is_number_integer())
    return Status::error(std::string("key '") + key + "' must be an integer, got " + it->dump());
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(kMaxElements))
    return Status::error(std::string("key '") + key + "' is out of range: " + it->dump());
  return it->get<int64_t>();
}

Result<double> get_number(const nlohmann::json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) return Status::error(std::string("key '") + key + "' must be a number, got " + it->dump());
  return it->get<double>();
}

}  // namespace

Status ModelConfig::validate() const {
  KVP_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  KVP_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  KVP_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  KVP_RETURN_IF_ERROR(positive("num_hidden_layers", num_layers, 1024));
  KVP_RETURN_IF_ERROR(positive("num_attention_heads", num_heads, 4096));
  KVP_RETURN_IF_ERROR(positive("num_key_value_heads", num_kv_heads, 4096));
  KVP_RETURN_IF_ERROR(positive("head_dim", head_dim, 65536));
  KVP_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  if (num_heads % num_kv_heads != 0)
    return Status::error("num_attention_heads (" + std::to_string(num_heads) +
                         ") must be a multiple of num_key_value_heads (" + std::to_string(num_kv_heads) + ")");
  if (head_dim % 2 != 0)
    return Status::error("head_dim must be even for rotary embeddings, got " + std::to_string(head_dim));
  if (!(std::isfinite(rope_theta) && rope_theta > 1.0))
    return Status::error("rope_theta must be finite and > 1, got " + std::to_string(rope_theta));
  if (!(std::isfinite(rms_norm_eps) && rms_norm_eps > 0.0 && rms_norm_eps < 1.0))
    return Status::error("rms_norm_eps must be in (0, 1), got " + std::to_string(rms_norm_eps));
  // Every weight's element count must fit comfortably: the largest are embed/lm_head
  // (vocab x hidden), q/o (q_dim x hidden) and the MLP (intermediate x hidden).
  for (int64_t rows : {vocab_size, q_dim(), intermediate_size}) {
    if (rows > kMaxElements / hidden_size)
      return Status::error("a weight of " + std::to_string(rows) + " x " + std::to_string(hidden_size) +
                           " elements is too large");
  }
  return Status::ok();
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size;
  const int64_t per_layer = h * q_dim() * 2 + h * kv_dim() * 2 + 3 * h * intermediate_size + 2 * h;
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) + num_layers * per_layer + h;
}

Result<ModelConfig> ModelConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return Status::error("config must be a JSON object");
  ModelConfig c;
  auto take = [&](int64_t& field, const char* key, std::optional<int64_t> fallback) -> Status {
    auto v = get_int(j, key, fallback);
    if (!v) return v.status();
    field = *v;
    return Status::ok();
  };
  KVP_RETURN_IF_ERROR(take(c.vocab_size, "vocab_size", std::nullopt));
  KVP_RETURN_IF_ERROR(take(c.hidden_size, "hidden_size", std::nullopt));
  KVP_RETURN_IF_ERROR(take(c.intermediate_size, "intermediate_size", std::nullopt));
  KVP_RETURN_IF_ERROR(take(c.num_layers, "num_hidden_layers", std::nullopt));
  KVP_RETURN_IF_ERROR(take(c.num_heads, "num_attention_heads", std::nullopt));
  KVP_RETURN_IF_ERROR(take(c.num_kv_heads, "num_key_value_heads", c.num_heads));
  std::optional<int64_t> default_head_dim;
  if (c.num_heads > 0 && c.hidden_size % c.num_heads == 0) default_head_dim = c.hidden_size / c.num_heads;
  KVP_RETURN_IF_ERROR(take(c.head_dim, "head_dim", default_head_dim));
  KVP_RETURN_IF_ERROR(take(c.max_position_embeddings, "max_position_embeddings", std::nullopt));

  auto theta = get_number(j, "rope_theta", 10000.0);
  if (!theta) return theta.status();
  c.rope_theta = *theta;
  auto eps = get_number(j, "rms_norm_eps", 1e-6);
  if (!eps) return eps.status();
  c.rms_norm_eps = *eps;

  if (auto it = j.find("tie_word_embeddings"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return Status::error("key 'tie_word_embeddings' must be a boolean, got " + it->dump());
    c.tie_word_embeddings = it->get<bool>();
  }
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "silu" && *it != "swish"))
      return Status::error("hidden_act must be \"silu\" (SwiGLU), got " + it->dump());
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null())
    return Status::error("rope_scaling is not supported by the reference model, got " + it->dump());
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null() && *it != false)
      return Status::error(std::string(key) + " is not supported by the reference model");
  }
  KVP_RETURN_IF_ERROR(c.validate());
  return c;
}

nlohmann::json ModelConfig::to_json() const {
  return nlohmann::json{
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},
      {"num_key_value_heads", num_kv_heads},
      {"head_dim", head_dim},
      {"rope_theta", rope_theta},
      {"rms_norm_eps", rms_norm_eps},
      {"max_position_embeddings", max_position_embeddings},
      {"tie_word_embeddings", tie_word_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"torch_dtype", "float32"},
  };
}

}  // namespace kvp
