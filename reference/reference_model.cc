#include "reference/reference_model.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/parallel.h"
#include "common/sampling.h"
#include "model/rope.h"

namespace kvp {

namespace {

// The oracle's weight matrices are held as fp32 (ReferenceModel::Weights) and widened to T
// where a product reads them, a slice of rows at a time: the operands are the same values as
// a whole T copy's (fp32 -> fp64 is exact), at half its memory and half the bytes each
// product streams. The matrix-vector products of the per-position path widen kWidenRows
// rows at a time (each output is one row's dot product with x, summed alike whatever the
// rows beside it: the same bits as over the whole matrix). 512: with 64, Eigen's per-call
// cost made a 49,152 x 576 product 1.5x slower than over an fp64 copy; with 512, 1.1-1.2x.
constexpr Eigen::Index kWidenRows = 512;

// Rows r0..r0+r-1 of the fp32 weights as T, in a buffer of the calling thread's (reused
// call after call: no allocation per slice). Valid until the thread's next call.
template <typename T>
const ref::Matrix<T>& widened_rows(const ref::Matrix<float>& w, Eigen::Index r0, Eigen::Index r) {
  thread_local ref::Matrix<T> part;
  part.resize(r, w.cols());
  const float* src = w.row(r0).data();
  T* dst = part.data();
  for (Eigen::Index i = 0; i < r * w.cols(); ++i) dst[i] = static_cast<T>(src[i]);
  return part;
}

// y = W x + b: a projection with its bias, if it has one.
template <typename T>
ref::Vector<T> linear(const ref::Matrix<float>& w, const ref::Vector<T>& b, const ref::Vector<T>& x) {
  ref::Vector<T> y(w.rows());
  if constexpr (std::is_same_v<T, float>) {
    y.noalias() = w * x;
  } else {
    for (Eigen::Index r0 = 0; r0 < w.rows(); r0 += kWidenRows) {
      const Eigen::Index r = std::min(kWidenRows, w.rows() - r0);
      y.segment(r0, r).noalias() = widened_rows<T>(w, r0, r) * x;
    }
  }
  if (b.size() != 0) y += b;
  return y;
}

// Runs fn(0..n-1) on up to `threads` threads (slice i on thread i % threads); on one when
// the whole job is under kMinThreadedWork multiply-adds, where starting a thread costs more
// than it saves (which thread runs a slice never changes its bits).
constexpr double kMinThreadedWork = 1 << 22;

template <typename Fn>
void parallel_slices(Eigen::Index n, int threads, double work, const Fn& fn) {
  for_each_slice(n, work < kMinThreadedWork ? 1 : threads, fn);
}
// The same on the model's kept workers (none: the calling thread alone).
template <typename Fn>
void parallel_slices(Eigen::Index n, SliceWorkers* workers, double work, const Fn& fn) {
  if (workers == nullptr || work < kMinThreadedWork) {
    for (Eigen::Index i = 0; i < n; ++i) fn(i);
    return;
  }
  workers->run(n, [&fn](int64_t i) { fn(static_cast<Eigen::Index>(i)); });
}

// Y = X W^T (+ b) for the rows of X (tokens): one matrix product per slice of kSliceRows
// output features, the slices spread over the workers. The slicing is fixed (it does not
// depend on the thread count), and each output element is one dot product over the input
// summed by Eigen's matrix-matrix kernel, so the bits do not depend on the threads either
// (tests/reference_model_test.cc). Each product is evaluated into its own matrix first: a
// block of a product expression is evaluated coefficient by coefficient, in another order.
// 64 rows, so that two threads share each projection of the SmolLM2 shape about evenly (576
// rows: 9 slices, where 512-row slices gave one thread 512 of them and the other 64; k and v,
// 192 rows, were one slice); repacking X for each slice costs ~2% of the slice's product.
constexpr Eigen::Index kSliceRows = 64;
// Every product's token count is padded to a multiple of this (zero rows, results dropped).
// Eigen evaluates X W^T for a row-major X as W X^T, the tokens being the right-hand columns,
// and runs them through its kernel in panels of nr = 4 columns; the last n mod 4 columns
// take another path, whose sums (with AVX, and a single column as a matrix-vector product
// with SSE2 too) are ordered differently. With every token inside a full panel, a token's
// bits do not depend on how many others are beside it (tests/reference_model_test.cc:
// prefill = decode, threads and chunking change no bit). 8 covers nr = 8 too.
constexpr Eigen::Index kRowMultiple = 8;

// y[rows x w.rows()] (leading dimension ldy) = the first `rows` rows of X W^T. Each slice's
// product covers all of X's rows (the padding too, see kRowMultiple) and keeps the first
// `rows`.
// The fp32 weights' slice is widened to T first (widened_rows): the product
// then has the same operands and shapes as with a T copy of the weights, so the same bits.
template <typename T>
void rows_times_into(ref::ProductIsa isa, const ref::Matrix<T>& x, const ref::Matrix<float>& w, Eigen::Index rows,
                     SliceWorkers* workers, T* y, Eigen::Index ldy) {
  const Eigen::Index slices = (w.rows() + kSliceRows - 1) / kSliceRows;
  const double work = static_cast<double>(rows) * static_cast<double>(w.rows()) * static_cast<double>(w.cols());
  parallel_slices(slices, workers, work, [&](Eigen::Index s) {
    const Eigen::Index r0 = s * kSliceRows, r = std::min(kSliceRows, w.rows() - r0);
    const T* ws = nullptr;
    if constexpr (std::is_same_v<T, float>) {
      ws = w.row(r0).data();
    } else {
      ws = widened_rows<T>(w, r0, r).data();
    }
    ref::Matrix<T> part(x.rows(), r);
    ref::product_abt<T>(isa, x.data(), x.cols(), ws, w.cols(), x.rows(), r, x.cols(), part.data(), r);
    for (Eigen::Index i = 0; i < rows; ++i) std::copy_n(part.row(i).data(), r, y + i * ldy + r0);
  });
}

template <typename T>
ref::Matrix<T> rows_times(ref::ProductIsa isa, const ref::Matrix<T>& x, const ref::Matrix<float>& w, Eigen::Index rows,
                          SliceWorkers* workers) {
  ref::Matrix<T> y(rows, w.rows());
  rows_times_into<T>(isa, x, w, rows, workers, y.data(), y.cols());
  return y;
}

template <typename T>
ref::Matrix<T> linear_rows(ref::ProductIsa isa, const ref::Matrix<float>& w, const ref::Vector<T>& b,
                           const ref::Matrix<T>& x, SliceWorkers* workers) {
  ref::Matrix<T> y = rows_times<T>(isa, x, w, x.rows(), workers);
  if (b.size() != 0) y.rowwise() += b.transpose();
  return y;
}

// RMSNorm of every row (rms_norm's equation, a row at a time).
template <typename T>
ref::Matrix<T> rms_norm_rows(const ref::Matrix<T>& x, const ref::Vector<T>& weight, T eps) {
  ref::Matrix<T> y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const T mean_square = x.row(i).squaredNorm() / static_cast<T>(x.cols());
    const T inv_rms = T(1) / std::sqrt(mean_square + eps);
    y.row(i) = (x.row(i) * inv_rms).cwiseProduct(weight.transpose());
  }
  return y;
}

// The weights' conversions to T, listed (each destination sized) and then run in chunks of
// elements over threads.
template <typename T>
class Conversions {
 public:
  template <typename Dst, typename Src>
  void add(Dst& dst, const Src& src) {
    dst.resize(src.rows(), src.cols());
    if (src.size() > 0) parts_.push_back({src.data(), dst.data(), static_cast<std::size_t>(src.size())});
  }
  // A weight matrix, copied as fp32 (ReferenceModel::Weights).
  void add_weights(ref::Matrix<float>& dst, const ref::Matrix<float>& src) {
    dst.resize(src.rows(), src.cols());
    if (src.size() > 0) copies_.push_back({src.data(), dst.data(), static_cast<std::size_t>(src.size())});
  }
  // One thread converts each tensor whole (the plain definition the chunks are tested
  // against).
  void run(int threads) {
    const std::size_t chunk = threads > 1 ? std::size_t{1} << 18 : std::numeric_limits<std::size_t>::max();
    std::vector<Part<T>> chunks;
    std::vector<Part<float>> copy_chunks;
    double total = 0;
    const auto split = [&](const auto& parts, auto& into) {
      for (const auto& p : parts) {
        total += static_cast<double>(p.n);
        for (std::size_t i = 0; i < p.n; i += std::min(chunk, p.n - i))
          into.push_back({p.src + i, p.dst + i, std::min(chunk, p.n - i)});
      }
    };
    split(parts_, chunks);
    split(copies_, copy_chunks);
    const auto n = static_cast<Eigen::Index>(chunks.size() + copy_chunks.size());
    parallel_slices(n, threads, total, [&](Eigen::Index c) {
      if (static_cast<std::size_t>(c) < chunks.size()) {
        const Part<T>& p = chunks[static_cast<std::size_t>(c)];
        for (std::size_t i = 0; i < p.n; ++i) p.dst[i] = static_cast<T>(p.src[i]);
      } else {
        const Part<float>& p = copy_chunks[static_cast<std::size_t>(c) - chunks.size()];
        std::copy_n(p.src, p.n, p.dst);
      }
    });
  }

 private:
  template <typename D>
  struct Part {
    const float* src;
    D* dst;
    std::size_t n;
  };
  std::vector<Part<T>> parts_;
  std::vector<Part<float>> copies_;
};

}  // namespace

template <typename T>
ReferenceModel<T>::ReferenceModel(const Model& model, int threads) : config_(model.config) {
  KVP_CHECK(config_.validate().is_ok());
  Eigen::initParallel();  // products may run on several threads (set_threads)
  const ModelWeights& w = model.weights;
  Conversions<T> convert;
  // Norm gains (Gemma's 1 + w), kept alive until the conversions have run.
  std::deque<VectorF> gains;
  const auto gain = [&](const VectorF& v) -> const VectorF& { return gains.emplace_back(norm_gain(config_, v)); };
  convert.add_weights(embed_tokens_, w.embed_tokens);
  layers_.resize(w.layers.size());
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    Layer& d = layers_[i];
    convert.add(d.input_layernorm, gain(l.input_layernorm));
    convert.add(d.post_attention_layernorm, gain(l.post_attention_layernorm));
    convert.add(d.pre_feedforward_layernorm, gain(l.pre_feedforward_layernorm));
    convert.add(d.post_feedforward_layernorm, gain(l.post_feedforward_layernorm));
    convert.add(d.q_norm, gain(l.q_norm));
    convert.add(d.k_norm, gain(l.k_norm));
    convert.add_weights(d.q_proj, l.q_proj);
    convert.add_weights(d.k_proj, l.k_proj);
    convert.add_weights(d.v_proj, l.v_proj);
    convert.add_weights(d.o_proj, l.o_proj);
    convert.add_weights(d.gate_proj, l.gate_proj);
    convert.add_weights(d.up_proj, l.up_proj);
    convert.add_weights(d.down_proj, l.down_proj);
    convert.add(d.q_bias, l.q_bias);
    convert.add(d.k_bias, l.k_bias);
    convert.add(d.v_bias, l.v_bias);
    convert.add(d.o_bias, l.o_bias);
    convert.add(d.gate_bias, l.gate_bias);
    convert.add(d.up_bias, l.up_bias);
    convert.add(d.down_bias, l.down_bias);
  }
  convert.add(norm_, gain(w.norm));
  if (!config_.tie_word_embeddings) convert.add_weights(lm_head_, w.lm_head);
  convert.run(threads);
  inv_freq_ = rope_inv_freq<T>(config_);
  if (config_.has_local_rope()) local_inv_freq_ = rope_local_inv_freq<T>(config_);
}

template <typename T>
T ReferenceModel<T>::attention_scale() const {
  const double s =
      config_.query_pre_attn_scalar > 0.0 ? config_.query_pre_attn_scalar : static_cast<double>(config_.head_dim);
  return T(1) / std::sqrt(static_cast<T>(s));
}

template <typename T>
Status ReferenceModel<T>::check_forward(std::span<const int32_t> tokens, const DenseKVCache<T>& cache) const {
  if (tokens.empty()) return Status::error("no tokens to run");
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
      return Status::error("token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                           " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")");
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (cache.num_layers() != config_.num_layers) return Status::error("cache was made for another model");
  if (cache.length() + n > cache.capacity())
    return Status::error("sequence of " + std::to_string(cache.length() + n) +
                         " positions exceeds the cache capacity " + std::to_string(cache.capacity()));
  if (cache.length() + n > config_.max_position_embeddings)
    return Status::error("sequence of " + std::to_string(cache.length() + n) +
                         " positions exceeds max_position_embeddings " +
                         std::to_string(config_.max_position_embeddings));
  return Status::ok();
}

template <typename T>
Result<typename ReferenceModel<T>::Matrix> ReferenceModel<T>::forward(std::span<const int32_t> tokens,
                                                                      DenseKVCache<T>& cache) const {
  KVP_RETURN_IF_ERROR(check_forward(tokens, cache));
  const auto n = static_cast<int64_t>(tokens.size());
  Matrix logits(n, config_.vocab_size);
  for (int64_t b = 0; b < n; b += kBlockTokens) {
    const int64_t m = std::min(kBlockTokens, n - b);
    forward_block(tokens.subspan(static_cast<std::size_t>(b), static_cast<std::size_t>(m)), cache, logits, b);
    cache.advance(m);
  }
  return logits;
}

template <typename T>
Result<typename ReferenceModel<T>::Matrix> ReferenceModel<T>::forward_sequential(std::span<const int32_t> tokens,
                                                                                 DenseKVCache<T>& cache) const {
  KVP_RETURN_IF_ERROR(check_forward(tokens, cache));
  const auto n = static_cast<int64_t>(tokens.size());
  Matrix logits(n, config_.vocab_size);
  for (int64_t i = 0; i < n; ++i) {
    logits.row(i) = forward_one(tokens[static_cast<std::size_t>(i)], cache.length(), cache).transpose();
    cache.advance(1);
  }
  return logits;
}

// Attention's two products (scores Q K^T and the weighted sum P V) run over the context a
// panel of kAttentionPanel positions at a time, every panel starting at a multiple of it.
// A position is then always at the same place in a product of the same shape, and the
// weighted sum adds the panels in order, each a product of depth kAttentionPanel, so a
// query's output does not depend on how far the context of the block around it reaches
// (a prefill, chunks and single-token decodes give the same bits). One product over the
// whole context would not: Eigen cuts a long depth into cache-sized pieces whose size
// depends on the depth, and treats a context's last rows by another path.
constexpr Eigen::Index kAttentionPanel = 64;

template <typename T>
typename ReferenceModel<T>::Matrix ReferenceModel<T>::attend_block(const Matrix& q, int64_t n, int64_t layer,
                                                                   int64_t start, const DenseKVCache<T>& cache) const {
  const int64_t d = config_.head_dim;
  const T scale = attention_scale();
  const T softcap = static_cast<T>(config_.attn_logit_softcapping);
  const Eigen::Index rows = q.rows();  // n queries and the block's padding rows
  const Eigen::Index panels = (start + n + kAttentionPanel - 1) / kAttentionPanel;
  Matrix out = Matrix::Zero(rows, config_.q_dim());
  // Heads are independent (each writes its own columns of out): spread over the threads.
  const double work = static_cast<double>(config_.num_heads) * static_cast<double>(rows) *
                      static_cast<double>(panels * kAttentionPanel) * static_cast<double>(2 * d);
  parallel_slices(config_.num_heads, workers_.get(), work, [&](Eigen::Index head) {
    // Query head `head` reads KV head head / group_size (GQA; MQA when there is one).
    const int64_t kvh = head / config_.group_size();
    const Matrix& k = cache.keys(layer, kvh);
    const Matrix& v = cache.values(layer, kvh);
    // Positions [p * panel, (p + 1) * panel) of K or V; rows past the cache are zero (their
    // scores are masked, their weights 0).
    const auto panel = [&](const Matrix& kv, Eigen::Index p) {
      const Eigen::Index first = p * kAttentionPanel;
      const Eigen::Index m = std::min<Eigen::Index>(kAttentionPanel, kv.rows() - first);
      Matrix part = Matrix::Zero(kAttentionPanel, d);
      part.topRows(m) = kv.middleRows(first, m);
      return part;
    };
    const Matrix qh = q.middleCols(head * d, d);
    Matrix scores(rows, panels * kAttentionPanel);
    Matrix s(rows, kAttentionPanel);
    for (Eigen::Index p = 0; p < panels; ++p) {
      const Matrix kp = panel(k, p);
      ref::product_abt<T>(isa_, qh.data(), d, kp.data(), d, rows, kAttentionPanel, d, s.data(), kAttentionPanel);
      scores.middleCols(p * kAttentionPanel, kAttentionPanel) = s * scale;
    }
    // Gemma 2's soft-capping of every score, after the scale, before the mask.
    if (softcap > T(0)) scores = scores.unaryExpr([softcap](T z) { return ref::soft_cap<T>(z, softcap); });
    // The causal mask: query i (position start + i) weighs positions first..start+i, where
    // first is 0 or, in a windowed layer, the window's first position (ref::attention_first);
    // every other weight is 0.
    const int64_t window = config_.layer_window(layer);
    Matrix weights = Matrix::Zero(rows, panels * kAttentionPanel);
    for (Eigen::Index i = 0; i < n; ++i) {
      const Eigen::Index first = ref::attention_first(start + i, window);
      const Eigen::Index ctx = start + i + 1 - first;
      weights.row(i).segment(first, ctx) = ref::softmax<T>(scores.row(i).segment(first, ctx).transpose()).transpose();
    }
    Matrix o = Matrix::Zero(rows, d);
    Matrix part(rows, d);
    for (Eigen::Index p = 0; p < panels; ++p) {
      const Matrix vp = panel(v, p);
      ref::product_ab<T>(isa_, weights.data() + p * kAttentionPanel, weights.cols(), vp.data(), d, rows, d,
                         kAttentionPanel, part.data(), d);
      o += part;
    }
    out.middleCols(head * d, d) = o;
  });
  return out;
}

template <typename T>
void ReferenceModel<T>::forward_block(std::span<const int32_t> tokens, DenseKVCache<T>& cache, Matrix& logits,
                                      int64_t row) const {
  const int64_t d = config_.head_dim;
  const T eps = static_cast<T>(config_.rms_norm_eps);
  const auto n = static_cast<Eigen::Index>(tokens.size());
  const int64_t start = cache.length();

  // The block is padded to kRowMultiple rows (see there): the padding rows are zero and
  // have no position; their results are dropped.
  const Eigen::Index rows = (n + kRowMultiple - 1) / kRowMultiple * kRowMultiple;
  Matrix x = Matrix::Zero(rows, config_.hidden_size);
  for (Eigen::Index i = 0; i < n; ++i) {
    x.row(i) = embed_tokens_.row(tokens[static_cast<std::size_t>(i)]).template cast<T>();
    if (config_.gemma()) x.row(i) *= static_cast<T>(config_.embed_scale());  // Gemma: times sqrt(hidden)
  }
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    const std::vector<T>& inv_freq = inv_freq_of(l);

    // Attention block: H = RMSNorm(X); Q, K, V = H Wq, H Wk, H Wv; (Gemma 3: RMSNorm of each
    // head of Q and K); RoPE on each row of Q and K.
    const Matrix h = rms_norm_rows<T>(x, layer.input_layernorm, eps);
    Matrix q = linear_rows<T>(isa_, layer.q_proj, layer.q_bias, h, workers_.get());
    Matrix k = linear_rows<T>(isa_, layer.k_proj, layer.k_bias, h, workers_.get());
    const Matrix v = linear_rows<T>(isa_, layer.v_proj, layer.v_bias, h, workers_.get());
    const auto head_norm = [&](Matrix& m, Eigen::Index i, int64_t head, const Vector& gain) {
      const Vector part = m.row(i).segment(head * d, d).transpose();
      m.row(i).segment(head * d, d) = ref::rms_norm<T>(part, gain, eps).transpose();
    };
    for (Eigen::Index i = 0; i < n; ++i) {  // the padding row (if any) has no position
      const int64_t position = start + i;
      for (int64_t head = 0; head < config_.num_heads; ++head) {
        if (config_.qk_norm()) head_norm(q, i, head, layer.q_norm);
        ref::apply_rope<T>(q.row(i).data() + head * d, d, position, inv_freq);
      }
      for (int64_t kvh = 0; kvh < config_.num_kv_heads; ++kvh) {
        if (config_.qk_norm()) head_norm(k, i, kvh, layer.k_norm);
        ref::apply_rope<T>(k.row(i).data() + kvh * d, d, position, inv_freq);
        // K/V of the block go into the cache before attention reads them.
        cache.keys(l, kvh).row(position) = k.row(i).segment(kvh * d, d);
        cache.values(l, kvh).row(position) = v.row(i).segment(kvh * d, d);
      }
    }
    const Matrix attn =
        linear_rows<T>(isa_, layer.o_proj, layer.o_bias, attend_block(q, n, l, start, cache), workers_.get());
    // Gemma normalises the attention's output before the residual add (its sandwich norm).
    x += config_.gemma() ? rms_norm_rows<T>(attn, layer.post_attention_layernorm, eps) : attn;

    // MLP block (SwiGLU; Gemma's GeGLU with the tanh GELU): X += (act(H2 W_gate) * (H2 W_up)) W_down,
    // H2 = RMSNorm(X) (Gemma: its pre-feedforward norm; the MLP's output normalised too).
    const Matrix h2 =
        rms_norm_rows<T>(x, config_.gemma() ? layer.pre_feedforward_layernorm : layer.post_attention_layernorm, eps);
    const bool geglu = config_.gemma();
    const Matrix gate =
        linear_rows<T>(isa_, layer.gate_proj, layer.gate_bias, h2, workers_.get()).unaryExpr([geglu](T z) {
          return geglu ? ref::gelu_tanh<T>(z) : ref::silu<T>(z);
        });
    const Matrix up = linear_rows<T>(isa_, layer.up_proj, layer.up_bias, h2, workers_.get());
    const Matrix mlp = linear_rows<T>(isa_, layer.down_proj, layer.down_bias, gate.cwiseProduct(up), workers_.get());
    x += config_.gemma() ? rms_norm_rows<T>(mlp, layer.post_feedforward_layernorm, eps) : mlp;
  }
  // Tied embeddings: the LM head is the embedding matrix itself (one copy, not two).
  const Weights& lm_head = config_.tie_word_embeddings ? embed_tokens_ : lm_head_;
  // The LM head a slice of the vocabulary at a time (rows_times): Eigen packs the left
  // operand of a product a panel at a time, sized by the cache sizes, and the whole 49k-row
  // head in one product grew verify's peak by ~100 MB.
  rows_times_into<T>(isa_, rms_norm_rows<T>(x, norm_, eps), lm_head, n, workers_.get(), logits.row(row).data(),
                     logits.cols());
  // Gemma 2's final soft-capping.
  const T cap = static_cast<T>(config_.final_logit_softcapping);
  if (cap > T(0)) {
    auto block = logits.middleRows(row, n);
    block = block.unaryExpr([cap](T z) { return ref::soft_cap<T>(z, cap); });
  }
}

template <typename T>
typename ReferenceModel<T>::Vector ReferenceModel<T>::forward_one(int32_t token, int64_t position,
                                                                  DenseKVCache<T>& cache) const {
  const int64_t d = config_.head_dim;
  const T eps = static_cast<T>(config_.rms_norm_eps);

  Vector x = embed_tokens_.row(token).transpose().template cast<T>();
  if (config_.gemma()) x *= static_cast<T>(config_.embed_scale());  // Gemma: times sqrt(hidden)
  const T scale = attention_scale();
  const T softcap = static_cast<T>(config_.attn_logit_softcapping);
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    const std::vector<T>& inv_freq = inv_freq_of(l);

    // Attention block: h = RMSNorm(x); q, k, v = h Wq, h Wk, h Wv; (Gemma 3: RMSNorm of each
    // head of q and k); RoPE on q and k.
    const Vector h = ref::rms_norm<T>(x, layer.input_layernorm, eps);
    Vector q = linear<T>(layer.q_proj, layer.q_bias, h);
    Vector k = linear<T>(layer.k_proj, layer.k_bias, h);
    const Vector v = linear<T>(layer.v_proj, layer.v_bias, h);
    for (int64_t head = 0; head < config_.num_heads; ++head) {
      if (config_.qk_norm()) q.segment(head * d, d) = ref::rms_norm<T>(q.segment(head * d, d), layer.q_norm, eps);
      ref::apply_rope<T>(q.segment(head * d, d), position, inv_freq);
    }
    for (int64_t kvh = 0; kvh < config_.num_kv_heads; ++kvh) {
      if (config_.qk_norm()) k.segment(kvh * d, d) = ref::rms_norm<T>(k.segment(kvh * d, d), layer.k_norm, eps);
      ref::apply_rope<T>(k.segment(kvh * d, d), position, inv_freq);
      // K/V of this position go into the cache before attention reads it.
      cache.keys(l, kvh).row(position) = k.segment(kvh * d, d).transpose();
      cache.values(l, kvh).row(position) = v.segment(kvh * d, d).transpose();
    }
    // Query head `head` reads KV head head / group_size (GQA; MQA when there is one).
    Vector attn(config_.q_dim());
    for (int64_t head = 0; head < config_.num_heads; ++head) {
      const int64_t kvh = head / config_.group_size();
      attn.segment(head * d, d) =
          ref::causal_attention<T>(q.segment(head * d, d), cache.keys(l, kvh), cache.values(l, kvh), position,
                                   config_.layer_window(l), scale, softcap);
    }
    const Vector o = linear<T>(layer.o_proj, layer.o_bias, attn);
    x += config_.gemma() ? ref::rms_norm<T>(o, layer.post_attention_layernorm, eps) : o;

    // MLP block (SwiGLU; Gemma: GeGLU between its pre- and post-feedforward norms).
    const Vector h2 =
        ref::rms_norm<T>(x, config_.gemma() ? layer.pre_feedforward_layernorm : layer.post_attention_layernorm, eps);
    const bool geglu = config_.gemma();
    const Vector gate = linear<T>(layer.gate_proj, layer.gate_bias, h2).unaryExpr([geglu](T z) {
      return geglu ? ref::gelu_tanh<T>(z) : ref::silu<T>(z);
    });
    const Vector up = linear<T>(layer.up_proj, layer.up_bias, h2);
    const Vector mlp = linear<T>(layer.down_proj, layer.down_bias, gate.cwiseProduct(up));
    x += config_.gemma() ? ref::rms_norm<T>(mlp, layer.post_feedforward_layernorm, eps) : mlp;
  }
  // Tied embeddings: the LM head is the embedding matrix itself (one copy, not two).
  const Weights& lm_head = config_.tie_word_embeddings ? embed_tokens_ : lm_head_;
  Vector logits = linear<T>(lm_head, Vector(), ref::rms_norm<T>(x, norm_, eps));
  const T cap = static_cast<T>(config_.final_logit_softcapping);
  if (cap > T(0)) logits = logits.unaryExpr([cap](T z) { return ref::soft_cap<T>(z, cap); });
  return logits;
}

template class ReferenceModel<float>;
template class ReferenceModel<double>;

Result<GenerateResult> reference_generate(const ReferenceModel<float>& model, std::span<const int32_t> prompt,
                                          int64_t max_tokens, const SamplingParams& params,
                                          std::span<const int32_t> stop_tokens) {
  KVP_RETURN_IF_ERROR(params.validate());
  if (max_tokens < 0) return Status::error("max_tokens must be >= 0");
  const int64_t total = static_cast<int64_t>(prompt.size()) + max_tokens;
  if (total > model.config().max_position_embeddings)
    return Status::error("prompt (" + std::to_string(prompt.size()) + ") + max_tokens (" + std::to_string(max_tokens) +
                         ") exceeds max_position_embeddings " + std::to_string(model.config().max_position_embeddings));
  auto cache = model.make_cache(std::max<int64_t>(total, 1));
  auto logits = model.forward(prompt, cache);
  if (!logits) return logits.status();
  GenerateResult out;
  Rng rng(params.seed);
  std::vector<float> last(logits->row(logits->rows() - 1).data(),
                          logits->row(logits->rows() - 1).data() + logits->cols());
  for (int64_t i = 0; i < max_tokens; ++i) {
    const int32_t token = sample_token(last, params, rng);
    out.tokens.push_back(token);
    out.logits.push_back(last);
    if (i + 1 == max_tokens || std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end()) break;
    auto next = model.forward(std::span<const int32_t>(&token, 1), cache);
    if (!next) return next.status();
    last.assign(next->row(0).data(), next->row(0).data() + next->cols());
  }
  return out;
}

}  // namespace kvp
