// The weights of a Llama-family decoder, held as fp32 in memory whatever the file dtype.
// Matrices use the Hugging Face layout [out_features, in_features], row-major, so a
// safetensors tensor's bytes map onto a matrix's storage as they are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "model/model_config.h"

namespace kvp {

using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VectorF = Eigen::VectorXf;

struct LayerWeights {
  VectorF input_layernorm;  // [hidden]
  MatrixF q_proj;           // [num_heads * head_dim, hidden]
  MatrixF k_proj;           // [num_kv_heads * head_dim, hidden]
  MatrixF v_proj;           // [num_kv_heads * head_dim, hidden]
  MatrixF o_proj;           // [hidden, num_heads * head_dim]
  // [hidden]. Llama, Qwen2, Mistral: the MLP's input norm. Gemma: the norm of the attention's
  // output before the residual add (its MLP's input norm is pre_feedforward_layernorm).
  VectorF post_attention_layernorm;
  MatrixF gate_proj;  // [intermediate, hidden]
  MatrixF up_proj;    // [intermediate, hidden]
  MatrixF down_proj;  // [hidden, intermediate]
  // Biases, empty unless the config has them (qkv_bias, o_bias, mlp_bias).
  VectorF q_bias, k_bias, v_bias;  // [q_dim], [kv_dim], [kv_dim]
  VectorF o_bias;                  // [hidden]
  VectorF gate_bias, up_bias;      // [intermediate]
  VectorF down_bias;               // [hidden]
  // Gemma only (empty elsewhere): the MLP's input norm and its output's norm, [hidden]; Gemma
  // 3's per-head q and k norms, [head_dim]. Every Gemma norm scales by (1 + w): norm_gain().
  VectorF pre_feedforward_layernorm, post_feedforward_layernorm;
  VectorF q_norm, k_norm;
};

// The gain an RMSNorm multiplies by, as stored weights give it: w, or Gemma's 1 + w (each
// element one fp32 add, as transformers' `1.0 + self.weight.float()`).
VectorF norm_gain(const ModelConfig& c, const VectorF& w);

struct ModelWeights {
  MatrixF embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  VectorF norm;     // [hidden]
  MatrixF lm_head;  // [vocab, hidden]; empty when the config ties it to embed_tokens

  // The matrix that maps the final hidden state to logits.
  const MatrixF& output_embedding(const ModelConfig& c) const { return c.tie_word_embeddings ? embed_tokens : lm_head; }
};

struct Model {
  ModelConfig config;
  ModelWeights weights;
};

// One weight tensor by its Hugging Face name, with its expected shape and its storage.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;  // 1 or 2 dimensions
  float* data;                 // shape-product floats, row-major
};

// Allocates every tensor the config calls for, zero-filled; with !zeroed, left unwritten for
// a caller that writes every tensor of named_tensors() (the pages are first touched there,
// by its threads). REQUIRES: c.validate().is_ok().
ModelWeights allocate_weights(const ModelConfig& c, bool zeroed = true);

// Every tensor of the model in a fixed order (embed, layers 0..n-1 with their biases where
// the config has them, norm, lm_head unless tied), named as in Hugging Face Llama and Qwen2
// checkpoints (`model.layers.N.self_attn.q_proj.bias`, ...). This is the one place those names and
// shapes are written down; loading, saving and random initialisation all walk this list.
// REQUIRES: w was allocated for c.
std::vector<NamedTensor> named_tensors(const ModelConfig& c, ModelWeights& w);

// The weight matrices (named_tensors' 2-D tensors: the embeddings, the projections, lm_head)
// as bf16 values: each rounded to nearest even (common/dtype.h float_to_bf16) and widened back
// to fp32, exactly. Norms and biases are left as they are. What `--weight-dtype bf16` does to
// a model before anything uses it, so that the oracle and every backend compute with the
// values a bf16-weight kernel reads.
void round_matrices_to_bf16(Model& model);
// Whether every weight matrix already holds bf16 values (a bf16 checkpoint's do).
bool matrices_are_bf16(const Model& model);

}  // namespace kvp
