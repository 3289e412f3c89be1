// The operations of a Llama decoder, written as their equations. Scalar type T is float
// (the fp32 oracle) or double (the gold standard that measures fp32's honest error).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <Eigen/Core>

namespace kvp::ref {

template <typename T>
using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
template <typename T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// RMSNorm: x / sqrt(mean(x^2) + eps) * weight.
template <typename T>
Vector<T> rms_norm(const Vector<T>& x, const Vector<T>& weight, T eps) {
  const T mean_square = x.squaredNorm() / static_cast<T>(x.size());
  const T inv_rms = T(1) / std::sqrt(mean_square + eps);
  return (x * inv_rms).cwiseProduct(weight);
}

// Rotary position embedding in the Hugging Face "rotate half" convention: dimension i of
// the first half pairs with dimension i + D/2, rotated by the angle position * inv_freq[i]
// (inv_freq[i] = theta^(-2i/D), rescaled by rope_scaling: model/rope.h).
// REQUIRES: head.size() even, inv_freq.size() == head.size() / 2.
template <typename T>
void apply_rope(T* head, int64_t d, int64_t position, const std::vector<T>& inv_freq) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const T angle = static_cast<T>(position) * inv_freq[static_cast<std::size_t>(i)];
    const T c = std::cos(angle);
    const T s = std::sin(angle);
    const T x1 = head[i];
    const T x2 = head[i + half];
    head[i] = x1 * c - x2 * s;
    head[i + half] = x2 * c + x1 * s;
  }
}
template <typename T>
void apply_rope(Eigen::Ref<Vector<T>> head, int64_t position, const std::vector<T>& inv_freq) {
  apply_rope<T>(head.data(), head.size(), position, inv_freq);
}

// softmax(x) = exp(x - max x) / sum exp(x - max x): the subtraction keeps exp in range.
template <typename T>
Vector<T> softmax(const Vector<T>& x) {
  const T m = x.maxCoeff();
  Vector<T> e = (x.array() - m).exp().matrix();
  return e / e.sum();
}

// silu(z) = z * sigmoid(z).
template <typename T>
T silu(T z) {
  return z / (T(1) + std::exp(-z));
}

// PyTorch's tanh-approximated GELU (transformers' gelu_pytorch_tanh, Gemma's activation):
// 0.5 z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3))).
template <typename T>
T gelu_tanh(T z) {
  const T sqrt_2_over_pi = std::sqrt(T(2) / T(3.14159265358979323846));
  return T(0.5) * z * (T(1) + std::tanh(sqrt_2_over_pi * (z + T(0.044715) * z * z * z)));
}

// Gemma 2's soft-capping: cap * tanh(s / cap); cap 0: no cap.
template <typename T>
T soft_cap(T s, T cap) {
  return cap > T(0) ? cap * std::tanh(s / cap) : s;
}

// The first position a query at `position` attends to: 0, or with a sliding window of W
// positions (W > 0) max(0, position - W + 1). transformers' sliding-window mask keeps key
// kv_idx for query q_idx when kv_idx > q_idx - W (masking_utils.sliding_window_overlay)
// and kv_idx <= q_idx (the causal mask): W positions, the query's own included.
inline int64_t attention_first(int64_t position, int64_t window) {
  return window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
}

// Causal attention of one query head at position `position` over the keys and values of
// one KV head, rows 0..capacity-1 of K and V ([positions, head_dim]). Only rows
// attention_first(position, window)..position are read: that is the causal mask, banded by
// the window when there is one (window 0: none). Scores are q.k * scale (scale 0: the usual
// 1 / sqrt(head_dim)), soft-capped when softcap > 0. REQUIRES: 0 <= position < K.rows().
template <typename T>
Vector<T> causal_attention(const Vector<T>& q, const Matrix<T>& k, const Matrix<T>& v, int64_t position,
                           int64_t window = 0, T scale = T(0), T softcap = T(0)) {
  const int64_t first = attention_first(position, window);
  const int64_t n = position + 1 - first;
  if (scale == T(0)) scale = T(1) / std::sqrt(static_cast<T>(q.size()));
  Vector<T> scores(n);
  for (int64_t j = 0; j < n; ++j) scores(j) = soft_cap<T>(k.row(first + j).dot(q.transpose()) * scale, softcap);
  const Vector<T> p = softmax<T>(scores);
  Vector<T> out = Vector<T>::Zero(v.cols());
  for (int64_t j = 0; j < n; ++j) out += p(j) * v.row(first + j).transpose();
  return out;
}

}  // namespace kvp::ref
