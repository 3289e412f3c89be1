// The oracle: a Llama-family decoder written top to bottom like its equations, with a
// dense KV cache.
//
// forward() runs the positions it is given together, as matrix products: the tokens of a
// block (up to kBlockTokens) are the columns of every projection and of the MLP, so each
// weight is read once per block instead of once per token (Eigen does the products; the
// oracle has no tiling of its own). Attention is masked matrix products too: the block's
// queries against the keys (scores), a causal mask and a softmax per row, the weights
// against the values, over the context in fixed panels of positions (see attend_block in
// reference_model.cc for why panels). forward_sequential() is the same transformer one
// position at a time (matrix-vector products, the oracle before it was batched); the two
// agree to rounding (tests/reference_model_test.cc), and a prefill of n tokens and n
// single-token decodes give the same logits to rounding.
//
// Bitwise: a position's logits do not depend on how the positions were split into
// forward() calls (a prefill, chunks or single-token decodes give the same bits; see
// forward_block), only on the tokens up to it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/parallel.h"
#include "common/sampling.h"
#include "common/status.h"
#include "model/weights.h"
#include "reference/dense_kv_cache.h"
#include "reference/ops.h"
#include "reference/products.h"

namespace kvp {

template <typename T>
class ReferenceModel {
 public:
  using Matrix = ref::Matrix<T>;
  using Vector = ref::Vector<T>;

  // Copies the weights: the matrices (embeddings, projections, LM head) as fp32, the
  // model's own values, widened to T a slice at a time where a product reads them (fp32 ->
  // fp64 is exact: the products see the same operands as with a T copy, the same bits, at
  // half the memory for T = double); the norms and biases converted to T. On `threads`
  // threads (chunks of elements: the same bits at any count; the first touch of a fresh page
  // costs about as much as the copy itself). REQUIRES: model.config.validate().is_ok().
  explicit ReferenceModel(const Model& model, int threads = 1);

  const ModelConfig& config() const { return config_; }

  // A cache for one sequence of up to `capacity` positions.
  DenseKVCache<T> make_cache(int64_t capacity) const { return DenseKVCache<T>(config_, capacity); }

  // Appends `tokens` at positions cache.length() onwards and returns their logits,
  // [tokens.size(), vocab]. Errors (nothing changes): empty span, a token outside
  // [0, vocab), more positions than the cache or max_position_embeddings hold.
  Result<Matrix> forward(std::span<const int32_t> tokens, DenseKVCache<T>& cache) const;
  // The same, one position at a time (same contract).
  Result<Matrix> forward_sequential(std::span<const int32_t> tokens, DenseKVCache<T>& cache) const;

  // Tokens per block of forward()'s matrix products: each weight is read (and packed by
  // Eigen) once per block. 64: 128 and 256 were no faster (oracle_bench, 1,024 tokens,
  // AVX-512: 7.95/8.21/8.48 s at 64 against 7.91/8.35/8.04 s at 256, interleaved).
  static constexpr int64_t kBlockTokens = 64;

  // forward() spreads its products over up to n threads (fixed slices of output features:
  // the logits are the same bits for any n), n - 1 of them workers kept from here on
  // (common/parallel.h SliceWorkers: forward() may still be called from several threads at
  // once). Default 1. Not while a forward() runs.
  void set_threads(int n) {
    threads_ = std::max(n, 1);
    workers_ = threads_ > 1 ? std::make_unique<SliceWorkers>(threads_) : nullptr;
  }
  int threads() const { return threads_; }

  // The ISA of forward()'s matrix products (reference/products.h): default_product_isa()
  // unless set here. The bits depend on it (by rounding), so it
  // is set before the first forward(). REQUIRES: ref::product_isa_supported(isa).
  void set_product_isa(ref::ProductIsa isa) {
    KVP_CHECK(ref::product_isa_supported(isa));
    isa_ = isa;
  }
  ref::ProductIsa product_isa() const { return isa_; }

 private:
  // A weight matrix: fp32 whatever T is (see the constructor).
  using Weights = ref::Matrix<float>;
  struct Layer {
    // Every norm's gain (Gemma's 1 + w already added: norm_gain); Gemma's two MLP norms and
    // Gemma 3's per-head q/k norms are empty elsewhere.
    Vector input_layernorm, post_attention_layernorm;
    Vector pre_feedforward_layernorm, post_feedforward_layernorm, q_norm, k_norm;
    Weights q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
    // Empty when the model has no such bias; `linear` then adds nothing.
    Vector q_bias, k_bias, v_bias, o_bias, gate_bias, up_bias, down_bias;
  };

  Status check_forward(std::span<const int32_t> tokens, const DenseKVCache<T>& cache) const;
  // One token at position cache.length(); K/V are written to the cache, which the caller advances.
  Vector forward_one(int32_t token, int64_t position, DenseKVCache<T>& cache) const;
  // tokens.size() <= kBlockTokens tokens at positions cache.length() onwards, as matrix
  // products; K/V are written to the cache, which the caller advances. Their logits go
  // straight into rows row.. of `logits` (no block-sized copy).
  void forward_block(std::span<const int32_t> tokens, DenseKVCache<T>& cache, Matrix& logits, int64_t row) const;
  // Causal attention of the block's first n queries (rows of q, rotated) in layer `layer`,
  // whose K/V are already in the cache at positions start..start+n-1, as masked matrix
  // products; other rows are 0.
  Matrix attend_block(const Matrix& q, int64_t n, int64_t layer, int64_t start, const DenseKVCache<T>& cache) const;

  ModelConfig config_;
  std::vector<T> inv_freq_;  // rope_inv_freq<T>(config_): rope_scaling applied
  // The sliding layers' (Gemma 3's rope_local_base_freq; unscaled); empty when none uses it.
  std::vector<T> local_inv_freq_;
  const std::vector<T>& inv_freq_of(int64_t layer) const {
    return config_.layer_uses_local_rope(layer) ? local_inv_freq_ : inv_freq_;
  }
  // Scores' scale (query_pre_attn_scalar^-1/2 or head_dim^-1/2) and soft-cap (0: none).
  T attention_scale() const;
  Weights embed_tokens_;
  std::vector<Layer> layers_;
  Vector norm_;
  Weights lm_head_;  // empty when tied: embed_tokens_ is the LM head
  int threads_ = 1;
  std::unique_ptr<SliceWorkers> workers_;  // threads_ - 1 workers; none for one thread
  ref::ProductIsa isa_ = ref::default_product_isa();
};

extern template class ReferenceModel<float>;
extern template class ReferenceModel<double>;

// Greedy or sampled generation with the reference model: the prompt's logits, then one
// token at a time until max_tokens. Used by `kvproof generate` and as the engine's oracle.
struct GenerateResult {
  std::vector<int32_t> tokens;             // generated tokens only
  std::vector<std::vector<float>> logits;  // logits that produced each generated token
};

// Stops early, after appending it, at a token of `stop_tokens` (the engine's rule).
Result<GenerateResult> reference_generate(const ReferenceModel<float>& model, std::span<const int32_t> prompt,
                                          int64_t max_tokens, const SamplingParams& params,
                                          std::span<const int32_t> stop_tokens = {});

}  // namespace kvp
