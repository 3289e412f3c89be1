// The SIMT test kernels against plain C++ loops, over block sizes 1..1024 and odd grid
// shapes. Built twice: into simt_test against the emulated kernels (label kernel), and into
// simt_gpu_test against the nvcc-built kernels (label gpu; skips with "no CUDA device").
//
// The references replay each kernel's order of float additions, so results are compared
// bit for bit: the kernels only add (no products to contract into FMAs), and an addition
// rounds the same on the CPU and the GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/dtype.h"
#include "common/rng.h"
#include "kernels/simt/config.h"
#include "kernels/simt/test_kernels.h"

#if defined(KVP_SIMT_GPU_TEST)
#define SIMT_SUITE SimtGpuKernels
#define REQUIRE_DEVICE() \
  if (!device_available()) GTEST_SKIP() << "no CUDA device"
#else
#define SIMT_SUITE SimtKernels
#define REQUIRE_DEVICE() (void)0
#endif

namespace kvp::simt::test {
namespace {

// Under TSan every CUDA thread is an OS thread: fewer, smaller launches keep it quick (a
// barrier across 1024 OS threads costs about 100 ms there, creating them seconds; only the
// reverse test runs a 1024-thread block there).
#if defined(KVP_SIMT_THREADS)
constexpr unsigned kMaxHistogramThreads = 256;
const std::vector<Shape> kBlocks = {{1}, {33}, {64}, {8, 4, 2}, {257}};
const std::vector<Shape> kGrids = {{1}, {3}, {2, 1, 2}};
#else
constexpr unsigned kMaxHistogramThreads = 1024;
const std::vector<Shape> kBlocks = {{1},       {2},       {31},     {32},     {33},     {64},   {96},
                                    {128},     {255},     {256},    {257},    {512},    {1000}, {1024},
                                    {8, 4, 2}, {7, 3, 5}, {16, 16}, {32, 32}, {5, 1, 9}};
const std::vector<Shape> kGrids = {{1}, {3}, {2, 3}, {3, 1, 2}};
#endif

// Thousands of OS threads per launch are slow under TSan; the fiber flavour runs them all.
bool too_big_for_thread_flavour(Shape grid, Shape block) {
#if defined(KVP_SIMT_THREADS)
  return grid.count() * block.count() > 2100;
#else
  (void)grid;
  (void)block;
  return false;
#endif
}

std::vector<float> random_floats(std::size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.uniform(-1.0, 1.0));
  return v;
}

std::string describe(Shape grid, Shape block) {
  return "grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) + ") block (" +
         std::to_string(block.x) + "," + std::to_string(block.y) + "," + std::to_string(block.z) + ")";
}

// block_reduce_kernel read sequentially: per-thread strided sums, then the tree.
std::vector<float> block_reduce_reference(const std::vector<float>& in, unsigned blocks, unsigned threads) {
  const int n = static_cast<int>(in.size());
  const int chunk = (n + static_cast<int>(blocks) - 1) / static_cast<int>(blocks);
  const int nt = static_cast<int>(threads);
  std::vector<float> out(blocks);
  for (int b = 0; b < static_cast<int>(blocks); ++b) {
    const int begin = b * chunk;
    const int end = std::min(begin + chunk, n);
    std::vector<float> partial(threads, 0.0f);
    for (int t = 0; t < nt; ++t)
      for (int i = begin + t; i < end; i += nt) partial[t] += in[i];
    int span = 1;
    while (span < nt) span <<= 1;
    for (int s = span / 2; s > 0; s >>= 1)
      for (int t = 0; t < s && t + s < nt; ++t) partial[t] += partial[t + s];
    out[b] = partial[0];
  }
  return out;
}

TEST(SIMT_SUITE, BlockReduceEqualsSequentialReadingForEveryBlockAndGridShape) {
  REQUIRE_DEVICE();
  for (Shape block : kBlocks) {
    for (Shape grid : kGrids) {
      if (too_big_for_thread_flavour(grid, block)) continue;
      const std::size_t n = grid.count() * block.count() * 2 + 3;
      const std::vector<float> in = random_floats(n, 1000 + n);
      std::vector<float> out;
      const KernelRun run = block_reduce(in, grid, block, Bug::kNone, &out);
      ASSERT_TRUE(run.ok) << run.error << " " << describe(grid, block);
      const std::vector<float> want = block_reduce_reference(in, grid.count(), block.count());
      ASSERT_EQ(out.size(), want.size());
      for (std::size_t b = 0; b < want.size(); ++b)
        ASSERT_EQ(float_bits(out[b]), float_bits(want[b])) << "block " << b << " " << describe(grid, block);
    }
  }
}

TEST(SIMT_SUITE, WarpReduceAndVotesEqualSequentialReadingForEveryBlockAndGridShape) {
  REQUIRE_DEVICE();
  for (Shape block : kBlocks) {
    for (Shape grid : kGrids) {
      if (too_big_for_thread_flavour(grid, block)) continue;
      const unsigned threads = block.count();
      const std::size_t n = grid.count() * threads - (threads > 3 ? 3 : 0);  // a ragged end
      const std::vector<float> in = random_floats(n, 2000 + n);
      WarpResults got;
      const KernelRun run = warp_reduce(in, grid, block, Bug::kNone, &got);
      ASSERT_TRUE(run.ok) << run.error << " " << describe(grid, block);
      const unsigned warps_per_block = (threads + 31) / 32;
      for (unsigned b = 0; b < grid.count(); ++b) {
        for (unsigned w = 0; w < warps_per_block; ++w) {
          const int lanes = static_cast<int>(std::min(32u, threads - w * 32));
          std::vector<float> v(32, 0.0f);
          int positives = 0, any_negative = 0, all_positive = 1;
          for (int l = 0; l < lanes; ++l) {
            const std::size_t gid = std::size_t{b} * threads + w * 32 + static_cast<unsigned>(l);
            v[l] = gid < n ? in[gid] : 0.0f;
            positives += v[l] > 0.0f;
            any_negative |= v[l] < 0.0f;
            all_positive &= v[l] > 0.0f;
          }
          for (int offset = 16; offset > 0; offset >>= 1) {
            std::vector<float> next = v;
            for (int l = 0; l < lanes; ++l) {
              if (lanes == 32)
                next[l] = v[l] + v[l ^ offset];
              else if (l + offset < lanes)
                next[l] = v[l] + v[l + offset];
            }
            v = next;
          }
          const std::size_t i = std::size_t{b} * warps_per_block + w;
          ASSERT_EQ(float_bits(got.sums[i]), float_bits(v[0])) << "warp " << i << " " << describe(grid, block);
          ASSERT_EQ(got.positives[i], positives) << "warp " << i << " " << describe(grid, block);
          ASSERT_EQ(got.any_negative[i], any_negative) << "warp " << i << " " << describe(grid, block);
          ASSERT_EQ(got.all_positive[i], all_positive) << "warp " << i << " " << describe(grid, block);
        }
      }
    }
  }
}

TEST(SIMT_SUITE, InclusiveScanEqualsRunningSumPerBlock) {
  REQUIRE_DEVICE();
  for (Shape block : kBlocks) {
    const unsigned threads = block.count();  // the scan takes 1-D blocks of the same size
    for (Shape grid : kGrids) {
      if (too_big_for_thread_flavour(grid, block)) continue;
      const std::size_t n = grid.count() * threads - (threads > 5 ? 5 : 0);
      Rng rng(3000 + n);
      std::vector<int> in(n);
      for (int& x : in) x = static_cast<int>(rng.below(2001)) - 1000;
      std::vector<int> out;
      const KernelRun run = block_scan(in, grid, threads, &out);
      ASSERT_TRUE(run.ok) << run.error << " " << describe(grid, block);
      for (std::size_t i = 0, running = 0; i < n; ++i) {
        const int want = (i % threads == 0 ? 0 : static_cast<int>(running)) + in[i];
        running = static_cast<std::size_t>(want);
        ASSERT_EQ(out[i], want) << "element " << i << " " << describe(grid, {threads});
      }
    }
  }
}

TEST(SIMT_SUITE, HistogramWithSharedAtomicsCountsEveryValue) {
  REQUIRE_DEVICE();
  for (unsigned threads : {1u, 33u, 64u, 256u, 1024u}) {
    if (threads > kMaxHistogramThreads) continue;
    for (Shape grid : kGrids) {
      if (too_big_for_thread_flavour(grid, {threads})) continue;
      const std::size_t n = 5000 + threads;
      Rng rng(4000 + threads);
      std::vector<unsigned> in(n);
      for (unsigned& x : in) x = static_cast<unsigned>(rng.below(100000));
      Histogram got;
      const KernelRun run = histogram(in, grid, threads, Bug::kNone, &got);
      ASSERT_TRUE(run.ok) << run.error << " " << describe(grid, {threads});
      std::vector<unsigned> bins(kHistogramBins, 0);
      unsigned max = 0;
      for (unsigned x : in) {
        bins[x % kHistogramBins]++;
        max = std::max(max, x);
      }
      EXPECT_EQ(got.bins, bins) << describe(grid, {threads});
      EXPECT_EQ(got.max, max);
      EXPECT_EQ(got.half_max, static_cast<float>(max) * 0.5f);
    }
  }
}

TEST(SIMT_SUITE, DynamicSharedMemoryReversesEachBlock) {
  REQUIRE_DEVICE();
  for (unsigned threads : {1u, 31u, 100u, 512u, 1024u}) {
    for (Shape grid : kGrids) {
      if (too_big_for_thread_flavour(grid, {threads})) continue;
      const std::size_t n = std::size_t{grid.count()} * threads;
      const std::vector<float> in = random_floats(n, 5000 + n);
      std::vector<float> out;
      const KernelRun run = block_reverse(in, grid, threads, Bug::kNone, &out);
      ASSERT_TRUE(run.ok) << run.error;
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t b = i / threads, t = i % threads;
        ASSERT_EQ(out[i], in[b * threads + threads - 1 - t]) << i << " " << describe(grid, {threads});
      }
    }
  }
}

TEST(SIMT_SUITE, HalfAndBfloat16ConversionsAreBitExactWithDtypeH) {
  REQUIRE_DEVICE();
  std::vector<float> in = {0.0f,           -0.0f,          1.0f,           -1.0f,          65504.0f,
                           65520.0f,       1e-8f,          5.9604645e-08f, 6.1035156e-05f, 3.3895314e38f,
                           1.00048828125f, 1.00146484375f, INFINITY,       -INFINITY};
  const std::vector<float> random = random_floats(4000, 6000);
  Rng rng(6001);
  for (float x : random) in.push_back(x * static_cast<float>(std::ldexp(1.0, static_cast<int>(rng.below(60)) - 30)));
  for (uint32_t bits = 0x33000000u; bits < 0x47800000u; bits += 0x00012345u) in.push_back(bits_float(bits));
  Conversions got;
  const KernelRun run = convert(in, &got);
  ASSERT_TRUE(run.ok) << run.error;
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(got.f16[i], float_to_f16(in[i])) << in[i];
    ASSERT_EQ(got.bf16[i], float_to_bf16(in[i])) << in[i];
    ASSERT_EQ(float_bits(got.f16_back[i]), float_bits(f16_to_float(got.f16[i]))) << in[i];
    ASSERT_EQ(float_bits(got.bf16_back[i]), float_bits(bf16_to_float(got.bf16[i]))) << in[i];
  }
}

}  // namespace
}  // namespace kvp::simt::test
