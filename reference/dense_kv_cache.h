// The simple KV cache from the seed article: each sequence reserves one contiguous
// region for its maximum length, per layer, for K and for V. Nothing is shared or paged;
// the price is memory reserved for tokens that may never come (reserved vs used bytes).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/model_config.h"
#include "reference/ops.h"

namespace kvp {

template <typename T>
class DenseKVCache {
 public:
  using Matrix = ref::Matrix<T>;

  // Reserves `capacity` positions. REQUIRES: c.validate().is_ok(), capacity > 0.
  DenseKVCache(const ModelConfig& c, int64_t capacity)
      : num_kv_heads_(c.num_kv_heads), head_dim_(c.head_dim), capacity_(capacity) {
    KVP_CHECK(capacity > 0);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      // Per KV head a [capacity, head_dim] matrix, so attention reads one head contiguously.
      keys_.emplace_back(static_cast<std::size_t>(num_kv_heads_), Matrix::Zero(capacity, head_dim_));
      values_.emplace_back(static_cast<std::size_t>(num_kv_heads_), Matrix::Zero(capacity, head_dim_));
    }
  }

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }

  // [capacity, head_dim] keys (values) of one KV head in one layer.
  Matrix& keys(int64_t layer, int64_t kv_head) { return keys_[idx(layer)][idx(kv_head)]; }
  Matrix& values(int64_t layer, int64_t kv_head) { return values_[idx(layer)][idx(kv_head)]; }
  const Matrix& keys(int64_t layer, int64_t kv_head) const { return keys_[idx(layer)][idx(kv_head)]; }
  const Matrix& values(int64_t layer, int64_t kv_head) const { return values_[idx(layer)][idx(kv_head)]; }

  // Marks `n` more positions as written. REQUIRES: length() + n <= capacity().
  void advance(int64_t n) {
    KVP_CHECK(n >= 0 && length_ + n <= capacity_);
    length_ += n;
  }

  // Makes this empty cache hold positions 0..n-1 of `from`, a cache of the same model (a run
  // that shares those tokens). REQUIRES: length() == 0, n <= from.length(), n <= capacity().
  void copy_prefix(const DenseKVCache& from, int64_t n) {
    KVP_CHECK(length_ == 0 && n <= from.length() && n <= capacity_ && from.keys_.size() == keys_.size() &&
              from.num_kv_heads_ == num_kv_heads_ && from.head_dim_ == head_dim_);
    for (std::size_t l = 0; l < keys_.size(); ++l) {
      for (std::size_t h = 0; h < keys_[l].size(); ++h) {
        keys_[l][h].topRows(n) = from.keys_[l][h].topRows(n);
        values_[l][h].topRows(n) = from.values_[l][h].topRows(n);
      }
    }
    length_ = n;
  }

  int64_t reserved_bytes() const { return bytes_for(capacity_); }
  int64_t used_bytes() const { return bytes_for(length_); }

 private:
  static std::size_t idx(int64_t i) { return static_cast<std::size_t>(i); }
  int64_t bytes_for(int64_t positions) const {
    return 2 * num_layers() * num_kv_heads_ * positions * head_dim_ * static_cast<int64_t>(sizeof(T));
  }

  int64_t num_kv_heads_;
  int64_t head_dim_;
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<std::vector<Matrix>> keys_;
  std::vector<std::vector<Matrix>> values_;
};

}  // namespace kvp
