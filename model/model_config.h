// The shape of a Llama-family decoder, as in a Hugging Face config.json.
//
// Architectures (config.json `architectures` / `model_type`), all the same decoder math:
//   LlamaForCausalLM / llama      rope_scaling none, "linear" or "llama3"; attention_bias
//                                 (q, k, v and o biases) and mlp_bias (gate, up, down)
//   Qwen2ForCausalLM / qwen2      q, k and v biases always; use_sliding_window false, or true
//                                 with sliding_window W and the layers `layer_types` names
//                                 sliding_attention (by default those from max_window_layers
//                                 on, transformers' Qwen2Config) attending to the last W
//   MistralForCausalLM / mistral  sliding_window null, or W: every layer attends to the last W
//                                 positions, itself included (windowed_attention_first())
//   Gemma2ForCausalLM / gemma2    Gemma's decoder (gemma() below): (1 + w) RMSNorm weights,
//                                 embeddings times sqrt(hidden), GeGLU with the tanh GELU,
//                                 sandwich norms around attention and the MLP, scores scaled
//                                 by query_pre_attn_scalar^-1/2, attention and final logit
//                                 soft-capping; layers alternate sliding (even) and full (odd)
//                                 unless layer_types says otherwise; tied embeddings
//   Gemma3ForCausalLM / gemma3_text  Gemma 2's decoder with q/k RMSNorm per head, no caps by
//                                 default, one full layer in sliding_window_pattern (6:
//                                 layers 5, 11, ...) or layer_types, and the sliding layers'
//                                 own RoPE base rope_local_base_freq (unscaled; rope_scaling
//                                 is the full layers')
// docs/checkpoints.md lists every key that is read, ignored or refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/dtype.h"
#include "common/status.h"

namespace kvp {

enum class Architecture { kLlama, kQwen2, kMistral, kGemma2, kGemma3 };

// config.json `architectures[0]` and `model_type` of each architecture.
const char* architecture_class_name(Architecture a);
const char* architecture_model_type(Architecture a);

// rope_scaling (Hugging Face modeling_rope_utils): how the rotary inverse frequencies
// theta^(-2i/D) are rescaled for long contexts. kNone leaves them as they are.
//   kLinear  every frequency divided by `factor` (position interpolation)
//   kLlama3  Llama 3.1/3.2: wavelengths above original_max / low_freq_factor divided by
//            `factor`, below original_max / high_freq_factor kept, smoothly blended between
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;

  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
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
  RopeScaling rope_scaling;
  // Biases of the projections (all fp32 vectors of the projection's output size).
  bool qkv_bias = false;  // q_proj, k_proj, v_proj: Qwen2 always, Llama with attention_bias
  bool o_bias = false;    // o_proj: Llama with attention_bias
  bool mlp_bias = false;  // gate_proj, up_proj, down_proj: Llama with mlp_bias
  // Sliding-window attention (Mistral's `sliding_window`): 0 for none, else W > 0, and every
  // layer's query at position p attends to positions max(0, p - W + 1) .. p, W of them
  // itself included: transformers' sliding_window_overlay, `kv_idx > q_idx - sliding_window`
  // (masking_utils.py), ANDed with the causal mask.
  int64_t sliding_window = 0;
  // Which layers attend through that window (a hybrid model: Qwen2's layer_types), one entry
  // per layer; empty: every layer (Mistral), or none when sliding_window is 0. Normalised by
  // from_json: empty when every layer is windowed, and no window at all when none is.
  std::vector<bool> sliding_layers;
  // Gemma 2 / Gemma 3 only (0 elsewhere; validate() refuses them on another architecture):
  // scores are scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2; a cap c > 0
  // maps a score or a final logit s to c * tanh(s / c) (Gemma2's soft-capping, after the
  // scale, before the mask); the sliding layers' RoPE base (Gemma 3; 0: rope_theta).
  double query_pre_attn_scalar = 0.0;
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  double rope_local_base_freq = 0.0;
  // Stop tokens: eos_token_id of config.json, replaced by generation_config.json's when that
  // file gives one (an integer or a list, as Hugging Face's generate reads them).
  std::vector<int32_t> eos_token_ids;

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
  // Gemma's decoder (Gemma 2 and 3): (1 + w) norms, scaled embeddings, GeGLU (tanh GELU),
  // four norms per layer. Gemma 3 adds q/k norms (qk_norm()).
  bool gemma() const { return architecture == Architecture::kGemma2 || architecture == Architecture::kGemma3; }
  bool qk_norm() const { return architecture == Architecture::kGemma3; }
  // The embedding's multiplier: fp32 sqrt(hidden_size) for Gemma (transformers multiplies by
  // a float32 tensor of hidden_size**0.5), else 1 (no multiply at all).
  float embed_scale() const;
  // The attention scores' scale, in fp32: query_pre_attn_scalar^-1/2 when set, else
  // 1 / sqrt(head_dim) as the backends always computed it.
  float attention_scale() const;
  // The RoPE base of layer `layer`: rope_local_base_freq for a sliding layer when set, else
  // rope_theta (and only then does rope_scaling apply: model/rope.h).
  bool layer_uses_local_rope(int64_t layer) const { return has_local_rope() && layer_window(layer) > 0; }
  // Whether some layer does (a local base, and a window on some layer).
  bool has_local_rope() const { return rope_local_base_freq > 0.0 && sliding_window > 0; }
  // The attention window of layer `layer`: 0 (all of the past) or sliding_window.
  int64_t layer_window(int64_t layer) const {
    if (sliding_window == 0 || sliding_layers.empty()) return sliding_window;
    return sliding_layers[static_cast<std::size_t>(layer)] ? sliding_window : 0;
  }
  // The window every layer attends through (0 when any layer sees the whole past): what the
  // paged engine may free blocks behind, since no layer of a later token reads them. A hybrid
  // model's full-attention layers keep every block (one block table serves all layers).
  int64_t kv_window() const { return sliding_layers.empty() ? sliding_window : 0; }
  // The same config with only its first n layers (a draft model's), their windows kept.
  // REQUIRES: 1 <= n <= num_layers.
  ModelConfig first_layers(int64_t n) const;

  // Hugging Face config.json of one of the architectures above. Keys that change nothing
  // here (dropout, initializer_range, use_cache, torch_dtype, bos_token_id, ...) are
  // ignored; required keys missing, of the wrong type or out of range are errors naming the
  // key. An architecture or model_type not listed above, and every key that would change
  // the math and is not implemented (another rope type, a window outside Mistral, logit
  // soft-capping, q/k norms, another activation, a quantization config, ...), is refused
  // with an error naming the key: silently ignoring it would give wrong numbers.
  static Result<ModelConfig> from_json(const nlohmann::json& j);
  // generation_config.json: only eos_token_id is read (it replaces the config's).
  Status apply_generation_config(const nlohmann::json& j);
  nlohmann::json to_json() const;
  // generation_config.json for to_json()'s config; empty when there are no stop tokens.
  nlohmann::json generation_config_json() const;

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace kvp
