// Sliding-window attention (Mistral's sliding_window) pinned to its published definition and
// carried through the oracle and the CPU paged kernel:
//   - the window's first position (ref::attention_first, kernels::window_first) against
//     transformers' mask, written out here as published: key kv_idx is kept for query q_idx
//     when kv_idx > q_idx - sliding_window (masking_utils.sliding_window_overlay) and
//     kv_idx <= q_idx (causal_mask_function);
//   - the oracle's attention of one head against a softmax over exactly those keys, done here
//     by hand; its block and sequential forwards agree; a context no longer than the window
//     gives the unwindowed model's bits, a longer one does not;
//   - the CPU paged kernel against a double-precision attention over the window's positions,
//     never reading a block wholly before the window (a NaN block there changes no bit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu_attention.h"
#include "model/presets.h"
#include "reference/ops.h"
#include "reference/reference_model.h"

namespace kvp {
namespace {

// transformers' sliding-window causal mask, as published (masking_utils.py): and_masks of
// sliding_window_overlay (kv_idx > q_idx - sliding_window) and causal_mask_function
// (kv_idx <= q_idx).
bool transformers_keeps(int64_t q_idx, int64_t kv_idx, int64_t sliding_window) {
  return kv_idx > q_idx - sliding_window && kv_idx <= q_idx;
}

TEST(SlidingWindow, FirstPositionIsTransformersMask) {
  for (int64_t window = 1; window <= 9; ++window) {
    for (int64_t q = 0; q < 40; ++q) {
      const int64_t first = ref::attention_first(q, window);
      EXPECT_EQ(kernels::window_first(q, window), first);
      for (int64_t kv = 0; kv < 45; ++kv)
        ASSERT_EQ(kv >= first && kv <= q, transformers_keeps(q, kv, window))
            << "window " << window << " query " << q << " key " << kv;
      // W positions, the query's own included, once the context is that long.
      EXPECT_EQ(q + 1 - first, std::min(q + 1, window));
    }
  }
  // No window: the whole past.
  EXPECT_EQ(ref::attention_first(100, 0), 0);
  EXPECT_EQ(kernels::window_first(100, 0), 0);
  // Mistral-7B-v0.1's window of 4096: position 4095 still sees position 0, 4096 does not.
  EXPECT_EQ(ref::attention_first(4095, 4096), 0);
  EXPECT_EQ(ref::attention_first(4096, 4096), 1);
}

using M = ref::Matrix<double>;
using V = ref::Vector<double>;

// Attention of q over the rows kept by transformers' mask, by hand: scores scaled by
// 1/sqrt(d), exp(s - max), normalised, weighted sum of V.
V masked_attention_by_hand(const V& q, const M& k, const M& v, int64_t position, int64_t window) {
  double max_score = -std::numeric_limits<double>::infinity();
  std::vector<double> s(static_cast<std::size_t>(position + 1), 0.0);
  for (int64_t j = 0; j <= position; ++j) {
    if (!transformers_keeps(position, j, window)) continue;
    s[static_cast<std::size_t>(j)] = k.row(j).dot(q.transpose()) / std::sqrt(static_cast<double>(q.size()));
    max_score = std::max(max_score, s[static_cast<std::size_t>(j)]);
  }
  double sum = 0.0;
  V out = V::Zero(v.cols());
  for (int64_t j = 0; j <= position; ++j) {
    if (!transformers_keeps(position, j, window)) continue;
    const double e = std::exp(s[static_cast<std::size_t>(j)] - max_score);
    sum += e;
    out += e * v.row(j).transpose();
  }
  return out / sum;
}

TEST(SlidingWindow, OracleAttentionReadsExactlyTheWindow) {
  Rng rng(5);
  const int64_t n = 23, d = 6;
  M k(n, d), v(n, d);
  V q(d);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t e = 0; e < d; ++e) {
      k(i, e) = rng.uniform(-1.0, 1.0);
      v(i, e) = rng.uniform(-1.0, 1.0);
    }
  for (int64_t e = 0; e < d; ++e) q(e) = rng.uniform(-1.0, 1.0);
  // A key just outside every window that would take nearly all the weight if it were read.
  k.row(0) = 50.0 * q.transpose();
  for (int64_t window : {1, 2, 5, 22, 23, 40}) {
    for (int64_t p = 0; p < n; ++p) {
      const V got = ref::causal_attention<double>(q, k, v, p, window);
      const V want = masked_attention_by_hand(q, k, v, p, window);
      ASSERT_LE((got - want).cwiseAbs().maxCoeff(), 1e-12) << "window " << window << " position " << p;
    }
  }
  // The dominant key is seen while it is inside the window and not after.
  EXPECT_LE((ref::causal_attention<double>(q, k, v, 4, 5) - v.row(0).transpose()).cwiseAbs().maxCoeff(), 1e-6);
  EXPECT_GT((ref::causal_attention<double>(q, k, v, 5, 5) - v.row(0).transpose()).cwiseAbs().maxCoeff(), 1e-3);
}

ModelConfig mistral_sw(int64_t window) {
  ModelConfig c = *preset_config("tiny");
  c.architecture = Architecture::kMistral;
  c.num_layers = 2;
  c.sliding_window = window;
  return c;
}

TEST(SlidingWindow, OracleForwardsAgreeAndTheWindowChangesOnlyLongerContexts) {
  const int64_t window = 6;
  const ModelConfig c = mistral_sw(window);
  ASSERT_TRUE(c.validate().is_ok()) << c.validate().message();
  const Model windowed = make_random_model(c, 31);
  Model full = windowed;
  full.config.sliding_window = 0;
  full.config.architecture = Architecture::kLlama;
  const ReferenceModel<double> ow(windowed), of(full);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 20; ++i) tokens.push_back((i * 37 + 11) % 512);
  auto cw = ow.make_cache(32), cs = ow.make_cache(32), cf = of.make_cache(32);
  const auto block = *ow.forward(tokens, cw);
  const auto sequential = *ow.forward_sequential(tokens, cs);
  const auto unwindowed = *of.forward(tokens, cf);
  EXPECT_LE((block - sequential).cwiseAbs().maxCoeff(), 1e-9);
  for (Eigen::Index p = 0; p < block.rows(); ++p) {
    const double diff = (block.row(p) - unwindowed.row(p)).cwiseAbs().maxCoeff();
    if (p < window) {
      EXPECT_EQ(diff, 0.0) << "position " << p << " is inside the window: the unwindowed bits";
    } else {
      EXPECT_GT(diff, 1e-6) << "position " << p << " sees past the window in one of the two";
    }
  }
}

// A hybrid (Qwen2's layer_types): layer 0 attends to everything, layer 1 through the window.
// Inside the window all three models agree bit for bit; past it the hybrid is neither the
// unwindowed model nor the one windowed on every layer: each layer has its own window.
TEST(SlidingWindow, OracleHybridLayersEachHaveTheirOwnWindow) {
  const int64_t window = 6;
  ModelConfig c = *preset_config("tiny");
  c.architecture = Architecture::kQwen2;
  c.qkv_bias = true;
  c.num_layers = 2;
  c.sliding_window = window;
  c.sliding_layers = {false, true};
  ASSERT_TRUE(c.validate().is_ok()) << c.validate().message();
  ASSERT_EQ(c.layer_window(0), 0);
  ASSERT_EQ(c.layer_window(1), window);
  const Model hybrid = make_random_model(c, 41);
  Model every = hybrid, none = hybrid;
  every.config.sliding_layers.clear();
  none.config.sliding_layers.clear();
  none.config.sliding_window = 0;
  const ReferenceModel<double> oh(hybrid), oe(every), on(none);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 20; ++i) tokens.push_back((i * 53 + 7) % 512);
  auto ch = oh.make_cache(32), ce = oe.make_cache(32), cn = on.make_cache(32);
  const auto h = *oh.forward(tokens, ch);
  const auto e = *oe.forward(tokens, ce);
  const auto n = *on.forward(tokens, cn);
  for (Eigen::Index p = 0; p < h.rows(); ++p) {
    const double vs_every = (h.row(p) - e.row(p)).cwiseAbs().maxCoeff();
    const double vs_none = (h.row(p) - n.row(p)).cwiseAbs().maxCoeff();
    if (p < window) {
      EXPECT_EQ(vs_every, 0.0) << "position " << p;
      EXPECT_EQ(vs_none, 0.0) << "position " << p;
    } else {
      EXPECT_GT(vs_every, 1e-6) << "position " << p << ": layer 0 has no window";
      EXPECT_GT(vs_none, 1e-6) << "position " << p << ": layer 1 has one";
    }
  }
}

// The paged kernel over a scrambled table of `block_size` blocks against attention over the
// window's positions in double; with the table's blocks before the window pointing at a
// NaN block, the same bits.
TEST(SlidingWindow, CpuPagedKernelAttendsToTheWindowAndSkipsTheBlocksBeforeIt) {
  const int64_t d = 32, num_kv_heads = 2, kv_head = 1;
  for (int64_t block_size : {1, 4, 16}) {
    for (int64_t partition : {int64_t{7}, int64_t{32}, kernels::kDefaultAttentionPartition}) {
      for (int64_t window : {1, 3, 4, 16, 17, 100, 1000}) {
        const int64_t positions = 300;
        const int64_t blocks = (positions + block_size - 1) / block_size + 1;  // the last: NaN
        Rng rng(static_cast<uint64_t>(block_size * 1000 + window));
        std::vector<float> k(static_cast<std::size_t>(blocks * block_size * num_kv_heads * d));
        std::vector<float> v(k.size()), q(static_cast<std::size_t>(d));
        for (auto& x : k) x = static_cast<float>(rng.uniform(-1.0, 1.0));
        for (auto& x : v) x = static_cast<float>(rng.uniform(-1.0, 1.0));
        for (auto& x : q) x = static_cast<float>(rng.uniform(-1.0, 1.0));
        const int64_t nan_block = blocks - 1;
        std::fill(k.begin() + nan_block * block_size * num_kv_heads * d, k.end(), std::nanf(""));
        std::fill(v.begin() + nan_block * block_size * num_kv_heads * d, v.end(), std::nanf(""));
        std::vector<int32_t> table(static_cast<std::size_t>(blocks - 1));
        for (std::size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
        for (std::size_t i = table.size(); i > 1; --i) std::swap(table[i - 1], table[rng.below(i)]);
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        std::vector<float> scratch(static_cast<std::size_t>(kernels::attention_scratch_size<float>(d)));
        for (int64_t p : {int64_t{0}, window - 1, window, 2 * window + 3, positions - 1}) {
          if (p < 0 || p >= positions) continue;
          SCOPED_TRACE("block " + std::to_string(block_size) + " partition " + std::to_string(partition) + " window " +
                       std::to_string(window) + " position " + std::to_string(p));
          std::vector<float> got(static_cast<std::size_t>(d)), skipped(got.size());
          kernels::paged_attention_head(q.data(), k.data(), v.data(), table.data(), block_size, num_kv_heads, kv_head,
                                        d, p, scale, partition, scratch.data(), got.data(), nullptr, nullptr, window);
          // The same, over the window's positions in double.
          const int64_t first = std::max<int64_t>(0, p - window + 1);
          std::vector<double> s;
          double mx = -1e300;
          const auto row = [&](const std::vector<float>& pool, int64_t j) {
            const int64_t slot =
                static_cast<int64_t>(table[static_cast<std::size_t>(j / block_size)]) * block_size + j % block_size;
            return pool.data() + kernels::kv_pool_offset(slot, kv_head, num_kv_heads, d);
          };
          for (int64_t j = first; j <= p; ++j) {
            double dot = 0;
            for (int64_t e = 0; e < d; ++e) dot += static_cast<double>(q[static_cast<std::size_t>(e)]) * row(k, j)[e];
            s.push_back(dot * scale);
            mx = std::max(mx, s.back());
          }
          std::vector<double> want(static_cast<std::size_t>(d), 0.0);
          double sum = 0;
          for (int64_t j = first; j <= p; ++j) {
            const double w = std::exp(s[static_cast<std::size_t>(j - first)] - mx);
            sum += w;
            for (int64_t e = 0; e < d; ++e) want[static_cast<std::size_t>(e)] += w * row(v, j)[e];
          }
          for (int64_t e = 0; e < d; ++e)
            ASSERT_NEAR(got[static_cast<std::size_t>(e)], want[static_cast<std::size_t>(e)] / sum, 2e-6) << e;
          // Blocks wholly before the window point at the NaN block: not one bit changes.
          std::vector<int32_t> holed = table;
          for (int64_t b = 0; (b + 1) * block_size <= first; ++b)
            holed[static_cast<std::size_t>(b)] = static_cast<int32_t>(nan_block);
          kernels::paged_attention_head(q.data(), k.data(), v.data(), holed.data(), block_size, num_kv_heads, kv_head,
                                        d, p, scale, partition, scratch.data(), skipped.data(), nullptr, nullptr,
                                        window);
          for (int64_t e = 0; e < d; ++e) {
            uint32_t a, b;
            std::memcpy(&a, &got[static_cast<std::size_t>(e)], 4);
            std::memcpy(&b, &skipped[static_cast<std::size_t>(e)], 4);
            ASSERT_EQ(a, b) << "element " << e << " read a block before the window";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvp
