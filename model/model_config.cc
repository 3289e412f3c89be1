#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>

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

Status not_implemented(const std::string& key, const nlohmann::json& value, const std::string& why = "") {
  return Status::error(
      "key '" + key + "' = " + value.dump() + " is not implemented" +
      (why.empty() ? std::string(" (it would change the math; refusing rather than ignoring it)") : " (" + why + ")"));
}

bool is_set(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && !it->is_null();
}

Result<bool> get_bool(const nlohmann::json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Status::error(std::string("key '") + key + "' must be a boolean, got " + it->dump());
  return it->get<bool>();
}

constexpr Architecture kArchitectures[] = {Architecture::kLlama, Architecture::kQwen2, Architecture::kMistral,
                                           Architecture::kGemma2, Architecture::kGemma3};

std::string supported_architectures() {
  std::string out;
  for (Architecture a : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(architecture_class_name(a));
  return out;
}

Result<Architecture> read_architecture(const nlohmann::json& j) {
  std::optional<Architecture> by_class, by_type;
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 1 || !(*it)[0].is_string())
      return Status::error("key 'architectures' must be a list of one class name, got " + it->dump());
    const std::string name = (*it)[0].get<std::string>();
    for (Architecture a : kArchitectures)
      if (name == architecture_class_name(a)) by_class = a;
    if (!by_class)
      return Status::error("key 'architectures': " + name +
                           " is not supported (supported: " + supported_architectures() + ")");
  }
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return Status::error("key 'model_type' must be a string, got " + it->dump());
    const std::string type = it->get<std::string>();
    for (Architecture a : kArchitectures)
      if (type == architecture_model_type(a)) by_type = a;
    if (!by_type)
      return Status::error("key 'model_type': '" + type +
                           "' is not supported (llama, qwen2, mistral, gemma2, gemma3_text are)");
  }
  if (by_class && by_type && *by_class != *by_type)
    return Status::error(std::string("key 'model_type': '") + architecture_model_type(*by_type) +
                         "' does not match architectures " + architecture_class_name(*by_class));
  if (by_class) return *by_class;
  if (by_type) return *by_type;
  return Status::error("neither 'architectures' nor 'model_type' is given: cannot tell which model this is");
}

// rope_scaling, or transformers v5's rope_parameters (which also carries rope_theta).
Status read_rope(const nlohmann::json& j, ModelConfig& c) {
  const char* key = is_set(j, "rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!is_set(j, key)) return Status::ok();
  const bool by_layer_type = j.at(key).is_object() && j.at(key).contains("full_attention");
  // transformers v5 splits Gemma's rope_parameters by layer type: the full layers' are these
  // (the sliding layers' are read by read_gemma).
  const nlohmann::json& r = by_layer_type ? j.at(key).at("full_attention") : j.at(key);
  const std::string where = std::string(key) + (by_layer_type ? ".full_attention." : ".");
  if (!r.is_object()) return Status::error(std::string("key '") + key + "' must be an object or null, got " + r.dump());
  std::string type = "default";
  for (const char* type_key : {"rope_type", "type"}) {
    if (auto it = r.find(type_key); it != r.end() && !it->is_null()) {
      if (!it->is_string()) return Status::error("key '" + where + type_key + "' must be a string, got " + it->dump());
      type = it->get<std::string>();
      break;
    }
  }
  if (auto it = r.find("rope_theta"); it != r.end() && !it->is_null()) {
    if (!it->is_number()) return Status::error("key '" + where + "rope_theta' must be a number, got " + it->dump());
    c.rope_theta = it->get<double>();
  }
  if (auto it = r.find("attention_factor"); it != r.end() && !it->is_null() && *it != 1.0)
    return not_implemented(where + "attention_factor", *it);
  const auto number = [&](const char* k, double& out) -> Status {
    auto v = get_number(r, k, std::numeric_limits<double>::quiet_NaN());
    if (!v) return v.status().with_context(key);
    if (std::isnan(*v)) return Status::error("key '" + where + k + "' is required for rope type '" + type + "'");
    out = *v;
    return Status::ok();
  };
  if (type == "default") return Status::ok();
  if (type == "linear") {
    c.rope_scaling.type = RopeScaling::Type::kLinear;
    return number("factor", c.rope_scaling.factor);
  }
  if (type == "llama3") {
    RopeScaling& s = c.rope_scaling;
    s.type = RopeScaling::Type::kLlama3;
    KVP_RETURN_IF_ERROR(number("factor", s.factor));
    KVP_RETURN_IF_ERROR(number("low_freq_factor", s.low_freq_factor));
    KVP_RETURN_IF_ERROR(number("high_freq_factor", s.high_freq_factor));
    auto orig = get_int(r, "original_max_position_embeddings", std::nullopt);
    if (!orig) return orig.status().with_context(key);
    s.original_max_position_embeddings = *orig;
    return Status::ok();
  }
  return not_implemented(where + "rope_type", type, "rope types default, linear and llama3 are");
}

Result<std::vector<int32_t>> read_eos(const nlohmann::json& j) {
  std::vector<int32_t> ids;
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return ids;
  const auto one = [&](const nlohmann::json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return Status::error("key 'eos_token_id' must be a token id or a list of them, got " + it->dump());
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return Status::ok();
  };
  if (it->is_array()) {
    for (const auto& v : *it) KVP_RETURN_IF_ERROR(one(v));
  } else {
    KVP_RETURN_IF_ERROR(one(*it));
  }
  return ids;
}

// Keys that change the math in some architecture of the Llama family and that kvproof does
// not implement; each is refused when set to anything but its neutral value.
Status refuse_unimplemented(const nlohmann::json& j, Architecture arch) {
  const bool gemma = arch == Architecture::kGemma2 || arch == Architecture::kGemma3;
  // Gemma's MLP is GeGLU with PyTorch's tanh GELU (transformers reads hidden_activation;
  // configs carry hidden_act beside it); every other architecture's is SwiGLU.
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (gemma) {
      if (*it != "gelu_pytorch_tanh") return not_implemented(key, *it, "Gemma's gelu_pytorch_tanh is");
    } else if (std::string_view(key) == "hidden_activation" || !it->is_string() || (*it != "silu" && *it != "swish")) {
      return not_implemented(key, *it, "only silu (SwiGLU) is");
    }
  }
  for (const char* key :
       {"quantization_config", "dual_chunk_attention_config", "attention_chunk_size", "no_rope_layers",
        "embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier"}) {
    if (is_set(j, key)) return not_implemented(key, j.at(key));
  }
  // Gemma's own keys (read by read_gemma); on another architecture they would change the math.
  if (!gemma) {
    for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar"})
      if (is_set(j, key)) return not_implemented(key, j.at(key));
  }
  for (const char* key :
       {"use_qk_norm", "qk_norm", "qk_layernorm", "use_mrope", "use_sliding_window", "use_bidirectional_attention"}) {
    // Qwen2's window is read by from_json.
    if (arch == Architecture::kQwen2 && std::string_view(key) == "use_sliding_window") continue;
    if (auto it = j.find(key); it != j.end() && !it->is_null() && *it != false) return not_implemented(key, *it);
  }
  if (auto it = j.find("partial_rotary_factor"); it != j.end() && !it->is_null() && *it != 1.0)
    return not_implemented("partial_rotary_factor", *it);
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Status::error("key 'layer_types' must be a list, got " + it->dump());
    const bool windows = arch == Architecture::kQwen2 || gemma;
    for (const auto& t : *it) {
      if (t == "full_attention" || (windows && t == "sliding_attention")) continue;
      return not_implemented(
          "layer_types", t,
          windows ? "only full_attention and sliding_attention layers are" : "only full_attention layers are");
    }
  }
  // Qwen2 reads sliding_window only when use_sliding_window is true, Mistral and Gemma always
  // (from_json); Llama's modelling code has no window, so a value there is refused rather
  // than guessed at.
  if (arch == Architecture::kLlama && is_set(j, "sliding_window"))
    return not_implemented("sliding_window", j.at("sliding_window"), "LlamaForCausalLM has no attention window");
  return Status::ok();
}

}  // namespace

const char* architecture_class_name(Architecture a) {
  switch (a) {
    case Architecture::kLlama: return "LlamaForCausalLM";
    case Architecture::kQwen2: return "Qwen2ForCausalLM";
    case Architecture::kMistral: return "MistralForCausalLM";
    case Architecture::kGemma2: return "Gemma2ForCausalLM";
    case Architecture::kGemma3: return "Gemma3ForCausalLM";
  }
  return "?";
}

const char* architecture_model_type(Architecture a) {
  switch (a) {
    case Architecture::kLlama: return "llama";
    case Architecture::kQwen2: return "qwen2";
    case Architecture::kMistral: return "mistral";
    case Architecture::kGemma2: return "gemma2";
    case Architecture::kGemma3: return "gemma3_text";
  }
  return "?";
}

Status ModelConfig::validate() const {
  KVP_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  KVP_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  KVP_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  KVP_RETURN_IF_ERROR(positive("num_hidden_layers", num_layers, 1024));
  KVP_RETURN_IF_ERROR(positive("num_attention_heads", num_heads, 4096));
  KVP_RETURN_IF_ERROR(positive("num_key_value_heads", num_kv_heads, 4096));
  KVP_RETURN_IF_ERROR(positive("head_dim", head_dim, 65536));
  KVP_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  if (sliding_window != 0) {
    KVP_RETURN_IF_ERROR(positive("sliding_window", sliding_window));
    if (architecture == Architecture::kLlama)
      return Status::error("sliding_window is MistralForCausalLM's and Qwen2ForCausalLM's; LlamaForCausalLM has none");
  }
  if (!sliding_layers.empty()) {
    if (architecture != Architecture::kQwen2 && !gemma())
      return Status::error(std::string("per-layer windows (layer_types) are Qwen2ForCausalLM's and Gemma's; ") +
                           architecture_class_name(architecture) + " windows every layer or none");
    if (sliding_window == 0) return Status::error("layers named sliding without a sliding_window");
    if (static_cast<int64_t>(sliding_layers.size()) != num_layers)
      return Status::error("sliding layers listed for " + std::to_string(sliding_layers.size()) + " of " +
                           std::to_string(num_layers) + " layers");
  }
  if (num_heads % num_kv_heads != 0)
    return Status::error("num_attention_heads (" + std::to_string(num_heads) +
                         ") must be a multiple of num_key_value_heads (" + std::to_string(num_kv_heads) + ")");
  if (head_dim % 2 != 0)
    return Status::error("head_dim must be even for rotary embeddings, got " + std::to_string(head_dim));
  if (!(std::isfinite(rope_theta) && rope_theta > 1.0))
    return Status::error("rope_theta must be finite and > 1, got " + std::to_string(rope_theta));
  if (!(std::isfinite(rms_norm_eps) && rms_norm_eps > 0.0 && rms_norm_eps < 1.0))
    return Status::error("rms_norm_eps must be in (0, 1), got " + std::to_string(rms_norm_eps));
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone: break;
    case RopeScaling::Type::kLinear:
    case RopeScaling::Type::kLlama3: {
      const RopeScaling& r = rope_scaling;
      if (!(std::isfinite(r.factor) && r.factor > 0.0))
        return Status::error("rope_scaling.factor must be finite and > 0, got " + std::to_string(r.factor));
      if (r.type == RopeScaling::Type::kLinear) break;
      if (!(std::isfinite(r.low_freq_factor) && r.low_freq_factor > 0.0 && std::isfinite(r.high_freq_factor) &&
            r.high_freq_factor > r.low_freq_factor))
        return Status::error("rope_scaling needs 0 < low_freq_factor < high_freq_factor, got " +
                             std::to_string(r.low_freq_factor) + " and " + std::to_string(r.high_freq_factor));
      KVP_RETURN_IF_ERROR(
          positive("rope_scaling.original_max_position_embeddings", r.original_max_position_embeddings));
      break;
    }
  }
  switch (architecture) {
    case Architecture::kLlama:
      if (qkv_bias != o_bias)
        return Status::error("LlamaForCausalLM has q/k/v and o biases together (attention_bias) or none");
      break;
    case Architecture::kQwen2:
      if (!qkv_bias || o_bias || mlp_bias)
        return Status::error("Qwen2ForCausalLM has q/k/v biases and no o_proj or MLP biases");
      break;
    case Architecture::kMistral:
    case Architecture::kGemma2:
    case Architecture::kGemma3:
      if (qkv_bias || o_bias || mlp_bias)
        return Status::error(std::string(architecture_class_name(architecture)) + " has no biases");
      break;
  }
  const auto non_negative = [](const char* name, double v) -> Status {
    if (!(std::isfinite(v) && v >= 0.0))
      return Status::error(std::string(name) + " must be finite and >= 0 (0: none), got " + std::to_string(v));
    return Status::ok();
  };
  KVP_RETURN_IF_ERROR(non_negative("query_pre_attn_scalar", query_pre_attn_scalar));
  KVP_RETURN_IF_ERROR(non_negative("attn_logit_softcapping", attn_logit_softcapping));
  KVP_RETURN_IF_ERROR(non_negative("final_logit_softcapping", final_logit_softcapping));
  KVP_RETURN_IF_ERROR(non_negative("rope_local_base_freq", rope_local_base_freq));
  if (!gemma() && (query_pre_attn_scalar != 0.0 || attn_logit_softcapping != 0.0 || final_logit_softcapping != 0.0))
    return Status::error("query_pre_attn_scalar and logit soft-capping are Gemma's; " +
                         std::string(architecture_class_name(architecture)) + " has neither");
  if (architecture != Architecture::kGemma3 && rope_local_base_freq != 0.0)
    return Status::error("rope_local_base_freq is Gemma3ForCausalLM's");
  if (rope_local_base_freq != 0.0 && !(rope_local_base_freq > 1.0))
    return Status::error("rope_local_base_freq must be > 1, got " + std::to_string(rope_local_base_freq));
  if (gemma() && !tie_word_embeddings)
    return Status::error(std::string(architecture_class_name(architecture)) +
                         " ties its LM head to the embeddings (tie_word_embeddings true)");
  for (int32_t id : eos_token_ids) {
    if (id < 0 || id >= vocab_size)
      return Status::error("eos_token_id " + std::to_string(id) + " is outside the vocabulary [0, " +
                           std::to_string(vocab_size) + ")");
  }
  // Every weight's element count must fit comfortably: the largest are embed/lm_head
  // (vocab x hidden), q/o (q_dim x hidden) and the MLP (intermediate x hidden).
  for (int64_t rows : {vocab_size, q_dim(), intermediate_size}) {
    if (rows > kMaxElements / hidden_size)
      return Status::error("a weight of " + std::to_string(rows) + " x " + std::to_string(hidden_size) +
                           " elements is too large");
  }
  return Status::ok();
}

float ModelConfig::embed_scale() const {
  return gemma() ? static_cast<float>(std::sqrt(static_cast<double>(hidden_size))) : 1.0f;
}

float ModelConfig::attention_scale() const {
  // A scalar equal to head_dim keeps the backends' own fp32 formula (the same value up to its
  // last bit, and a plug-in computes that one).
  if (query_pre_attn_scalar > 0.0 && query_pre_attn_scalar != static_cast<double>(head_dim))
    return static_cast<float>(1.0 / std::sqrt(query_pre_attn_scalar));
  return 1.0f / std::sqrt(static_cast<float>(head_dim));
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size;
  int64_t per_layer = h * q_dim() * 2 + h * kv_dim() * 2 + 3 * h * intermediate_size + 2 * h;
  if (gemma()) per_layer += 2 * h;           // pre- and post-feedforward norms
  if (qk_norm()) per_layer += 2 * head_dim;  // q_norm, k_norm
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (o_bias) per_layer += h;
  if (mlp_bias) per_layer += 2 * intermediate_size + h;
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) + num_layers * per_layer + h;
}

namespace {

// layer_types: one entry per layer, true for sliding_attention (its entries were checked by
// refuse_unimplemented); empty when the key is absent or null.
Result<std::vector<bool>> read_layer_types(const nlohmann::json& j, int64_t num_layers) {
  std::vector<bool> sliding;
  auto it = j.find("layer_types");
  if (it == j.end() || it->is_null()) return sliding;
  if (static_cast<int64_t>(it->size()) != num_layers)
    return Status::error("key 'layer_types' has " + std::to_string(it->size()) + " entries for " +
                         std::to_string(num_layers) + " layers (num_hidden_layers)");
  for (const auto& t : *it) sliding.push_back(t == "sliding_attention");
  return sliding;
}

// The window W on the layers `sliding` marks, normalised as ModelConfig keeps it: no window
// when no layer has it, no per-layer list when every layer has it.
void set_windowed_layers(ModelConfig& c, int64_t window, std::vector<bool> sliding) {
  const auto windowed = std::count(sliding.begin(), sliding.end(), true);
  if (windowed == 0) return;
  c.sliding_window = window;
  if (windowed < static_cast<int64_t>(sliding.size())) c.sliding_layers = std::move(sliding);
}

// Qwen2's window, as transformers' Qwen2Config reads it: sliding_window counts only when
// use_sliding_window is true; then layer_types names each layer full_attention or
// sliding_attention, by default sliding_attention from layer max_window_layers (default 28)
// on. A sliding_attention layer without use_sliding_window would attend to everything there
// (no window): refused as contradictory rather than guessed at.
Status read_qwen2_window(const nlohmann::json& j, ModelConfig& c) {
  auto use = get_bool(j, "use_sliding_window", false);
  if (!use) return use.status();
  auto types = read_layer_types(j, c.num_layers);
  if (!types) return types.status();
  std::vector<bool> sliding = std::move(*types);
  if (!sliding.empty()) {
    const bool any = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
    if (any && !*use)
      return Status::error(
          "key 'layer_types' names sliding_attention layers but use_sliding_window is false (they would have no "
          "window)");
  }
  if (!*use) return Status::ok();
  auto window = get_int(j, "sliding_window", std::nullopt);
  if (!window) return window.status().with_context("use_sliding_window is true");
  if (*window <= 0)
    return Status::error("key 'sliding_window' must be a positive integer with use_sliding_window, got " +
                         std::to_string(*window));
  if (sliding.empty()) {
    auto first = get_int(j, "max_window_layers", int64_t{28});
    if (!first) return first.status();
    if (*first < 0) return Status::error("key 'max_window_layers' must be >= 0, got " + std::to_string(*first));
    for (int64_t l = 0; l < c.num_layers; ++l) sliding.push_back(l >= *first);
  }
  set_windowed_layers(c, *window, std::move(sliding));
  return Status::ok();
}

// A number key that may be null (none: 0) or absent (transformers' default).
Result<double> get_optional_number(const nlohmann::json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (it->is_null()) return 0.0;
  if (!it->is_number())
    return Status::error(std::string("key '") + key + "' must be a number or null, got " + it->dump());
  return it->get<double>();
}

// Gemma 2 and Gemma 3, as transformers' Gemma2Config and Gemma3TextConfig read them (their
// defaults where a key is absent): query_pre_attn_scalar (256), the caps (Gemma 2: 50 and
// 30; Gemma 3: none; null: none), sliding_window (4096), the layers' types from layer_types,
// else Gemma 2's alternation (layer l sliding when l is even: (l + 1) % 2 != 0) or Gemma 3's
// sliding_window_pattern P (default 6; the 270M config spells it _sliding_window_pattern):
// layer l sliding when (l + 1) % P != 0; Gemma 3's rope_local_base_freq (10000), or
// transformers v5's rope_parameters split by layer type.
Status read_gemma(const nlohmann::json& j, ModelConfig& c) {
  const bool g3 = c.architecture == Architecture::kGemma3;
  auto scalar = get_number(j, "query_pre_attn_scalar", 256.0);
  if (!scalar) return scalar.status();
  if (!(*scalar > 0.0)) return Status::error("key 'query_pre_attn_scalar' must be > 0, got " + std::to_string(*scalar));
  c.query_pre_attn_scalar = *scalar;
  auto attn_cap = get_optional_number(j, "attn_logit_softcapping", g3 ? 0.0 : 50.0);
  if (!attn_cap) return attn_cap.status();
  auto final_cap = get_optional_number(j, "final_logit_softcapping", g3 ? 0.0 : 30.0);
  if (!final_cap) return final_cap.status();
  if (*attn_cap < 0.0 || *final_cap < 0.0) return Status::error("logit soft-capping must be > 0 or null");
  c.attn_logit_softcapping = *attn_cap;
  c.final_logit_softcapping = *final_cap;
  if (g3) {
    auto local = get_number(j, "rope_local_base_freq", 10000.0);
    if (!local) return local.status();
    c.rope_local_base_freq = *local;
  }
  auto types = read_layer_types(j, c.num_layers);
  if (!types) return types.status();
  std::vector<bool> sliding = std::move(*types);
  if (sliding.empty()) {
    int64_t pattern = 2;
    if (g3) {
      const char* key = is_set(j, "sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
      auto p = get_int(j, key, int64_t{6});
      if (!p) return p.status();
      if (*p <= 0) return Status::error(std::string("key '") + key + "' must be > 0, got " + std::to_string(*p));
      pattern = *p;
    }
    for (int64_t l = 0; l < c.num_layers; ++l) sliding.push_back((l + 1) % pattern != 0);
  }
  auto window = get_int(j, "sliding_window", int64_t{4096});
  if (!window) return window.status();
  const auto windowed = std::count(sliding.begin(), sliding.end(), true);
  if (windowed > 0 && *window <= 0)
    return Status::error("key 'sliding_window' must be a positive integer, got " + std::to_string(*window));
  set_windowed_layers(c, *window, std::move(sliding));
  // transformers v5: rope_parameters {"full_attention": {...}, "sliding_attention": {...}}.
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object() && it->contains("sliding_attention")) {
    const nlohmann::json& local = it->at("sliding_attention");
    if (!local.is_object()) return Status::error("key 'rope_parameters.sliding_attention' must be an object");
    if (auto t = local.find("rope_type"); t != local.end() && !t->is_null() && *t != "default")
      return not_implemented("rope_parameters.sliding_attention.rope_type", *t, "the sliding layers' rope is default");
    auto theta = get_number(local, "rope_theta", g3 ? c.rope_local_base_freq : c.rope_theta);
    if (!theta) return theta.status().with_context("rope_parameters.sliding_attention");
    if (g3) {
      c.rope_local_base_freq = *theta;
    } else if (*theta != c.rope_theta) {
      return not_implemented("rope_parameters.sliding_attention.rope_theta", *theta,
                             "Gemma2ForCausalLM has one RoPE base");
    }
  }
  return Status::ok();
}

}  // namespace

ModelConfig ModelConfig::first_layers(int64_t n) const {
  KVP_CHECK(n >= 1 && n <= num_layers);
  ModelConfig c = *this;
  c.num_layers = n;
  if (!c.sliding_layers.empty()) {
    c.sliding_layers.resize(static_cast<std::size_t>(n));
    const auto windowed = std::count(c.sliding_layers.begin(), c.sliding_layers.end(), true);
    if (windowed == 0) c.sliding_window = 0;
    if (windowed == 0 || windowed == n) c.sliding_layers.clear();
  }
  return c;
}

Result<ModelConfig> ModelConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return Status::error("config must be a JSON object");
  ModelConfig c;
  auto arch = read_architecture(j);
  if (!arch) return arch.status();
  c.architecture = *arch;
  KVP_RETURN_IF_ERROR(refuse_unimplemented(j, c.architecture));

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
  // Gemma2Config and Gemma3TextConfig default head_dim to 256, whatever hidden / heads is.
  if (c.architecture == Architecture::kGemma2 || c.architecture == Architecture::kGemma3) default_head_dim = 256;
  KVP_RETURN_IF_ERROR(take(c.head_dim, "head_dim", default_head_dim));
  KVP_RETURN_IF_ERROR(take(c.max_position_embeddings, "max_position_embeddings", std::nullopt));

  auto theta = get_number(j, "rope_theta", c.architecture == Architecture::kGemma3 ? 1000000.0 : 10000.0);
  if (!theta) return theta.status();
  c.rope_theta = *theta;
  KVP_RETURN_IF_ERROR(read_rope(j, c));
  auto eps = get_number(j, "rms_norm_eps", 1e-6);
  if (!eps) return eps.status();
  c.rms_norm_eps = *eps;

  const bool gemma = c.architecture == Architecture::kGemma2 || c.architecture == Architecture::kGemma3;
  auto tied = get_bool(j, "tie_word_embeddings", gemma);  // Gemma's configs default to tied
  if (!tied) return tied.status();
  c.tie_word_embeddings = *tied;
  if (c.architecture == Architecture::kQwen2) {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o without, whatever the config says
  } else {
    auto attention_bias = get_bool(j, "attention_bias", false);
    if (!attention_bias) return attention_bias.status();
    auto mlp_bias = get_bool(j, "mlp_bias", false);
    if (!mlp_bias) return mlp_bias.status();
    if ((c.architecture == Architecture::kMistral || gemma) && (*attention_bias || *mlp_bias))
      return not_implemented(*attention_bias ? "attention_bias" : "mlp_bias", true,
                             std::string(architecture_class_name(c.architecture)) + " has no biases");
    c.qkv_bias = c.o_bias = *attention_bias;
    c.mlp_bias = *mlp_bias;
  }
  if (c.architecture == Architecture::kMistral) {
    KVP_RETURN_IF_ERROR(take(c.sliding_window, "sliding_window", int64_t{0}));
    if (is_set(j, "sliding_window") && c.sliding_window <= 0)
      return Status::error("key 'sliding_window' must be a positive integer or null, got " +
                           std::to_string(c.sliding_window));
  }
  if (c.architecture == Architecture::kQwen2) KVP_RETURN_IF_ERROR(read_qwen2_window(j, c));
  if (gemma) KVP_RETURN_IF_ERROR(read_gemma(j, c));
  auto eos = read_eos(j);
  if (!eos) return eos.status();
  c.eos_token_ids = std::move(*eos);
  KVP_RETURN_IF_ERROR(c.validate());
  return c;
}

Status ModelConfig::apply_generation_config(const nlohmann::json& j) {
  if (!j.is_object()) return Status::error("generation config must be a JSON object");
  auto eos = read_eos(j);
  if (!eos) return eos.status();
  if (j.contains("eos_token_id") && !j.at("eos_token_id").is_null()) eos_token_ids = std::move(*eos);
  return validate();
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j{
      {"architectures", {architecture_class_name(architecture)}},
      {"model_type", architecture_model_type(architecture)},
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
      {"hidden_act", gemma() ? "gelu_pytorch_tanh" : "silu"},
      {"torch_dtype", "float32"},
  };
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone: j["rope_scaling"] = nullptr; break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", rope_scaling.factor},
                           {"low_freq_factor", rope_scaling.low_freq_factor},
                           {"high_freq_factor", rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      break;
  }
  switch (architecture) {
    case Architecture::kLlama:
      j["attention_bias"] = qkv_bias;
      j["mlp_bias"] = mlp_bias;
      break;
    case Architecture::kQwen2: {
      j["use_sliding_window"] = sliding_window > 0;
      if (sliding_window == 0) break;
      j["sliding_window"] = sliding_window;
      nlohmann::json types = nlohmann::json::array();
      int64_t leading_full = 0;
      bool prefix_form = true;  // full layers first, then only sliding ones: max_window_layers says it
      for (int64_t l = 0; l < num_layers; ++l) {
        const bool windowed = layer_window(l) > 0;
        types.push_back(windowed ? "sliding_attention" : "full_attention");
        if (!windowed && leading_full == l) ++leading_full;
        if (!windowed && leading_full != l + 1) prefix_form = false;
      }
      j["layer_types"] = types;
      if (prefix_form) j["max_window_layers"] = leading_full;
      break;
    }
    case Architecture::kMistral:
      j["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json(nullptr);
      break;
    case Architecture::kGemma2:
    case Architecture::kGemma3: {
      j["hidden_activation"] = "gelu_pytorch_tanh";
      j["attention_bias"] = false;
      j["query_pre_attn_scalar"] = query_pre_attn_scalar;
      const auto cap = [](double v) { return v > 0.0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
      j["attn_logit_softcapping"] = cap(attn_logit_softcapping);
      j["final_logit_softcapping"] = cap(final_logit_softcapping);
      if (architecture == Architecture::kGemma3) j["rope_local_base_freq"] = rope_local_base_freq;
      // transformers needs a window for its sliding layers only; with none, every layer is full.
      j["sliding_window"] = sliding_window > 0 ? sliding_window : 4096;
      nlohmann::json types = nlohmann::json::array();
      for (int64_t l = 0; l < num_layers; ++l)
        types.push_back(layer_window(l) > 0 ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
      break;
    }
  }
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  return j;
}

nlohmann::json ModelConfig::generation_config_json() const {
  if (eos_token_ids.empty()) return nlohmann::json();
  nlohmann::json j{{"_from_model_config", true}};
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  return j;
}

}  // namespace kvp
