// kernels/cpu_attention.h: the vector loops of a host build give the bits of the scalar
// loops (what a device build and any non-GCC/Clang compiler run), for dot, rms_norm and
// paged attention over fp32 and fp16 pools, at head sizes that exercise every vector width
// and the scalar tails, with scores that rise (rescales) and fall, over several partitions;
// and a run of KV heads computed together gives each head its bits alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu_attention.h"
#include "tests/cpu_kernels_scalar.h"

namespace kvp {
namespace {

namespace kv = kvp::kernels::vector_loops;  // names the vector loops: fails to build without them
namespace ks = kvp::scalar_loops_test;

std::vector<float> random_floats(std::size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

void expect_same_bits(const std::vector<float>& vec, const std::vector<float>& scalar, const std::string& what) {
  ASSERT_EQ(vec.size(), scalar.size()) << what;
  for (std::size_t i = 0; i < vec.size(); ++i)
    ASSERT_EQ(bits(vec[i]), bits(scalar[i])) << what << " element " << i << ": " << vec[i] << " vs " << scalar[i];
}

TEST(CpuKernels, VectorDotAndRmsNormGiveTheScalarBits) {
  for (int64_t n = 0; n <= 200; ++n) {
    const auto a = random_floats(static_cast<std::size_t>(n), 1 + static_cast<uint64_t>(n));
    const auto b0 = random_floats(a.size(), 1000 + static_cast<uint64_t>(n));
    ASSERT_EQ(bits(kv::dot(a.data(), b0.data(), n)), bits(ks::dot(a.data(), b0.data(), n))) << "dot n " << n;
    if (n == 0) continue;
    std::vector<float> vo(a.size()), so(a.size());
    kv::rms_norm(a.data(), b0.data(), n, 1e-5f, vo.data());
    ks::rms_norm(a.data(), b0.data(), n, 1e-5f, so.data());
    expect_same_bits(vo, so, "rms_norm n " + std::to_string(n));
  }
}

// A pool of `blocks` blocks, a scrambled block table, and a query whose scores against the
// keys rise along the positions (every few positions a new maximum: the rescale path) with
// noise (positions below the maximum: the plain path).
struct AttentionCase {
  int64_t head_dim, block_size = 16, num_kv_heads = 2, positions;
  std::vector<float> k, v, q;
  std::vector<int32_t> table;
  AttentionCase(int64_t d, int64_t n, uint64_t seed) : head_dim(d), positions(n) {
    const int64_t blocks = (n + block_size - 1) / block_size;
    const auto rows = static_cast<std::size_t>(blocks * block_size * num_kv_heads * d);
    k = random_floats(rows, seed);
    v = random_floats(rows, seed + 1);
    q = random_floats(static_cast<std::size_t>(d), seed + 2);
    table.resize(static_cast<std::size_t>(blocks));
    Rng rng(seed + 3);
    for (int64_t b = 0; b < blocks; ++b) table[static_cast<std::size_t>(b)] = static_cast<int32_t>(b);
    for (std::size_t i = table.size(); i > 1; --i) std::swap(table[i - 1], table[rng.below(i)]);
    // Key rows of KV head 1 leaning towards q more and more with the position.
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot =
          static_cast<int64_t>(table[static_cast<std::size_t>(j / block_size)]) * block_size + j % block_size;
      float* row = k.data() + kernels::kv_pool_offset(slot, 1, num_kv_heads, d);
      const float lean = 0.02f * static_cast<float>(j % 37);
      for (int64_t e = 0; e < d; ++e) row[e] += lean * q[static_cast<std::size_t>(e)];
    }
  }
};

TEST(CpuKernels, VectorPagedAttentionGivesTheScalarBits) {
  for (const int64_t head_dim : {4, 8, 20, 32, 48, 64, 80, 96, 128}) {
    for (const int64_t positions : {1, 15, 33, 64, 129, 300}) {
      for (const int64_t partition : {int64_t{7}, int64_t{32}, kernels::kDefaultAttentionPartition}) {
        const AttentionCase c(head_dim, positions, static_cast<uint64_t>(head_dim * 1000 + positions));
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        const std::string what = "head_dim " + std::to_string(head_dim) + " position " + std::to_string(positions - 1) +
                                 " partition " + std::to_string(partition);
        for (int64_t kv_head = 0; kv_head < c.num_kv_heads; ++kv_head) {
          std::vector<float> vo(static_cast<std::size_t>(head_dim)), so(vo.size());
          std::vector<float> scratch(static_cast<std::size_t>(kv::attention_scratch_size<float>(head_dim)));
          kv::paged_attention_head(c.q.data(), c.k.data(), c.v.data(), c.table.data(), c.block_size, c.num_kv_heads,
                                   kv_head, head_dim, positions - 1, scale, partition, scratch.data(), vo.data());
          ks::attention(c.q.data(), c.k.data(), c.v.data(), c.table.data(), c.block_size, c.num_kv_heads, kv_head,
                        head_dim, positions - 1, scale, partition, so.data());
          expect_same_bits(vo, so, "fp32 " + what + " kv_head " + std::to_string(kv_head));

          std::vector<kernels::F16Bits> k16(c.k.size()), v16(c.v.size());
          for (std::size_t i = 0; i < c.k.size(); ++i) kernels::kv_store(&k16[i], c.k[i]);
          for (std::size_t i = 0; i < c.v.size(); ++i) kernels::kv_store(&v16[i], c.v[i]);
          std::vector<float> scratch16(
              static_cast<std::size_t>(kv::attention_scratch_size<kernels::F16Bits>(head_dim)));
          kv::paged_attention_head(c.q.data(), k16.data(), v16.data(), c.table.data(), c.block_size, c.num_kv_heads,
                                   kv_head, head_dim, positions - 1, scale, partition, scratch16.data(), vo.data());
          ks::attention(c.q.data(), k16.data(), v16.data(), c.table.data(), c.block_size, c.num_kv_heads, kv_head,
                        head_dim, positions - 1, scale, partition, so.data());
          expect_same_bits(vo, so, "fp16 " + what + " kv_head " + std::to_string(kv_head));
        }
      }
    }
  }
}

// paged_attention_kv_heads over a run of KV heads, with their groups of query heads, gives
// each head the bits paged_attention_head gives it alone (the engine calls the former, the
// plug-in and the CUDA kernel's tests the latter), for fp32 and fp16 pools.
template <typename KvT>
void expect_kv_heads_match_single_heads(const AttentionCase& c, const std::vector<KvT>& k, const std::vector<KvT>& v,
                                        int64_t group, int64_t partition, const std::string& what) {
  const int64_t d = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto q = random_floats(static_cast<std::size_t>(c.num_kv_heads * group * d), 77);
  for (int64_t kv_begin = 0; kv_begin < c.num_kv_heads; ++kv_begin) {
    for (int64_t kv_count = 1; kv_begin + kv_count <= c.num_kv_heads; ++kv_count) {
      const int64_t heads = kv_count * group;
      const float* q_run = q.data() + kv_begin * group * d;
      std::vector<float> run(static_cast<std::size_t>(heads * d), -7.0f);
      std::vector<float> scratch(static_cast<std::size_t>(kv::attention_scratch_size<KvT>(d, heads)));
      kv::paged_attention_kv_heads(q_run, k.data(), v.data(), c.table.data(), c.block_size, c.num_kv_heads, kv_begin,
                                   kv_count, group, d, c.positions - 1, scale, partition, scratch.data(), run.data());
      std::vector<float> alone(run.size());
      std::vector<float> scratch1(static_cast<std::size_t>(kv::attention_scratch_size<KvT>(d)));
      for (int64_t h = 0; h < heads; ++h) {
        kv::paged_attention_head(q_run + h * d, k.data(), v.data(), c.table.data(), c.block_size, c.num_kv_heads,
                                 kv_begin + h / group, d, c.positions - 1, scale, partition, scratch1.data(),
                                 alone.data() + h * d);
      }
      expect_same_bits(run, alone, what + " kv heads " + std::to_string(kv_begin) + " +" + std::to_string(kv_count));
    }
  }
}

TEST(CpuKernels, ARunOfKvHeadsGivesEachHeadItsBitsAlone) {
  for (const int64_t head_dim : {8, 20, 32, 64}) {
    for (const int64_t positions : {1, 13, 40, 300}) {
      for (const int64_t group : {1, 3}) {
        for (const int64_t partition : {int64_t{7}, kernels::kDefaultAttentionPartition}) {
          AttentionCase c(head_dim, positions, static_cast<uint64_t>(head_dim * 100 + positions));
          // Three KV heads: re-draw the pools at that width (AttentionCase leans head 1's keys).
          c.num_kv_heads = 3;
          const auto rows = c.table.size() * static_cast<std::size_t>(c.block_size * 3 * head_dim);
          c.k = random_floats(rows, 11 + static_cast<uint64_t>(positions));
          c.v = random_floats(rows, 12 + static_cast<uint64_t>(positions));
          const std::string what = "head_dim " + std::to_string(head_dim) + " positions " + std::to_string(positions) +
                                   " group " + std::to_string(group) + " partition " + std::to_string(partition);
          expect_kv_heads_match_single_heads(c, c.k, c.v, group, partition, "fp32 " + what);
          std::vector<kernels::F16Bits> k16(c.k.size()), v16(c.v.size());
          for (std::size_t i = 0; i < c.k.size(); ++i) kernels::kv_store(&k16[i], c.k[i]);
          for (std::size_t i = 0; i < c.v.size(); ++i) kernels::kv_store(&v16[i], c.v[i]);
          expect_kv_heads_match_single_heads(c, k16, v16, group, partition, "fp16 " + what);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvp
