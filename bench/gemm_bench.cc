// The projections' GEMM (kernels/gemm.h) against this machine's own limits, one thread,
// measured in the same run (these machines are noisy; read the ratios):
//   - BM_FmaPeak: fp32 FMA throughput of one core with the GEMM's instruction set (12
//     independent accumulator chains, enough to cover the FMA latency);
//   - BM_ReadBandwidth: one core streaming 256 MiB;
//   - BM_Gemm/T: T >= 16 tokens times SmolLM2's MLP up projection (576 -> 1536, weights in
//     cache): fma_peak_ratio = achieved FMA rate / BM_FmaPeak;
//   - BM_Gemv: one token times the LM head (576 -> 49152, 113 MB of weights streamed from
//     memory): bandwidth_ratio = weight bytes per second / a plain read's of as many bytes,
//     the two timed alternately in each iteration;
//   - BM_GemmFromMemory/T: T tokens times the LM head's weights, streamed from memory:
//     fma_peak_ratio where the weight reads must overlap the multiply-adds.
// Targets (issue 17): fma_peak_ratio >= 0.5 at T >= 16, bandwidth_ratio >= 0.7 (BM_Gemv).
//   build-release/bin/gemm_bench
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/rng.h"
#include "kernels/gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVP_BENCH_X86 1
#endif

namespace kvp {
namespace {

using kernels::GemmIsa;

// FMAs (scalar lanes) per second, `iterations` rounds of 12 chains of `width` lanes.
#if defined(KVP_BENCH_X86)
__attribute__((target("avx512f,fma"))) float fma_loop_512(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}
__attribute__((target("avx2,fma"))) float fma_loop_256(int64_t iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  alignas(32) float lanes[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_store_ps(lanes, s);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}
#endif

// Lanes per FMA instruction of the GEMM's ISA (1: the scalar loop, whose peak is libm's fma).
int lanes_of(GemmIsa isa) { return isa == GemmIsa::kAvx512 ? 16 : isa == GemmIsa::kAvx2 ? 8 : 1; }

double run_fma(int64_t iterations) {
  const GemmIsa isa = kernels::gemm_isa();
#if defined(KVP_BENCH_X86)
  if (isa == GemmIsa::kAvx512) return fma_loop_512(iterations);
  if (isa == GemmIsa::kAvx2) return fma_loop_256(iterations);
#endif
  float acc[12] = {};
  for (int64_t it = 0; it < iterations; ++it) {
    for (float& x : acc) x = kernels::fma_rn(x, 0.999f, 0.001f);
  }
  float s = 0.0f;
  for (float x : acc) s += x;
  return s;
}

// Lane FMAs per second, measured over about 0.3 s.
double measured_fma_peak() {
  static const double peak = [] {
    const int64_t iterations = 20'000'000;
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(run_fma(iterations));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return static_cast<double>(iterations) * 12.0 * lanes_of(kernels::gemm_isa()) / s;
  }();
  return peak;
}

const std::vector<float>& big_buffer() {
  static const std::vector<float> b(64ull << 20, 1.0f);  // 256 MiB
  return b;
}

// Sums the buffer with 8-wide loads into four independent sums (AVX2 where the CPU has it),
// so neither the adds nor the instruction count limit the stream: memory does.
#if defined(KVP_BENCH_X86)
__attribute__((target("avx2"))) float read_all_avx2(const float* p, std::size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (std::size_t i = 0; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}
#endif

float read_all(const std::vector<float>& b) {
#if defined(KVP_BENCH_X86)
  if (__builtin_cpu_supports("avx2")) return read_all_avx2(b.data(), b.size());
#endif
  float s[8] = {};
  const std::size_t n = b.size() / 8 * 8;
  for (std::size_t i = 0; i < n; i += 8) {
    for (int l = 0; l < 8; ++l) s[l] += b[i + static_cast<std::size_t>(l)];
  }
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

void BM_FmaPeak(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(run_fma(1'000'000));
  state.counters["gflops"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 1e6 * 12 * lanes_of(kernels::gemm_isa()) * 2 / 1e9,
                         benchmark::Counter::kIsRate);
  state.SetLabel(std::string(kernels::gemm_isa_name(kernels::gemm_isa())));
}
BENCHMARK(BM_FmaPeak);

void BM_ReadBandwidth(benchmark::State& state) {
  const auto& b = big_buffer();
  for (auto _ : state) benchmark::DoNotOptimize(read_all(b));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(b.size() * sizeof(float)));
}
BENCHMARK(BM_ReadBandwidth)->Unit(benchmark::kMillisecond);

std::vector<float> random_floats(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.uniform() - 0.5);
  return v;
}

// Runs the benchmark's iterations of y = W x; returns their wall time in seconds.
double time_gemm(benchmark::State& state, GemmIsa isa, const std::vector<float>& w, int64_t out_dim, int64_t in_dim,
                 const std::vector<float>& x, int64_t tokens, std::vector<float>& y) {
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    kernels::gemm_rows(isa, w.data(), nullptr, out_dim, in_dim, x.data(), tokens, y.data(), 0, out_dim);
    benchmark::DoNotOptimize(y.data());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// state.range(0) tokens times a random [out_dim, in_dim] weight matrix, as fma_peak_ratio;
// returns the multiply-adds timed.
double run_fma_peak_ratio(benchmark::State& state, int64_t out_dim, int64_t in_dim) {
  const int64_t tokens = state.range(0);
  const auto w = random_floats(out_dim * in_dim, 1);
  const auto x = random_floats(tokens * in_dim, 2);
  std::vector<float> y(static_cast<std::size_t>(tokens * out_dim));
  const GemmIsa isa = kernels::gemm_isa();
  const double peak = measured_fma_peak();
  const double s = time_gemm(state, isa, w, out_dim, in_dim, x, tokens, y);
  const double fmas = static_cast<double>(state.iterations()) * static_cast<double>(tokens * out_dim * in_dim);
  state.counters["fma_peak_ratio"] = fmas / s / peak;
  state.SetLabel(std::string(kernels::gemm_isa_name(isa)));
  return fmas;
}

// T >= 16 tokens times SmolLM2's MLP up projection (weights in cache), as fma_peak_ratio.
void BM_Gemm(benchmark::State& state) {
  const double fmas = run_fma_peak_ratio(state, 1536, 576);
  state.counters["gflops"] = benchmark::Counter(2 * fmas / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Gemm)->Arg(16)->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond);

// One token times the LM head's 576 -> 49152 weights (113 MB, streamed from memory): a GEMV,
// as bandwidth_ratio = its weight bytes per second over a plain read's (read_all) of a
// buffer of the same size. Each iteration times one GEMV and then one read, so the two see
// the same machine: a bandwidth measured once, before the GEMV's iterations, gave ratios of
// 0.47 to 1.12 within one day here. The reported time is the GEMV's alone.
void BM_Gemv(benchmark::State& state) {
  const int64_t in_dim = 576;
  const int64_t out_dim = 49152;
  const auto w = random_floats(out_dim * in_dim, 1);
  const auto other = random_floats(out_dim * in_dim, 3);  // neither stays in cache
  const auto x = random_floats(in_dim, 2);
  std::vector<float> y(static_cast<std::size_t>(out_dim));
  const GemmIsa isa = kernels::gemm_isa();
  double gemv_s = 0.0, read_s = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::gemm_rows(isa, w.data(), nullptr, out_dim, in_dim, x.data(), 1, y.data(), 0, out_dim);
    benchmark::DoNotOptimize(y.data());
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_all(other));
    const auto t2 = std::chrono::steady_clock::now();
    const double g = std::chrono::duration<double>(t1 - t0).count();
    gemv_s += g;
    read_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(g);
  }
  const double bytes = static_cast<double>(state.iterations()) * static_cast<double>(out_dim * in_dim) * 4;
  state.counters["bandwidth_ratio"] = read_s / gemv_s;
  state.counters["gemv_gb_s"] = bytes / gemv_s / 1e9;
  state.counters["read_gb_s"] = bytes / read_s / 1e9;
  state.SetLabel(std::string(kernels::gemm_isa_name(isa)));
}
BENCHMARK(BM_Gemv)->UseManualTime()->Unit(benchmark::kMillisecond);

// The small preset's MLP up projection (256 -> 768) at batch 32, engine_bench's decode shape:
// a short in_dim, so each output's final reduction weighs more against its multiply-adds.
void BM_GemmShortInDim(benchmark::State& state) { run_fma_peak_ratio(state, 768, 256); }
BENCHMARK(BM_GemmShortInDim)->Arg(32);

// T tokens times the LM head's 576 -> 49152 weights (113 MB, streamed from memory on every
// call): decode at batch T on a real model size, where the weight reads must overlap the
// multiply-adds.
void BM_GemmFromMemory(benchmark::State& state) { run_fma_peak_ratio(state, 49152, 576); }
BENCHMARK(BM_GemmFromMemory)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvp

BENCHMARK_MAIN();
