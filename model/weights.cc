#include "model/weights.h"

#include "common/dtype.h"

namespace kvp {

ModelWeights allocate_weights(const ModelConfig& c, bool zeroed) {
  KVP_CHECK(c.validate().is_ok());
  const auto h = static_cast<Eigen::Index>(c.hidden_size);
  const auto q = static_cast<Eigen::Index>(c.q_dim());
  const auto kv = static_cast<Eigen::Index>(c.kv_dim());
  const auto inter = static_cast<Eigen::Index>(c.intermediate_size);
  const auto vocab = static_cast<Eigen::Index>(c.vocab_size);
  const auto mat = [zeroed](Eigen::Index rows, Eigen::Index cols) {
    return zeroed ? MatrixF(MatrixF::Zero(rows, cols)) : MatrixF(rows, cols);
  };
  const auto vec = [zeroed](Eigen::Index n) { return zeroed ? VectorF(VectorF::Zero(n)) : VectorF(n); };
  ModelWeights w;
  w.embed_tokens = mat(vocab, h);
  w.layers.resize(static_cast<std::size_t>(c.num_layers));
  for (auto& l : w.layers) {
    l.input_layernorm = vec(h);
    l.q_proj = mat(q, h);
    l.k_proj = mat(kv, h);
    l.v_proj = mat(kv, h);
    l.o_proj = mat(h, q);
    l.post_attention_layernorm = vec(h);
    l.gate_proj = mat(inter, h);
    l.up_proj = mat(inter, h);
    l.down_proj = mat(h, inter);
    if (c.qkv_bias) {
      l.q_bias = vec(q);
      l.k_bias = vec(kv);
      l.v_bias = vec(kv);
    }
    if (c.o_bias) l.o_bias = vec(h);
    if (c.mlp_bias) {
      l.gate_bias = vec(inter);
      l.up_bias = vec(inter);
      l.down_bias = vec(h);
    }
    if (c.gemma()) {
      l.pre_feedforward_layernorm = vec(h);
      l.post_feedforward_layernorm = vec(h);
    }
    if (c.qk_norm()) {
      l.q_norm = vec(static_cast<Eigen::Index>(c.head_dim));
      l.k_norm = vec(static_cast<Eigen::Index>(c.head_dim));
    }
  }
  w.norm = vec(h);
  if (!c.tie_word_embeddings) w.lm_head = mat(vocab, h);
  return w;
}

VectorF norm_gain(const ModelConfig& c, const VectorF& w) {
  if (!c.gemma()) return w;
  VectorF g(w.size());
  for (Eigen::Index i = 0; i < w.size(); ++i) g[i] = 1.0f + w[i];
  return g;
}

std::vector<NamedTensor> named_tensors(const ModelConfig& c, ModelWeights& w) {
  KVP_CHECK(static_cast<int64_t>(w.layers.size()) == c.num_layers);
  std::vector<NamedTensor> out;
  auto mat = [&](std::string name, MatrixF& m) { out.push_back({std::move(name), {m.rows(), m.cols()}, m.data()}); };
  auto vec = [&](std::string name, VectorF& v) { out.push_back({std::move(name), {v.size()}, v.data()}); };
  mat("model.embed_tokens.weight", w.embed_tokens);
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    vec(p + "input_layernorm.weight", l.input_layernorm);
    mat(p + "self_attn.q_proj.weight", l.q_proj);
    if (c.qkv_bias) vec(p + "self_attn.q_proj.bias", l.q_bias);
    mat(p + "self_attn.k_proj.weight", l.k_proj);
    if (c.qkv_bias) vec(p + "self_attn.k_proj.bias", l.k_bias);
    mat(p + "self_attn.v_proj.weight", l.v_proj);
    if (c.qkv_bias) vec(p + "self_attn.v_proj.bias", l.v_bias);
    if (c.qk_norm()) {
      vec(p + "self_attn.q_norm.weight", l.q_norm);
      vec(p + "self_attn.k_norm.weight", l.k_norm);
    }
    mat(p + "self_attn.o_proj.weight", l.o_proj);
    if (c.o_bias) vec(p + "self_attn.o_proj.bias", l.o_bias);
    vec(p + "post_attention_layernorm.weight", l.post_attention_layernorm);
    if (c.gemma()) {
      vec(p + "pre_feedforward_layernorm.weight", l.pre_feedforward_layernorm);
      vec(p + "post_feedforward_layernorm.weight", l.post_feedforward_layernorm);
    }
    mat(p + "mlp.gate_proj.weight", l.gate_proj);
    if (c.mlp_bias) vec(p + "mlp.gate_proj.bias", l.gate_bias);
    mat(p + "mlp.up_proj.weight", l.up_proj);
    if (c.mlp_bias) vec(p + "mlp.up_proj.bias", l.up_bias);
    mat(p + "mlp.down_proj.weight", l.down_proj);
    if (c.mlp_bias) vec(p + "mlp.down_proj.bias", l.down_bias);
  }
  vec("model.norm.weight", w.norm);
  if (!c.tie_word_embeddings) mat("lm_head.weight", w.lm_head);
  return out;
}

void round_matrices_to_bf16(Model& model) {
  for (const NamedTensor& t : named_tensors(model.config, model.weights)) {
    if (t.shape.size() != 2) continue;
    const int64_t n = t.shape[0] * t.shape[1];
    for (int64_t i = 0; i < n; ++i) t.data[i] = bf16_to_float(float_to_bf16(t.data[i]));
  }
}

bool matrices_are_bf16(const Model& model) {
  // named_tensors hands out mutable pointers; nothing is written through them here.
  Model& m = const_cast<Model&>(model);
  for (const NamedTensor& t : named_tensors(m.config, m.weights)) {
    if (t.shape.size() != 2) continue;
    const int64_t n = t.shape[0] * t.shape[1];
    for (int64_t i = 0; i < n; ++i)
      if (float_bits(bf16_to_float(float_to_bf16(t.data[i]))) != float_bits(t.data[i])) return false;
  }
  return true;
}

}  // namespace kvp
