// The CUDA backend's kernels (kernels/cuda/model_kernels.cu) against their CPU counterparts
// (kernels/cpu_attention.h), one kernel at a time. Built twice: into cuda_kernels_test
// against the emulated kernels (label kernel, every CI run, also under ASan and, a subset,
// TSan), and into cuda_kernels_gpu_test against the nvcc-built kernels (label gpu; each test
// skips with "no CUDA device" where there is none).
//
// Emulated, a kernel must give its CPU counterpart's bits: same operations, same order. On a
// GPU the device's expf/cosf/sinf and nvcc's FMA contraction may move the last bits, so the
// GPU flavour compares within kGpuRelTolerance of the row's largest value, and checks its own
// determinism bitwise instead (a token alone and in a batch).
//
// Attention grid: head dim {64, 128} (256 on a GPU), block size {1, 8, 16, 32}, (query heads,
// KV heads) in {(8,8), (32,8), (32,1)}, plus the real models' (9,3), (14,2) and (32,4) at
// head dim 64, every KV dtype, contexts 1, block size +- 1,
// partition size +- 1 and several partitions long; block tables drawn without replacement
// from a pool four times larger than the sequences, every slot that is not theirs NaN.
// Beside the grid, a RapidCheck property draws shapes (head dims 1 to 257, groups up to 400
// query heads per KV head) and requires each to be computed as on the CPU or refused by
// check_attention_shape.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include "common/dtype.h"
#include "kernels/cpu_attention.h"
#include "kernels/cuda/model_kernels.h"
#include "kernels/gemm.h"
#include "kernels/kv_element.h"
#include "kernels/kv_index.h"
#include "kernels/simt/config.h"

#if defined(KVP_CUDA_DEVICE_FLAVOUR)
#define CUDA_KERNEL_SUITE CudaGpuKernels
constexpr bool kBitwise = false;
#else
#define CUDA_KERNEL_SUITE CudaEmuKernels
constexpr bool kBitwise = true;
#endif

namespace kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS {
namespace {

namespace kk = ::kvp::kernels;

constexpr double kGpuRelTolerance = 1e-4;

#define REQUIRE_DEVICE()                                                     \
  do {                                                                       \
    if (const std::string e = check_device(); !e.empty()) GTEST_SKIP() << e; \
  } while (0)

// A device array that frees itself.
struct DeviceArray {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit DeviceArray(std::size_t n) : bytes(n) {
    const std::string e = device_alloc(&ptr, n);
    if (!e.empty()) ADD_FAILURE() << e;
  }
  ~DeviceArray() { device_free(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

template <class T>
void upload(DeviceArray& d, const std::vector<T>& h) {
  ASSERT_EQ(copy_to_device(d.ptr, h.data(), h.size() * sizeof(T)), "");
}
template <class T>
std::vector<T> download(const DeviceArray& d, std::size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(copy_to_host(h.data(), d.ptr, n * sizeof(T)), "");
  return h;
}

std::vector<float> random_floats(std::size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// "" when got == want bit for bit (emulated) or within kGpuRelTolerance of max|want| (GPU),
// never NaN where want is a number; else what differs first.
std::string compare_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  if (got.size() != want.size())
    return what + ": " + std::to_string(got.size()) + " elements, want " + std::to_string(want.size());
  float scale = 0.0f;
  for (float w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool differs = kBitwise ? bits(got[i]) != bits(want[i])
                                  : (std::isnan(got[i]) && !std::isnan(want[i])) ||
                                        !(std::abs(got[i] - want[i]) <= kGpuRelTolerance * scale);
    if (differs)
      return what + " element " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
  }
  return {};
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  const std::string e = compare_close(got, want, what);
  ASSERT_TRUE(e.empty()) << e;
}

// ---- the per-token kernels ----

// Restores the projections' lanes per row when a test ends (set_project_lanes is process-wide).
struct ProjectLanes {
  int saved = project_lanes();
  explicit ProjectLanes(int lanes) { EXPECT_TRUE(set_project_lanes(lanes)); }
  ~ProjectLanes() { set_project_lanes(saved); }
  ProjectLanes(const ProjectLanes&) = delete;
  ProjectLanes& operator=(const ProjectLanes&) = delete;
};

// The projection's arithmetic is kernels/gemm.h's definition (the CPU backend's GEMM gives
// the same bits; gemm_test checks that).
// Both row layouts: one thread per row, and a half-warp per row (lane l the definition's
// partial sum l, the tree as a shuffle butterfly, lane 0 the tail): in_dim under 16 (all
// tail), a multiple of 16 (no tail), and both.
TEST(CUDA_KERNEL_SUITE, ProjectIsTheGemmDefinitionOfEveryRowWhateverTheTokenCount) {
  REQUIRE_DEVICE();
  for (const int lanes : {1, 16})
    for (const auto& [out_dim, in_dim] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {96, 64}, {130, 17}, {5, 250}}) {
      SCOPED_TRACE(std::to_string(lanes) + " lanes per row");
      const ProjectLanes scoped(lanes);
      const std::vector<float> w = random_floats(static_cast<std::size_t>(out_dim * in_dim), 1);
      DeviceArray dw(w.size() * sizeof(float));
      upload(dw, w);
      for (int64_t n : {1, 3, 9}) {
        const std::vector<float> x = random_floats(static_cast<std::size_t>(n * in_dim), 2);
        DeviceArray dx(x.size() * sizeof(float)), dy(static_cast<std::size_t>(n * out_dim) * sizeof(float));
        upload(dx, x);
        ASSERT_EQ(project(dw.as<float>(), nullptr, out_dim, in_dim, dx.as<float>(), n, dy.as<float>()), "");
        std::vector<float> want(static_cast<std::size_t>(n * out_dim));
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < out_dim; ++r)
            want[static_cast<std::size_t>(t * out_dim + r)] =
                kk::dot_fma_scalar(w.data() + r * in_dim, x.data() + t * in_dim, in_dim);
        expect_close(download<float>(dy, want.size()), want,
                     "project " + std::to_string(out_dim) + "x" + std::to_string(in_dim) + " n " + std::to_string(n));
        // With a bias (Qwen2's q/k/v, Llama's attention_bias/mlp_bias): one add after the dot.
        const std::vector<float> b = random_floats(static_cast<std::size_t>(out_dim), 3);
        DeviceArray db(b.size() * sizeof(float));
        upload(db, b);
        ASSERT_EQ(project(dw.as<float>(), db.as<float>(), out_dim, in_dim, dx.as<float>(), n, dy.as<float>()), "");
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < out_dim; ++r)
            want[static_cast<std::size_t>(t * out_dim + r)] += b[static_cast<std::size_t>(r)];
        expect_close(
            download<float>(dy, want.size()), want,
            "project+bias " + std::to_string(out_dim) + "x" + std::to_string(in_dim) + " n " + std::to_string(n));
      }
    }
}

TEST(CUDA_KERNEL_SUITE, EmbedRmsNormSiluAddAndRopeMatchTheCpuLoops) {
  REQUIRE_DEVICE();
  const int64_t n = 5, hidden = 48, vocab = 11, heads = 3, head_dim = 16;
  const std::vector<float> table = random_floats(static_cast<std::size_t>(vocab * hidden), 3);
  const std::vector<int32_t> ids = {4, 0, 10, 4, 7};
  DeviceArray dtable(table.size() * 4), dids(ids.size() * 4), dx(static_cast<std::size_t>(n * hidden) * 4);
  upload(dtable, table);
  upload(dids, ids);
  ASSERT_EQ(embed(dtable.as<float>(), dids.as<int32_t>(), n, hidden, dx.as<float>()), "");
  std::vector<float> want(static_cast<std::size_t>(n * hidden));
  for (int64_t t = 0; t < n; ++t)
    std::copy_n(table.begin() + ids[static_cast<std::size_t>(t)] * hidden, hidden, want.begin() + t * hidden);
  ASSERT_EQ(download<float>(dx, want.size()), want);  // a gather: exact on every flavour

  const std::vector<float> weight = random_floats(static_cast<std::size_t>(hidden), 4, 0.5f, 1.5f);
  const std::vector<int32_t> rows = {3, 1};
  DeviceArray dw(weight.size() * 4), drows(rows.size() * 4), dout(static_cast<std::size_t>(n * hidden) * 4);
  upload(dw, weight);
  upload(drows, rows);
  ASSERT_EQ(rms_norm(dx.as<float>(), drows.as<int32_t>(), dw.as<float>(), 2, hidden, 1e-5f, dout.as<float>()), "");
  std::vector<float> normed(static_cast<std::size_t>(2 * hidden));
  for (int64_t r = 0; r < 2; ++r)
    kk::rms_norm(want.data() + rows[static_cast<std::size_t>(r)] * hidden, weight.data(), hidden, 1e-5f,
                 normed.data() + r * hidden);
  expect_close(download<float>(dout, normed.size()), normed, "rms_norm");

  std::vector<float> gate = random_floats(static_cast<std::size_t>(n * hidden), 5, -6.0f, 6.0f);
  const std::vector<float> up = random_floats(gate.size(), 6);
  DeviceArray dgate(gate.size() * 4), dup(up.size() * 4);
  upload(dgate, gate);
  upload(dup, up);
  ASSERT_EQ(silu_mul(dgate.as<float>(), dup.as<float>(), static_cast<int64_t>(gate.size())), "");
  ASSERT_EQ(add_in_place(dgate.as<float>(), dup.as<float>(), static_cast<int64_t>(gate.size())), "");
  for (std::size_t i = 0; i < gate.size(); ++i) gate[i] = kk::silu(gate[i]) * up[i] + up[i];
  expect_close(download<float>(dgate, gate.size()), gate, "silu_mul then add");

  std::vector<float> inv_freq;
  for (int64_t i = 0; i < head_dim / 2; ++i)
    inv_freq.push_back(1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(head_dim)));
  std::vector<float> x = random_floats(static_cast<std::size_t>(n * heads * head_dim), 7);
  const std::vector<int32_t> positions = {0, 1, 17, 300, 4095};
  DeviceArray dq(x.size() * 4), dpos(positions.size() * 4), dfreq(inv_freq.size() * 4);
  upload(dq, x);
  upload(dpos, positions);
  upload(dfreq, inv_freq);
  ASSERT_EQ(rope(dq.as<float>(), n, heads, head_dim, dpos.as<int32_t>(), dfreq.as<float>()), "");
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> cs(static_cast<std::size_t>(head_dim / 2)), sn(cs.size());
    kk::rope_cos_sin(positions[static_cast<std::size_t>(t)], inv_freq.data(), head_dim / 2, cs.data(), sn.data());
    for (int64_t h = 0; h < heads; ++h)
      kk::apply_rope(x.data() + (t * heads + h) * head_dim, cs.data(), sn.data(), head_dim / 2);
  }
  expect_close(download<float>(dq, x.size()), x, "rope");
}

// The engine's fused kernels (a layer in seven or eight launches) against the unfused kernels they
// replace, on the same inputs: the same values on every flavour (bit for bit emulated).
// The first `bytes` of two device arrays are equal, or where they first differ.
void expect_same_bytes(const DeviceArray& a, const DeviceArray& b, std::size_t bytes, const char* what) {
  const std::vector<uint8_t> x = download<uint8_t>(a, bytes);
  const std::vector<uint8_t> y = download<uint8_t>(b, bytes);
  const auto at = std::mismatch(x.begin(), x.end(), y.begin()).first - x.begin();
  EXPECT_EQ(at, static_cast<std::ptrdiff_t>(bytes)) << what << " differs first at byte " << at;
}

void fused_kernels_give_the_unfused_results() {
  const int64_t n = 11, in_dim = 40, heads = 4, kv_heads = 2, head_dim = 16;
  const int64_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim, inter = 24;
  const auto f = [](std::size_t count, uint32_t seed) { return random_floats(count, seed); };
  const auto sz = [](int64_t a) { return static_cast<std::size_t>(a); };
  const auto dev = [&](const std::vector<float>& h) {
    auto d = std::make_unique<DeviceArray>(h.size() * sizeof(float));
    upload(*d, h);
    return d;
  };
  const auto x = dev(f(sz(n * in_dim), 1));
  const auto wq = dev(f(sz(q_dim * in_dim), 2)), wk = dev(f(sz(kv_dim * in_dim), 3)),
             wv = dev(f(sz(kv_dim * in_dim), 4));
  const auto bq = dev(f(sz(q_dim), 5)), bk = dev(f(sz(kv_dim), 6)), bv = dev(f(sz(kv_dim), 7));

  // project_qkv, with and without biases.
  for (const bool bias : {false, true}) {
    DeviceArray q(sz(n * q_dim) * 4), k(sz(n * kv_dim) * 4), v(sz(n * kv_dim) * 4);
    DeviceArray q2(q.bytes), k2(k.bytes), v2(v.bytes);
    const float* pq = bias ? bq->as<float>() : nullptr;
    const float* pk = bias ? bk->as<float>() : nullptr;
    const float* pv = bias ? bv->as<float>() : nullptr;
    ASSERT_EQ(project_qkv(wq->as<float>(), pq, wk->as<float>(), pk, wv->as<float>(), pv, q_dim, kv_dim, in_dim,
                          x->as<float>(), n, q.as<float>(), k.as<float>(), v.as<float>()),
              "");
    ASSERT_EQ(project(wq->as<float>(), pq, q_dim, in_dim, x->as<float>(), n, q2.as<float>()), "");
    ASSERT_EQ(project(wk->as<float>(), pk, kv_dim, in_dim, x->as<float>(), n, k2.as<float>()), "");
    ASSERT_EQ(project(wv->as<float>(), pv, kv_dim, in_dim, x->as<float>(), n, v2.as<float>()), "");
    expect_close(download<float>(q, sz(n * q_dim)), download<float>(q2, sz(n * q_dim)), "project_qkv q");
    expect_close(download<float>(k, sz(n * kv_dim)), download<float>(k2, sz(n * kv_dim)), "project_qkv k");
    expect_close(download<float>(v, sz(n * kv_dim)), download<float>(v2, sz(n * kv_dim)), "project_qkv v");
  }

  // project_gated, SiLU and tanh GELU.
  const auto wg = dev(f(sz(inter * in_dim), 8)), wu = dev(f(sz(inter * in_dim), 9)), bg = dev(f(sz(inter), 10));
  for (const bool gelu : {false, true}) {
    DeviceArray g(sz(n * inter) * 4), u(g.bytes), g2(g.bytes), u2(g.bytes);
    ASSERT_EQ(project_gated(wg->as<float>(), bg->as<float>(), wu->as<float>(), nullptr, inter, in_dim, x->as<float>(),
                            n, gelu, g.as<float>(), u.as<float>()),
              "");
    ASSERT_EQ(project(wg->as<float>(), bg->as<float>(), inter, in_dim, x->as<float>(), n, g2.as<float>()), "");
    ASSERT_EQ(project(wu->as<float>(), nullptr, inter, in_dim, x->as<float>(), n, u2.as<float>()), "");
    ASSERT_EQ(gelu ? gelu_tanh_mul(g2.as<float>(), u2.as<float>(), n * inter)
                   : silu_mul(g2.as<float>(), u2.as<float>(), n * inter),
              "");
    expect_close(download<float>(g, sz(n * inter)), download<float>(g2, sz(n * inter)),
                 gelu ? "project_gated gelu" : "project_gated silu");
  }

  // heads_rope_kv: with and without q/k norms, into a bf16 pool and a scaled fp8 pool; token 3
  // has slot -1 (skipped).
  std::vector<float> inv_freq;
  for (int64_t i = 0; i < head_dim / 2; ++i)
    inv_freq.push_back(1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(head_dim)));
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  for (int64_t t = 0; t < n; ++t) {
    positions.push_back(static_cast<int32_t>(t * 37 % 500));
    slots.push_back(t == 3 ? kk::kSkipSlot : (t * 5) % 64);
  }
  DeviceArray dpos(positions.size() * 4), dslots(slots.size() * 8);
  upload(dpos, positions);
  upload(dslots, slots);
  const auto freq = dev(inv_freq);
  const auto qn = dev(random_floats(sz(head_dim), 11, 0.5f, 1.5f)),
             kn = dev(random_floats(sz(head_dim), 12, 0.5f, 1.5f));
  const auto ks = dev(random_floats(sz(kv_heads), 13, 0.05f, 0.2f)),
             vs = dev(random_floats(sz(kv_heads), 14, 0.05f, 0.2f));
  const std::vector<float> q0 = f(sz(n * q_dim), 15), k0 = f(sz(n * kv_dim), 16), v0 = f(sz(n * kv_dim), 17);
  for (const DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    for (const bool norms : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (norms ? " with q/k norms" : ""));
      const std::size_t pool_bytes = sz(64 * kv_dim) * dtype_size(dtype);
      DeviceArray kp(pool_bytes), vp(pool_bytes), kp2(pool_bytes), vp2(pool_bytes);
      for (DeviceArray* p : {&kp, &vp, &kp2, &vp2}) ASSERT_EQ(fill_kv_nan(p->ptr, 64 * kv_dim, dtype), "");
      const float* k_scale = is_fp8(dtype) ? ks->as<float>() : nullptr;
      const float* v_scale = is_fp8(dtype) ? vs->as<float>() : nullptr;
      const auto q = dev(q0), k = dev(k0), v = dev(v0), q2 = dev(q0), k2 = dev(k0);
      ASSERT_EQ(
          heads_rope_kv(q->as<float>(), k->as<float>(), v->as<float>(), n, heads, kv_heads, head_dim,
                        norms ? qn->as<float>() : nullptr, norms ? kn->as<float>() : nullptr, 1e-6f, dpos.as<int32_t>(),
                        freq->as<float>(), dslots.as<int64_t>(), dtype, kp.ptr, vp.ptr, k_scale, v_scale),
          "");
      if (norms) {
        ASSERT_EQ(rms_norm(q2->as<float>(), nullptr, qn->as<float>(), n * heads, head_dim, 1e-6f, q2->as<float>()), "");
        ASSERT_EQ(rms_norm(k2->as<float>(), nullptr, kn->as<float>(), n * kv_heads, head_dim, 1e-6f, k2->as<float>()),
                  "");
      }
      ASSERT_EQ(rope(q2->as<float>(), n, heads, head_dim, dpos.as<int32_t>(), freq->as<float>()), "");
      ASSERT_EQ(rope(k2->as<float>(), n, kv_heads, head_dim, dpos.as<int32_t>(), freq->as<float>()), "");
      ASSERT_EQ(write_kv(k2->as<float>(), v->as<float>(), dslots.as<int64_t>(), n, kv_dim, dtype, kp2.ptr, vp2.ptr,
                         head_dim, k_scale, v_scale),
                "");
      expect_close(download<float>(*q, q0.size()), download<float>(*q2, q0.size()), "heads_rope_kv q");
      // The pools as raw bytes: the same elements written, the same skipped (still poison).
      // Emulated only: on a GPU nvcc may contract RoPE's products differently in the two
      // kernels, and a last-bit difference can survive the rounding to the pool's type.
      if (kBitwise) {
        expect_same_bytes(kp, kp2, pool_bytes, "K pool");
        expect_same_bytes(vp, vp2, pool_bytes, "V pool");
      }
    }
  }

  // project_qkv_rope_kv: project_qkv then heads_rope_kv (no q/k norms), with biases.
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF8E5M2}) {
    SCOPED_TRACE("project_qkv_rope_kv " + std::string(dtype_name(dtype)));
    const std::size_t pool_bytes = sz(64 * kv_dim) * dtype_size(dtype);
    DeviceArray kp(pool_bytes), vp(pool_bytes), kp2(pool_bytes), vp2(pool_bytes);
    for (DeviceArray* p : {&kp, &vp, &kp2, &vp2}) ASSERT_EQ(fill_kv_nan(p->ptr, 64 * kv_dim, dtype), "");
    const float* k_scale = is_fp8(dtype) ? ks->as<float>() : nullptr;
    const float* v_scale = is_fp8(dtype) ? vs->as<float>() : nullptr;
    DeviceArray q(sz(n * q_dim) * 4), k(sz(n * kv_dim) * 4), v(sz(n * kv_dim) * 4);
    DeviceArray q2(q.bytes), k2(k.bytes), v2(v.bytes);
    ASSERT_EQ(project_qkv_rope_kv(wq->as<float>(), bq->as<float>(), wk->as<float>(), bk->as<float>(), wv->as<float>(),
                                  bv->as<float>(), heads, kv_heads, head_dim, in_dim, x->as<float>(), n,
                                  dpos.as<int32_t>(), freq->as<float>(), dslots.as<int64_t>(), q.as<float>(),
                                  k.as<float>(), v.as<float>(), dtype, kp.ptr, vp.ptr, k_scale, v_scale),
              "");
    ASSERT_EQ(project_qkv(wq->as<float>(), bq->as<float>(), wk->as<float>(), bk->as<float>(), wv->as<float>(),
                          bv->as<float>(), q_dim, kv_dim, in_dim, x->as<float>(), n, q2.as<float>(), k2.as<float>(),
                          v2.as<float>()),
              "");
    ASSERT_EQ(heads_rope_kv(q2.as<float>(), k2.as<float>(), v2.as<float>(), n, heads, kv_heads, head_dim, nullptr,
                            nullptr, 1e-6f, dpos.as<int32_t>(), freq->as<float>(), dslots.as<int64_t>(), dtype, kp2.ptr,
                            vp2.ptr, k_scale, v_scale),
              "");
    expect_close(download<float>(q, sz(n * q_dim)), download<float>(q2, sz(n * q_dim)), "project_qkv_rope_kv q");
    if (kBitwise) {
      expect_same_bytes(kp, kp2, pool_bytes, "K pool");
      expect_same_bytes(vp, vp2, pool_bytes, "V pool");
    }
  }

  // add_norm: Llama's (no post-norm), Gemma's (post-norm), the last layer's (no next norm).
  const auto post = dev(random_floats(sz(in_dim), 18, 0.5f, 1.5f)),
             next = dev(random_floats(sz(in_dim), 19, 0.5f, 1.5f));
  const std::vector<float> y0 = f(sz(n * in_dim), 20), r0 = f(sz(n * in_dim), 21);
  for (const auto& [with_post, with_next] : {std::pair{false, true}, {true, true}, {true, false}}) {
    SCOPED_TRACE(std::string(with_post ? "post-norm" : "") + (with_next ? " next norm" : ""));
    const auto y = dev(y0), r = dev(r0), h = dev(y0), y2 = dev(y0), r2 = dev(r0), h2 = dev(y0);
    ASSERT_EQ(add_norm(y->as<float>(), with_post ? post->as<float>() : nullptr, r->as<float>(),
                       with_next ? next->as<float>() : nullptr, n, in_dim, 1e-6f, h->as<float>()),
              "");
    if (with_post) {
      ASSERT_EQ(rms_norm(y2->as<float>(), nullptr, post->as<float>(), n, in_dim, 1e-6f, y2->as<float>()), "");
    }
    ASSERT_EQ(add_in_place(r2->as<float>(), y2->as<float>(), n * in_dim), "");
    if (with_next) {
      ASSERT_EQ(rms_norm(r2->as<float>(), nullptr, next->as<float>(), n, in_dim, 1e-6f, h2->as<float>()), "");
    }
    expect_close(download<float>(*r, y0.size()), download<float>(*r2, y0.size()), "add_norm residual");
    expect_close(download<float>(*h, y0.size()), download<float>(*h2, y0.size()), "add_norm next input");
  }
}

// With one thread per projection row and with a half-warp per row (the GPU's default): both
// give the definition's bits, so the fused and unfused kernels agree under either.
TEST(CUDA_KERNEL_SUITE, FusedKernelsGiveTheUnfusedKernelsResults) {
  REQUIRE_DEVICE();
  for (const int lanes : {1, 16}) {
    SCOPED_TRACE(std::to_string(lanes) + " lanes per projection row");
    const ProjectLanes scoped(lanes);
    fused_kernels_give_the_unfused_results();
  }
}

// ---- KV write, poison, attention ----

// The flag spelling with '-' as '_' (a test name's characters).
std::string dtype_flag(DType d) {
  std::string s(dtype_flag_name(d));
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

// A host copy of a pool of `dtype`, as raw elements, with the CPU counterpart's view.
struct HostPool {
  DType dtype;
  std::vector<unsigned char> raw;
  std::size_t element() const { return dtype_size(dtype); }
  float at(int64_t i) const {
    return kk::kv_element_to_float(dtype, raw.data() + static_cast<std::size_t>(i) * element());
  }
  // The bits the kernel must have written for value x.
  bool holds(int64_t i, float x) const {
    const unsigned char* e = raw.data() + static_cast<std::size_t>(i) * element();
    if (dtype == DType::kF32) return std::memcmp(e, &x, 4) == 0;
    if (dtype == DType::kF8E4M3) return *e == float_to_fp8_e4m3(x);
    if (dtype == DType::kF8E5M2) return *e == float_to_fp8_e5m2(x);
    const uint16_t want = dtype == DType::kF16 ? float_to_f16(x) : float_to_bf16(x);
    return std::memcmp(e, &want, 2) == 0;
  }
};

// The CPU counterpart: paged_attention_head over the host copy of the pool, typed.
template <class KvT>
void cpu_attention_typed(const std::vector<float>& q, const HostPool& k, const HostPool& v, const int32_t* table,
                         int64_t block_size, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                         int64_t position, float scale, int64_t partition, float* out, int64_t window) {
  const int64_t group = num_heads / num_kv_heads;
  std::vector<float> scratch(static_cast<std::size_t>(kk::attention_scratch_size<KvT>(head_dim)));
  const auto* kp = reinterpret_cast<const KvT*>(k.raw.data());
  const auto* vp = reinterpret_cast<const KvT*>(v.raw.data());
  for (int64_t h = 0; h < num_heads; ++h)
    kk::paged_attention_head(q.data() + h * head_dim, kp, vp, table, block_size, num_kv_heads, h / group, head_dim,
                             position, scale, partition, scratch.data(), out + h * head_dim, nullptr, nullptr, window);
}

// Not inlined: GCC 12 at -O3 (the release preset) propagated the long-context test's constants
// into the kernels' vector-loop tails and reported a false -Waggressive-loop-optimizations
// ("iteration 4611686018427387903 invokes undefined behavior") in kernels/cpu_attention.h.
[[gnu::noinline]] void cpu_attention(const std::vector<float>& q, const HostPool& k, const HostPool& v,
                                     const int32_t* table, int64_t block_size, int64_t num_heads, int64_t num_kv_heads,
                                     int64_t head_dim, int64_t position, float scale, int64_t partition, float* out,
                                     int64_t window = 0) {
  switch (k.dtype) {
    case DType::kF32:
      return cpu_attention_typed<float>(q, k, v, table, block_size, num_heads, num_kv_heads, head_dim, position, scale,
                                        partition, out, window);
    case DType::kF16:
      return cpu_attention_typed<kk::F16Bits>(q, k, v, table, block_size, num_heads, num_kv_heads, head_dim, position,
                                              scale, partition, out, window);
    case DType::kF8E4M3:
      return cpu_attention_typed<kk::F8E4M3Bits>(q, k, v, table, block_size, num_heads, num_kv_heads, head_dim,
                                                 position, scale, partition, out, window);
    case DType::kF8E5M2:
      return cpu_attention_typed<kk::F8E5M2Bits>(q, k, v, table, block_size, num_heads, num_kv_heads, head_dim,
                                                 position, scale, partition, out, window);
    default:
      return cpu_attention_typed<kk::BF16Bits>(q, k, v, table, block_size, num_heads, num_kv_heads, head_dim, position,
                                               scale, partition, out, window);
  }
}

struct GridCase {
  int64_t head_dim;
  int64_t block_size;
  int64_t num_heads;
  int64_t num_kv_heads;
  DType dtype;
};

// Appended piece by piece: GCC 12 at -O3 (the release preset) reports a false -Wrestrict
// overlap in std::string's insert behind `"literal" + std::string`.
std::string case_name(const GridCase& c) {
  std::string name = "d";
  name += std::to_string(c.head_dim);
  name += "_b";
  name += std::to_string(c.block_size);
  name += "_h";
  name += std::to_string(c.num_heads);
  name += "kv";
  name += std::to_string(c.num_kv_heads);
  name += "_";
  name += dtype_flag(c.dtype);
  return name;
}

// Positions per partition in the grid: small, so that "several partitions long" stays short
// enough for the emulator under ASan; the default (128) is covered by the backend tests.
// Under ThreadSanitizer every CUDA thread is an OS thread: smaller still.
#if defined(KVP_SIMT_THREADS)
constexpr int64_t kGridPartition = 8;
#else
constexpr int64_t kGridPartition = 32;
#endif

// One sequence in a batch: its context length and how many of its last positions are queries
// (1: decode; more: a chunk of prefill, causal within the chunk).
struct Seq {
  int64_t context;
  int64_t queries;
};

// Runs write_kv then attention on one batch of sequences over a NaN-filled pool with block
// tables drawn without replacement; checks the pool after the write (each slot the value
// rounded to the dtype, -1 slots and every other slot untouched NaN) and every query's output
// against the CPU counterpart. Returns the outputs, [token][num_heads * head_dim], or the
// first thing that was wrong.
struct AttentionRun {
  std::vector<float> out;
  std::string error;  // "" when every check held
};

// With a sliding `window` (> 0), each sequence's table entries of the blocks wholly before
// the window of its first query point at a block no sequence wrote (NaN): a kernel that read
// them would show it, so the check also proves those blocks are skipped, not masked.
AttentionRun try_attention_case(const GridCase& c, const std::vector<Seq>& seqs, int64_t partition, uint32_t seed,
                                int64_t window = 0) {
  auto failed = [](std::string why) { return AttentionRun{{}, std::move(why)}; };
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  const int64_t q_dim = c.num_heads * c.head_dim;
  int64_t needed = 0, max_blocks = 0;
  for (const Seq& s : seqs) {
    needed += kk::blocks_for_tokens(s.context, c.block_size);
    max_blocks = std::max(max_blocks, kk::blocks_for_tokens(s.context, c.block_size));
  }
  const int64_t num_blocks = 4 * needed + 8;
  const int64_t pool_elements = num_blocks * c.block_size * kv_dim;
  const std::size_t pool_bytes = static_cast<std::size_t>(pool_elements) * dtype_size(c.dtype);
  DeviceArray k_pool(pool_bytes), v_pool(pool_bytes);
  // K by the poison kernel; V by an upload of the dtype's NaN (the emulator pays a fiber per
  // few elements of a kernel, and the pools are large).
  if (std::string e = fill_kv_nan(k_pool.ptr, pool_elements, c.dtype); !e.empty()) return failed(e);
  {
    HostPool nan_pool{c.dtype, std::vector<unsigned char>(pool_bytes)};
    for (std::size_t i = 0; i < pool_bytes; i += nan_pool.element())
      kk::kv_element_store_nan(c.dtype, nan_pool.raw.data() + i);
    upload(v_pool, nan_pool.raw);
  }

  // Block tables: distinct ids from the whole pool.
  std::mt19937 gen(seed);
  std::vector<int32_t> ids(static_cast<std::size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), gen);
  std::vector<int32_t> tables(seqs.size() * static_cast<std::size_t>(max_blocks), -1);
  std::size_t next = 0;
  for (std::size_t s = 0; s < seqs.size(); ++s)
    for (int64_t b = 0; b < kk::blocks_for_tokens(seqs[s].context, c.block_size); ++b)
      tables[s * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(b)] = ids[next++];

  // Every position's K/V, written by write_kv; one slot in seven is -1 in a second write of
  // garbage that must change nothing.
  std::vector<int64_t> slots;
  for (std::size_t s = 0; s < seqs.size(); ++s)
    for (int64_t p = 0; p < seqs[s].context; ++p)
      slots.push_back(kk::slot_of(tables.data() + s * static_cast<std::size_t>(max_blocks), p, c.block_size));
  const auto total = static_cast<int64_t>(slots.size());
  const std::vector<float> k = random_floats(static_cast<std::size_t>(total * kv_dim), seed + 1, -2.0f, 2.0f);
  const std::vector<float> v = random_floats(k.size(), seed + 2);
  DeviceArray dk(k.size() * 4), dv(v.size() * 4), dslots(slots.size() * 8);
  upload(dk, k);
  upload(dv, v);
  upload(dslots, slots);
  if (std::string e = write_kv(dk.as<float>(), dv.as<float>(), dslots.as<int64_t>(), total, kv_dim, c.dtype, k_pool.ptr,
                               v_pool.ptr);
      !e.empty())
    return failed(e);
  std::vector<int64_t> skipped(slots.size(), kk::kSkipSlot);
  upload(dslots, skipped);
  const std::vector<float> garbage = random_floats(k.size(), seed + 3, 50.0f, 60.0f);
  upload(dk, garbage);
  if (std::string e = write_kv(dk.as<float>(), dk.as<float>(), dslots.as<int64_t>(), total, kv_dim, c.dtype, k_pool.ptr,
                               v_pool.ptr);
      !e.empty())
    return failed(e);

  HostPool hk{c.dtype, download<unsigned char>(k_pool, pool_bytes)};
  HostPool hv{c.dtype, download<unsigned char>(v_pool, pool_bytes)};
  std::vector<char> written(static_cast<std::size_t>(num_blocks * c.block_size), 0);
  for (int64_t t = 0; t < total; ++t) {
    const int64_t slot = slots[static_cast<std::size_t>(t)];
    written[static_cast<std::size_t>(slot)] = 1;
    for (int64_t e = 0; e < kv_dim; ++e) {
      const int64_t i = slot * kv_dim + e;
      if (!hk.holds(i, k[static_cast<std::size_t>(t * kv_dim + e)]) ||
          !hv.holds(i, v[static_cast<std::size_t>(t * kv_dim + e)])) {
        return failed("write_kv: slot " + std::to_string(slot) + " element " + std::to_string(e) +
                      " does not hold its value");
      }
    }
  }
  for (int64_t slot = 0; slot < num_blocks * c.block_size; ++slot) {
    if (written[static_cast<std::size_t>(slot)]) continue;
    for (int64_t e = 0; e < kv_dim; ++e)
      if (!std::isnan(hk.at(slot * kv_dim + e)) || !std::isnan(hv.at(slot * kv_dim + e))) {
        return failed("slot " + std::to_string(slot) + " is no sequence's but is not NaN");
      }
  }

  // A window's blocks left behind: a NaN block instead (ids[next] onwards were never written).
  if (window > 0) {
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      const int64_t first = kk::window_first(seqs[s].context - seqs[s].queries, window);
      for (int64_t b = 0; (b + 1) * c.block_size <= first; ++b)
        tables[s * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(b)] = ids[next];
    }
  }

  // The queries: the last `queries` positions of each sequence.
  std::vector<int32_t> seq_of_token, positions;
  for (std::size_t s = 0; s < seqs.size(); ++s)
    for (int64_t p = seqs[s].context - seqs[s].queries; p < seqs[s].context; ++p) {
      seq_of_token.push_back(static_cast<int32_t>(s));
      positions.push_back(static_cast<int32_t>(p));
    }
  const auto n = static_cast<int64_t>(positions.size());
  const std::vector<float> q = random_floats(static_cast<std::size_t>(n * q_dim), seed + 4);
  const int32_t max_position = *std::max_element(positions.begin(), positions.end());
  const int64_t parts = attention_partitions(max_position, partition);
  DeviceArray dq(q.size() * 4), dtables(tables.size() * 4), dseq(seq_of_token.size() * 4), dpos(positions.size() * 4),
      dout(q.size() * 4),
      dws(static_cast<std::size_t>(attention_workspace_floats(n, c.num_heads, c.head_dim, parts)) * 4);
  upload(dq, q);
  upload(dtables, tables);
  upload(dseq, seq_of_token);
  upload(dpos, positions);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (std::string e = attention(dq.as<float>(), c.dtype, k_pool.ptr, v_pool.ptr, dtables.as<int32_t>(), max_blocks,
                                dseq.as<int32_t>(), dpos.as<int32_t>(), n, c.num_heads, c.num_kv_heads, c.head_dim,
                                c.block_size, scale, partition, parts, dws.as<float>(), dout.as<float>(), nullptr,
                                nullptr, AttentionVariant::kExact, window);
      !e.empty())
    return failed(e);
  const std::vector<float> got = download<float>(dout, q.size());
  std::vector<float> want(q.size());
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> qt(q.begin() + t * q_dim, q.begin() + (t + 1) * q_dim);
    cpu_attention(qt, hk, hv, tables.data() + seq_of_token[static_cast<std::size_t>(t)] * max_blocks, c.block_size,
                  c.num_heads, c.num_kv_heads, c.head_dim, positions[static_cast<std::size_t>(t)], scale, partition,
                  want.data() + t * q_dim, window);
  }
  for (float x : got) {
    if (std::isnan(x)) {
      return failed("attention read a NaN slot (outside its sequence)");
    }
  }
  if (std::string e = compare_close(got, want, "attention " + case_name(c)); !e.empty()) return failed(e);
  // The one-launch merge (the engine's): the last block of each (token, KV head) merges, with
  // the same arithmetic, so the same values; run twice on one counter array, which each
  // launch must leave zero (a counter left over would make the next launch merge early).
  std::vector<int32_t> zeros(static_cast<std::size_t>(n * c.num_kv_heads), 0);
  DeviceArray dcounters(zeros.size() * 4), dout1(q.size() * 4);
  upload(dcounters, zeros);
  for (int launch = 0; launch < 2; ++launch) {
    if (std::string e = attention(dq.as<float>(), c.dtype, k_pool.ptr, v_pool.ptr, dtables.as<int32_t>(), max_blocks,
                                  dseq.as<int32_t>(), dpos.as<int32_t>(), n, c.num_heads, c.num_kv_heads, c.head_dim,
                                  c.block_size, scale, partition, parts, dws.as<float>(), dout1.as<float>(), nullptr,
                                  nullptr, AttentionVariant::kExact, window, 0.0f, dcounters.as<int32_t>());
        !e.empty())
      return failed(e);
    const std::string what = "one-launch attention (launch " + std::to_string(launch + 1) + ") " + case_name(c);
    if (std::string e = compare_close(download<float>(dout1, q.size()), got, what); !e.empty()) return failed(e);
    if (download<int32_t>(dcounters, zeros.size()) != zeros) return failed(what + " left a merge counter non-zero");
  }
  return {got, ""};
}

std::vector<float> run_attention_case(const GridCase& c, const std::vector<Seq>& seqs, int64_t partition, uint32_t seed,
                                      int64_t window = 0) {
  AttentionRun r = try_attention_case(c, seqs, partition, seed, window);
  if (!r.error.empty()) ADD_FAILURE() << r.error;
  return std::move(r.out);
}

// Context lengths of the grid for a block size: 1, block size +- 1, partition +- 1, and
// several partitions long.
std::vector<int64_t> grid_contexts(int64_t block_size, int64_t partition) {
  std::vector<int64_t> c = {1,         block_size - 1, block_size,       block_size + 1, partition - 1,
                            partition, partition + 1,  3 * partition + 5};
  c.erase(std::remove_if(c.begin(), c.end(), [](int64_t x) { return x < 1; }), c.end());
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

class AttentionGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(AttentionGrid, DecodeAndChunkedPrefillMatchTheCpuAndNoBatchNeighbourChangesABit) {
  REQUIRE_DEVICE();
  const GridCase c = GetParam();
  uint32_t seed = 100;
  for (int64_t context : grid_contexts(c.block_size, kGridPartition)) {
    SCOPED_TRACE("context " + std::to_string(context));
    // A chunk of up to three prefill positions (one: decode) alone, then the same sequence
    // with the same K/V and queries batched beside a decode of another length: its rows must
    // be equal bit for bit (the block tables differ too: the pool is larger).
    const int64_t chunk = std::min<int64_t>(context, 3);
    const std::vector<float> alone = run_attention_case(c, {{context, chunk}}, kGridPartition, seed);
    const int64_t other = (context * 7) % (3 * kGridPartition + 5) + 1;
    const std::vector<float> batched = run_attention_case(c, {{context, chunk}, {other, 1}}, kGridPartition, seed);
    seed += 10;
    if (HasFailure()) return;
    ASSERT_GE(batched.size(), alone.size());
    for (std::size_t i = 0; i < alone.size(); ++i)
      ASSERT_EQ(bits(batched[i]), bits(alone[i])) << "batch neighbour changed element " << i;
  }
}

std::vector<GridCase> grid() {
  std::vector<GridCase> cases;
#if defined(KVP_SIMT_THREADS)
  // ThreadSanitizer runs every CUDA thread as an OS thread: a small head and pool, to catch
  // a missing barrier around the attention kernel's shared-memory tiles.
  cases.push_back({16, 4, 8, 2, DType::kBF16});
#else
  std::vector<int64_t> dims = {64, 128};
#if defined(KVP_CUDA_DEVICE_FLAVOUR)
  dims.push_back(256);
#endif
  for (int64_t d : dims)
    for (int64_t b : {1, 8, 16, 32})
      for (auto [h, kv] : {std::pair<int64_t, int64_t>{8, 8}, {32, 8}, {32, 1}})
        for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) cases.push_back({d, b, h, kv, t});
  // The real models' heads (model/presets.h): SmolLM2-135M 9/3 (group 3), Qwen2.5-0.5B 14/2
  // (group 7), TinyLlama-1.1B 32/4 (group 8), all head dim 64 (Llama-3.2-1B's 32/8 is above).
  for (auto [h, kv] : {std::pair<int64_t, int64_t>{9, 3}, {14, 2}, {32, 4}})
    for (int64_t b : {1, 16})
      for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) cases.push_back({64, b, h, kv, t});
  // fp8 pools (unscaled here; the scales have their own test): MHA and GQA, both formats.
  for (auto [h, kv] : {std::pair<int64_t, int64_t>{8, 8}, {32, 8}})
    for (int64_t b : {1, 16})
      for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) cases.push_back({64, b, h, kv, t});
#endif
  return cases;
}

INSTANTIATE_TEST_SUITE_P(CUDA_KERNEL_SUITE, AttentionGrid, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<GridCase>& i) { return case_name(i.param); });

// Sliding windows (Mistral's, Gemma's local layers): windows of one position, smaller than a
// block, one block, just over one, and over a partition; contexts of one window and of many;
// decodes and chunks of three. Each case matches the CPU kernel (bitwise in the emulated
// flavour), and try_attention_case points the blocks wholly before each sequence's window at
// a NaN block, so a kernel that read them, rather than skipping them, fails; a batch
// neighbour with another window position changes no bit.
class WindowedAttention : public ::testing::TestWithParam<GridCase> {};

TEST_P(WindowedAttention, MatchesTheCpuSkipsTheBlocksBeforeTheWindowAndNoNeighbourChangesABit) {
  REQUIRE_DEVICE();
  const GridCase c = GetParam();
  uint32_t seed = 700;
  std::vector<int64_t> windows = {1, c.block_size - 1, c.block_size, c.block_size + 1, kGridPartition + 3};
  windows.erase(std::remove_if(windows.begin(), windows.end(), [](int64_t w) { return w < 1; }), windows.end());
  for (int64_t window : windows) {
    for (int64_t context : {window, 4 * window + 5, 3 * kGridPartition + window + 2}) {
      SCOPED_TRACE("window " + std::to_string(window) + ", context " + std::to_string(context));
      const int64_t chunk = std::min<int64_t>(context, 3);
      const std::vector<float> alone = run_attention_case(c, {{context, chunk}}, kGridPartition, seed, window);
      const std::vector<float> batched =
          run_attention_case(c, {{context, chunk}, {context / 2 + 1, 1}}, kGridPartition, seed, window);
      seed += 10;
      if (HasFailure()) return;
      ASSERT_GE(batched.size(), alone.size());
      for (std::size_t i = 0; i < alone.size(); ++i)
        ASSERT_EQ(bits(batched[i]), bits(alone[i])) << "batch neighbour changed element " << i;
    }
  }
}

std::vector<GridCase> windowed_grid() {
#if defined(KVP_SIMT_THREADS)
  return {{16, 4, 8, 2, DType::kBF16}};
#else
  return {{64, 1, 32, 8, DType::kF32},
          {64, 16, 32, 8, DType::kBF16},
          {128, 8, 8, 8, DType::kF16},
          {64, 16, 8, 8, DType::kF8E4M3}};
#endif
}

INSTANTIATE_TEST_SUITE_P(CUDA_KERNEL_SUITE, WindowedAttention, ::testing::ValuesIn(windowed_grid()),
                         [](const ::testing::TestParamInfo<GridCase>& i) { return case_name(i.param); });

TEST(CUDA_KERNEL_SUITE, AttentionRefusesShapesItCannotRun) {
  EXPECT_NE(check_attention_shape(8, 3, 64), "");               // not a multiple
  EXPECT_NE(check_attention_shape(8, 8, kMaxHeadDim + 1), "");  // head dim
  EXPECT_NE(check_attention_shape(128, 1, 256), "");            // group x head dim over the block
  EXPECT_EQ(check_attention_shape(32, 8, 128), "");
  EXPECT_FALSE(kv_dtype_supported(DType::kF64));
  EXPECT_NE(fill_kv_nan(nullptr, 4, DType::kF64), "");
}

// Every shape check_attention_shape accepts is computed as the CPU counterpart computes it,
// and every other shape is refused with that check's reason before anything runs: head dims
// from 1 to one past kMaxHeadDim (odd ones too), 1 to 3 KV heads, groups from 1 up to 400
// query heads per KV head (more than the attention block's threads), block sizes 1 to 32,
// partitions 4 to 48, one or two sequences of decode rows and prefill chunks, every KV dtype.
// Not under KVP_SIMT_THREADS (an OS thread per CUDA thread: the grid above covers it there).
#if !defined(KVP_SIMT_THREADS)
TEST(CUDA_KERNEL_SUITE, AttentionComputesEveryShapeItsCheckAcceptsAndRefusesTheRest) {
  REQUIRE_DEVICE();
  const bool held = rc::check("attention over drawn shapes", [] {
    const auto num_kv_heads = *rc::gen::inRange<int64_t>(1, 4);
    const auto group = *rc::gen::oneOf(rc::gen::inRange<int64_t>(1, 17), rc::gen::inRange<int64_t>(100, 401));
    const auto head_dim =
        *rc::gen::oneOf(rc::gen::inRange<int64_t>(1, 33), rc::gen::element<int64_t>(64, 80, 96, 128, 256),
                        rc::gen::inRange<int64_t>(1, kMaxHeadDim + 2));
    const int64_t num_heads = group * num_kv_heads;
    const std::string verdict = check_attention_shape(num_heads, num_kv_heads, head_dim);
    RC_CLASSIFY(verdict.empty(), "accepted");
    RC_CLASSIFY(verdict.empty() && group > 128, "accepted, group over 128 query heads");
    if (!verdict.empty()) {
      // Refused before any launch: no pointer is touched.
      RC_ASSERT(attention(nullptr, DType::kF32, nullptr, nullptr, nullptr, 1, nullptr, nullptr, 1, num_heads,
                          num_kv_heads, head_dim, 1, 1.0f, 1, 1, nullptr, nullptr) == verdict);
      return;
    }
    const GridCase c{head_dim, *rc::gen::inRange<int64_t>(1, 33), num_heads, num_kv_heads,
                     *rc::gen::element(DType::kF32, DType::kF16, DType::kBF16)};
    const auto partition = *rc::gen::inRange<int64_t>(4, 49);
    std::vector<Seq> seqs;
    for (int64_t s = *rc::gen::inRange(1, 3); s > 0; --s) {
      const auto context = *rc::gen::inRange<int64_t>(1, 3 * partition + 6);
      seqs.push_back({context, *rc::gen::inRange<int64_t>(1, std::min<int64_t>(context, 3) + 1)});
    }
    const AttentionRun r = try_attention_case(c, seqs, partition, *rc::gen::arbitrary<uint32_t>());
    if (!r.error.empty()) RC_FAIL(case_name(c) + ", partition " + std::to_string(partition) + ": " + r.error);
  });
  EXPECT_TRUE(held);
}
#endif

// Not under ThreadSanitizer (KVP_SIMT_THREADS: one OS thread per CUDA thread): the fp8 tests
// below launch tens of thousands of threads per kernel (the long-context one millions), and
// fp8 changes no synchronisation; the TSan grid case above covers the kernels' barriers.
#if !defined(KVP_SIMT_THREADS)
// fp8 pools with per-KV-head scales: write_kv stores fp8(x / scale) (checked code by code
// against common/dtype.h's encoder), and attention over the scaled fp8 pool gives the bits of
// attention over an fp32 pool holding code * scale, the values the kernel must read. The
// planted kDropKvScales variant (scales never reach the kernel) must not.
TEST(CUDA_KERNEL_SUITE, Fp8ScalesAreAppliedOnWriteAndOnRead) {
  REQUIRE_DEVICE();
  for (DType dtype : {DType::kF8E4M3, DType::kF8E5M2}) {
    SCOPED_TRACE(dtype_flag(dtype));
    const int64_t head_dim = 64, kv_heads = 2, heads = 8, block_size = 16, context = 100, blocks = 8;
    const int64_t kv_dim = kv_heads * head_dim;
    // Head 0 small values (scale well below 1), head 1 beyond the format's max (scale above).
    const std::vector<float> k_scale = {0.02f / fp8_max(dtype) * 448.0f, 3000.0f / fp8_max(dtype)};
    const std::vector<float> v_scale = {0.5f / fp8_max(dtype), 8.0f};
    std::vector<float> k = random_floats(static_cast<std::size_t>(context * kv_dim), 21);
    std::vector<float> v = random_floats(k.size(), 22);
    for (std::size_t i = 0; i < k.size(); ++i) {
      const bool head1 = (i % static_cast<std::size_t>(kv_dim)) >= static_cast<std::size_t>(head_dim);
      k[i] *= head1 ? 1000.0f : 0.01f;
      v[i] *= head1 ? 3.0f : 0.001f;
    }
    std::vector<int32_t> table(static_cast<std::size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) table[static_cast<std::size_t>(b)] = static_cast<int32_t>(blocks - 1 - b);
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < context; ++p) slots.push_back(kk::slot_of(table.data(), p, block_size));
    const std::size_t elements = static_cast<std::size_t>(blocks * block_size * kv_dim);
    DeviceArray dk(k.size() * 4), dv(v.size() * 4), dslots(slots.size() * 8), dks(8), dvs(8);
    upload(dk, k);
    upload(dv, v);
    upload(dslots, slots);
    upload(dks, k_scale);
    upload(dvs, v_scale);
    DeviceArray k8(elements), v8(elements);
    ASSERT_EQ(write_kv(dk.as<float>(), dv.as<float>(), dslots.as<int64_t>(), context, kv_dim, dtype, k8.ptr, v8.ptr,
                       head_dim, dks.as<float>(), dvs.as<float>()),
              "");
    const std::vector<uint8_t> kc = download<uint8_t>(k8, elements), vc = download<uint8_t>(v8, elements);
    // The fp32 pools holding what the fp8 ones mean: code * scale, computed here.
    std::vector<float> k_meant(k.size()), v_meant(v.size());
    for (int64_t p = 0; p < context; ++p) {
      for (int64_t e = 0; e < kv_dim; ++e) {
        const auto i = static_cast<std::size_t>(p * kv_dim + e);
        const auto at = static_cast<std::size_t>(slots[static_cast<std::size_t>(p)] * kv_dim + e);
        const auto h = static_cast<std::size_t>(e / head_dim);
        const uint8_t want_k =
            dtype == DType::kF8E4M3 ? float_to_fp8_e4m3(k[i] / k_scale[h]) : float_to_fp8_e5m2(k[i] / k_scale[h]);
        const uint8_t want_v =
            dtype == DType::kF8E4M3 ? float_to_fp8_e4m3(v[i] / v_scale[h]) : float_to_fp8_e5m2(v[i] / v_scale[h]);
        ASSERT_EQ(kc[at], want_k) << "K position " << p << " element " << e;
        ASSERT_EQ(vc[at], want_v) << "V position " << p << " element " << e;
        const auto decode = [&](uint8_t c) {
          return dtype == DType::kF8E4M3 ? fp8_e4m3_to_float(c) : fp8_e5m2_to_float(c);
        };
        k_meant[i] = decode(kc[at]) * k_scale[h];
        v_meant[i] = decode(vc[at]) * v_scale[h];
      }
    }
    DeviceArray dkm(k.size() * 4), dvm(v.size() * 4), k32(elements * 4), v32(elements * 4);
    upload(dkm, k_meant);
    upload(dvm, v_meant);
    ASSERT_EQ(write_kv(dkm.as<float>(), dvm.as<float>(), dslots.as<int64_t>(), context, kv_dim, DType::kF32, k32.ptr,
                       v32.ptr),
              "");
    const std::vector<float> q = random_floats(static_cast<std::size_t>(heads * head_dim), 23);
    const std::vector<int32_t> seq = {0}, pos = {static_cast<int32_t>(context - 1)};
    const int64_t partition = 32, parts = attention_partitions(context - 1, partition);
    DeviceArray dq(q.size() * 4), dtable(table.size() * 4), dseq(4), dpos(4),
        dws(static_cast<std::size_t>(attention_workspace_floats(1, heads, head_dim, parts)) * 4);
    upload(dq, q);
    upload(dtable, table);
    upload(dseq, seq);
    upload(dpos, pos);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const auto run = [&](DType t, const DeviceArray& kp, const DeviceArray& vp, const float* ks, const float* vs,
                         AttentionVariant variant) {
      DeviceArray dout(q.size() * 4);
      EXPECT_EQ(attention(dq.as<float>(), t, kp.ptr, vp.ptr, dtable.as<int32_t>(), blocks, dseq.as<int32_t>(),
                          dpos.as<int32_t>(), 1, heads, kv_heads, head_dim, block_size, scale, partition, parts,
                          dws.as<float>(), dout.as<float>(), ks, vs, variant),
                "");
      return download<float>(dout, q.size());
    };
    const std::vector<float> want = run(DType::kF32, k32, v32, nullptr, nullptr, AttentionVariant::kExact);
    const std::vector<float> got = run(dtype, k8, v8, dks.as<float>(), dvs.as<float>(), AttentionVariant::kExact);
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << "element " << i;
    const std::vector<float> dropped =
        run(dtype, k8, v8, dks.as<float>(), dvs.as<float>(), AttentionVariant::kDropKvScales);
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double{dropped[i]} - want[i]));
    EXPECT_GT(worst, 0.1) << "the planted variant without scales should read different values";
  }
}

// Long contexts: the error of one decode row against fp64 attention as the context grows, per
// KV dtype (fp8 with calibrated per-head scales). Two figures per row, both relative to max |V|:
//   total: against fp64 attention over the original fp32 K/V (what a user loses);
//   accumulation: against fp64 attention over exactly the values the kernel reads (code *
//     scale): what the kernel's own arithmetic adds. A correct fp32 accumulation stays under
//     Higham's bound for recursive summation, about n * u for n terms summed in one chain (u =
//     2^-24; "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 4.2), here for
//     the kernel's two levels (a partition's positions, then the partitions) and with a
//     factor 8 for the exponentials.
// The planted kBf16Accumulator variant (the vLLM long-context FP8 failure: an accumulator
// of reduced precision) must break that bound: the check is shown to catch it. The table is
// printed for the record (docs/fp8.md); V has a positive mean, as softmax outputs of real
// models do, so the accumulator grows with the context.
struct LongContextRow {
  double total = 0, accumulation = 0;
};

LongContextRow long_context_error(DType dtype, int64_t context, AttentionVariant variant, bool calibrated) {
  const int64_t head_dim = 64, kv_heads = 1, heads = 4, block_size = 16;
  const int64_t kv_dim = kv_heads * head_dim, blocks = (context + block_size - 1) / block_size;
  // K of magnitude 4 (scores up to about 2: a softmax with some peaks), V small and positive
  // (magnitudes like a real layer's values, where E4M3 without a scale is in its subnormals).
  std::vector<float> k = random_floats(static_cast<std::size_t>(context * kv_dim), 31, -4.0f, 4.0f);
  std::vector<float> v = random_floats(k.size(), 32, 0.0f, 0.05f);
  const std::vector<float> q = random_floats(static_cast<std::size_t>(heads * head_dim), 33);
  std::vector<float> ks = {1.0f}, vs = {1.0f};
  if (is_fp8(dtype) && calibrated) {  // max |x| over the context / the format's max
    float km = 0, vm = 0;
    for (float x : k) km = std::max(km, std::abs(x));
    for (float x : v) vm = std::max(vm, std::abs(x));
    ks = {km / fp8_max(dtype)};
    vs = {vm / fp8_max(dtype)};
  }
  std::vector<int32_t> table(static_cast<std::size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::vector<int64_t> slots(static_cast<std::size_t>(context));
  std::iota(slots.begin(), slots.end(), 0);
  const std::size_t elements = static_cast<std::size_t>(blocks * block_size * kv_dim);
  const std::size_t el = dtype_size(dtype);
  DeviceArray dk(k.size() * 4), dv(v.size() * 4), dslots(slots.size() * 8), dks(4), dvs(4), kp(elements * el),
      vp(elements * el);
  upload(dk, k);
  upload(dv, v);
  upload(dslots, slots);
  upload(dks, ks);
  upload(dvs, vs);
  const float* ksp = is_fp8(dtype) ? dks.as<float>() : nullptr;
  const float* vsp = is_fp8(dtype) ? dvs.as<float>() : nullptr;
  EXPECT_EQ(write_kv(dk.as<float>(), dv.as<float>(), dslots.as<int64_t>(), context, kv_dim, dtype, kp.ptr, vp.ptr,
                     head_dim, ksp, vsp),
            "");
  const std::vector<int32_t> seq = {0}, pos = {static_cast<int32_t>(context - 1)};
  const int64_t partition = kk::kDefaultAttentionPartition, parts = attention_partitions(context - 1, partition);
  DeviceArray dq(q.size() * 4), dtable(table.size() * 4), dseq(4), dpos(4), dout(q.size() * 4),
      dws(static_cast<std::size_t>(attention_workspace_floats(1, heads, head_dim, parts)) * 4);
  upload(dq, q);
  upload(dtable, table);
  upload(dseq, seq);
  upload(dpos, pos);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  EXPECT_EQ(attention(dq.as<float>(), dtype, kp.ptr, vp.ptr, dtable.as<int32_t>(), blocks, dseq.as<int32_t>(),
                      dpos.as<int32_t>(), 1, heads, kv_heads, head_dim, block_size, scale, partition, parts,
                      dws.as<float>(), dout.as<float>(), ksp, vsp, variant),
            "");
  const std::vector<float> out = download<float>(dout, q.size());
  // What the kernel reads: each stored element decoded, times its scale.
  const std::vector<unsigned char> kraw = download<unsigned char>(kp, static_cast<std::size_t>(context * kv_dim) * el);
  const std::vector<unsigned char> vraw = download<unsigned char>(vp, kraw.size());
  std::vector<double> kr(k.size()), vr(v.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    kr[i] = double{kk::kv_element_to_float(dtype, kraw.data() + i * el)} * ks[0];
    vr[i] = double{kk::kv_element_to_float(dtype, vraw.data() + i * el)} * vs[0];
  }
  const auto fp64_attention = [&](const auto& kk_, const auto& vv_, int64_t h, std::vector<double>& o) {
    std::vector<double> score(static_cast<std::size_t>(context));
    double mx = -1e300;
    for (int64_t p = 0; p < context; ++p) {
      double d = 0;
      for (int64_t e = 0; e < head_dim; ++e)
        d += double{q[static_cast<std::size_t>(h * head_dim + e)]} *
             double(kk_[static_cast<std::size_t>(p * kv_dim + e)]);
      score[static_cast<std::size_t>(p)] = d * double{scale};
      mx = std::max(mx, score[static_cast<std::size_t>(p)]);
    }
    double sum = 0;
    o.assign(static_cast<std::size_t>(head_dim), 0.0);
    for (int64_t p = 0; p < context; ++p) {
      const double w = std::exp(score[static_cast<std::size_t>(p)] - mx);
      sum += w;
      for (int64_t e = 0; e < head_dim; ++e)
        o[static_cast<std::size_t>(e)] += w * double(vv_[static_cast<std::size_t>(p * kv_dim + e)]);
    }
    for (double& x : o) x /= sum;
  };
  double vmax = 0;
  for (float x : v) vmax = std::max(vmax, double{std::abs(x)});
  LongContextRow row;
  std::vector<double> orig, read;
  for (int64_t h = 0; h < heads; ++h) {
    fp64_attention(k, v, h, orig);
    fp64_attention(kr, vr, h, read);
    for (int64_t e = 0; e < head_dim; ++e) {
      const double got = out[static_cast<std::size_t>(h * head_dim + e)];
      row.total = std::max(row.total, std::abs(got - orig[static_cast<std::size_t>(e)]) / vmax);
      row.accumulation = std::max(row.accumulation, std::abs(got - read[static_cast<std::size_t>(e)]) / vmax);
    }
  }
  return row;
}

// The kernel sums at most one partition (kDefaultAttentionPartition positions) in an
// accumulator, then merges the partitions in order: a two-level summation whose bound is
// about (partition + number of partitions) * u.
double accumulation_bound(int64_t context) {
  const int64_t p = kk::kDefaultAttentionPartition;
  return 8.0 * static_cast<double>(p + (context + p - 1) / p) * 0x1.0p-24;
}

// Contexts 1k to 32k; KVP_LONG_CONTEXT_MAX=65536 adds 64k (ctest's slow label). With
// KVP_LONG_CONTEXT_CSV=FILE the rows are also written there (scripts/plot_long_context.py
// draws them).
TEST(CUDA_KERNEL_SUITE, LongContextErrorDoesNotGrowPastTheRoundingOfEachPosition) {
  REQUIRE_DEVICE();
#if defined(__SANITIZE_ADDRESS__)
  std::vector<int64_t> contexts = {1024, 8192};  // ASan: the short end (the default suite runs all)
#else
  std::vector<int64_t> contexts = {1024, 8192, 16384, 32768};
#endif
  if (const char* max = std::getenv("KVP_LONG_CONTEXT_MAX"); max != nullptr && std::atoll(max) >= 65536)
    contexts.push_back(65536);
  std::FILE* csv = nullptr;
  if (const char* path = std::getenv("KVP_LONG_CONTEXT_CSV"); path != nullptr) {
    csv = std::fopen(path, "w");
    ASSERT_NE(csv, nullptr) << path;
    std::fprintf(csv, "kv_dtype,kernel,scales,context,total,accumulation,bound\n");
  }
  std::printf("%-10s %-16s %-10s %8s %12s %14s %12s\n", "kv dtype", "kernel", "scales", "context", "total",
              "accumulation", "bound");
  const auto table_row = [&](DType d, AttentionVariant variant, const char* name, bool calibrated, bool gate) {
    const char* scales = !is_fp8(d) ? "-" : calibrated ? "calibrated" : "1.0";
    std::vector<LongContextRow> rows;
    for (int64_t n : contexts) {
      rows.push_back(long_context_error(d, n, variant, calibrated));
      std::printf("%-10s %-16s %-10s %8lld %12.3e %14.3e %12.3e\n", dtype_flag(d).c_str(), name, scales,
                  static_cast<long long>(n), rows.back().total, rows.back().accumulation, accumulation_bound(n));
      if (csv != nullptr)
        std::fprintf(csv, "%s,%s,%s,%lld,%.6e,%.6e,%.6e\n", std::string(dtype_flag_name(d)).c_str(), name, scales,
                     static_cast<long long>(n), rows.back().total, rows.back().accumulation, accumulation_bound(n));
      if (gate) {
        EXPECT_LE(rows.back().accumulation, accumulation_bound(n)) << dtype_flag(d) << " context " << n;
      }
    }
    // Slope of log2(total error) over log2(context), first to last: ~0 or below when the
    // error is the per-position rounding's; printed for the record.
    const double slope = std::log2(std::max(rows.back().total, 1e-300) / std::max(rows.front().total, 1e-300)) /
                         std::log2(static_cast<double>(contexts.back()) / static_cast<double>(contexts.front()));
    std::printf("%-10s %-16s %-10s slope of log2(total error) per doubling of the context: %+.3f\n",
                dtype_flag(d).c_str(), name, scales, slope);
    return rows;
  };
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2})
    table_row(d, AttentionVariant::kExact, "exact", true, true);
  for (DType d : {DType::kF8E4M3, DType::kF8E5M2}) table_row(d, AttentionVariant::kExact, "exact", false, true);
  // The planted accumulator: the same check must fail it, at every context.
  const std::vector<LongContextRow> planted =
      table_row(DType::kF8E4M3, AttentionVariant::kBf16Accumulator, "bf16-accumulator", true, false);
  for (std::size_t i = 0; i < contexts.size(); ++i)
    EXPECT_GT(planted[i].accumulation, accumulation_bound(contexts[i]))
        << "the planted bf16 accumulator passed the long-context check at context " << contexts[i];
  if (csv != nullptr) std::fclose(csv);
}
#endif  // !KVP_SIMT_THREADS

#if defined(KVP_CUDA_DEVICE_FLAVOUR)
// GPU only: a 32k context with the default partition (256 partitions), and a pool of more
// than 2^31 elements with the sequence's blocks at its end, so that 32-bit index arithmetic
// anywhere would read the wrong slot.
TEST(CUDA_KERNEL_SUITE, LongContextInAPoolOverTwoToTheThirtyOneElements) {
  REQUIRE_DEVICE();
  const GridCase c{128, 16, 32, 8, DType::kF32};
  const int64_t kv_dim = c.num_kv_heads * c.head_dim, context = 32768;
  const int64_t seq_blocks = context / c.block_size;
  const int64_t num_blocks = (int64_t{1} << 31) / (c.block_size * kv_dim) + 2 * seq_blocks;  // > 2^31 elements
  const int64_t elements = num_blocks * c.block_size * kv_dim;
  DeviceArray k_pool(static_cast<std::size_t>(elements) * 4), v_pool(static_cast<std::size_t>(elements) * 4);
  if (k_pool.ptr == nullptr || v_pool.ptr == nullptr) GTEST_SKIP() << "could not allocate " << elements * 8 << " bytes";
  // The sequence's blocks: the last 2 * seq_blocks ids, every other one, in reverse.
  std::vector<int32_t> table;
  for (int64_t b = 0; b < seq_blocks; ++b) table.push_back(static_cast<int32_t>(num_blocks - 1 - 2 * b));
  std::vector<int64_t> slots;
  for (int64_t p = 0; p < context; ++p) slots.push_back(kk::slot_of(table.data(), p, c.block_size));
  const std::vector<float> k = random_floats(static_cast<std::size_t>(context * kv_dim), 11, -2.0f, 2.0f);
  const std::vector<float> v = random_floats(k.size(), 12);
  DeviceArray dk(k.size() * 4), dv(v.size() * 4), dslots(slots.size() * 8);
  upload(dk, k);
  upload(dv, v);
  upload(dslots, slots);
  ASSERT_EQ(
      write_kv(dk.as<float>(), dv.as<float>(), dslots.as<int64_t>(), context, kv_dim, c.dtype, k_pool.ptr, v_pool.ptr),
      "");
  // Compact host copy: the sequence's blocks as blocks 0..seq_blocks-1.
  HostPool hk{c.dtype, {}}, hv{c.dtype, {}};
  const std::size_t block_bytes = static_cast<std::size_t>(c.block_size * kv_dim) * 4;
  hk.raw.resize(block_bytes * static_cast<std::size_t>(seq_blocks));
  hv.raw.resize(hk.raw.size());
  std::vector<int32_t> compact(table.size());
  for (std::size_t b = 0; b < table.size(); ++b) {
    compact[b] = static_cast<int32_t>(b);
    ASSERT_EQ(
        copy_to_host(hk.raw.data() + b * block_bytes, k_pool.as<unsigned char>() + table[b] * block_bytes, block_bytes),
        "");
    ASSERT_EQ(
        copy_to_host(hv.raw.data() + b * block_bytes, v_pool.as<unsigned char>() + table[b] * block_bytes, block_bytes),
        "");
  }
  const int64_t q_dim = c.num_heads * c.head_dim;
  const std::vector<float> q = random_floats(static_cast<std::size_t>(q_dim), 13);
  const std::vector<int32_t> seq = {0}, pos = {static_cast<int32_t>(context - 1)};
  const int64_t parts = attention_partitions(context - 1, kk::kDefaultAttentionPartition);
  DeviceArray dq(q.size() * 4), dtable(table.size() * 4), dseq(4), dpos(4), dout(q.size() * 4),
      dws(static_cast<std::size_t>(attention_workspace_floats(1, c.num_heads, c.head_dim, parts)) * 4);
  upload(dq, q);
  upload(dtable, table);
  upload(dseq, seq);
  upload(dpos, pos);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ASSERT_EQ(attention(dq.as<float>(), c.dtype, k_pool.ptr, v_pool.ptr, dtable.as<int32_t>(), seq_blocks,
                      dseq.as<int32_t>(), dpos.as<int32_t>(), 1, c.num_heads, c.num_kv_heads, c.head_dim, c.block_size,
                      scale, kk::kDefaultAttentionPartition, parts, dws.as<float>(), dout.as<float>()),
            "");
  std::vector<float> want(q.size());
  cpu_attention(q, hk, hv, compact.data(), c.block_size, c.num_heads, c.num_kv_heads, c.head_dim, context - 1, scale,
                kk::kDefaultAttentionPartition, want.data());
  expect_close(download<float>(dout, q.size()), want, "32k context, pool over 2^31 elements");
}
#endif

}  // namespace
}  // namespace kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS
