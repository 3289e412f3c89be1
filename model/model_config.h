// The shape of a Llama-family decoder, as in a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "common/dtype.h"
#include "common/status.h"

namespace kvp {

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;    // config.json: num_hidden_layers
  int64_t num_heads = 0;     // config.json: num_attention_heads
  int64_t num_kv_heads = 0;  // config.json: num_key_value_heads (GQA; 1 = MQA)
  int64_t head_dim = 0;      // config.json: head_dim (defaults to hidden/heads)
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  // Every field positive and finite, num_heads % num_kv_heads == 0, head_dim even (RoPE
  // rotates pairs), sizes small enough that no tensor's element count overflows.
  Status validate() const;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Query heads per KV head.
  int64_t group_size() const { return num_heads / num_kv_heads; }
  // K and V, every layer, one token.
  int64_t kv_bytes_per_token(DType kv_dtype) const {
    return 2 * num_layers * kv_dim() * static_cast<int64_t>(dtype_size(kv_dtype));
  }
  int64_t num_parameters() const;

  // Hugging Face config.json (LlamaForCausalLM). Unknown keys are ignored; required
  // keys missing, of the wrong type or out of range are errors naming the key.
  // Rejects rope_scaling, attention/MLP biases and non-SiLU activations: the reference
  // does not implement them, and silently ignoring them would give wrong numbers.
  static Result<ModelConfig> from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace kvp
