// End-to-end decode tokens/s of the paged engine on the `small` preset, the CUDA backend on a
// GPU (nvcc flavour) against the CPU backend, in one run: batch 1, 8, 32; 128-token prompts;
// no preemption while timing. The CUDA benchmarks skip without a device. BM_EngineDecodeBf16
// runs the CUDA engine with bf16 weights (the model's matrices rounded to bf16 for both; the
// same arithmetic on half the weight bytes) beside the fp32 one. <kCuda> replays decode steps
// from CUDA graphs (the backend's default); <kCudaEager> launches every kernel of every step
// (--max-graph-tokens 0): their ratio is what the graphs save per step.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/rng.h"
#include "model/presets.h"
#include "optimized/backends/cpu_backend.h"
#include "optimized/backends/cuda_backend.h"
#include "optimized/backends/plan_validation.h"
#include "optimized/engine/engine.h"

namespace kvp {
namespace {

const Model& small_model() {
  static const Model m = *make_preset("small");
  return m;
}
const Model& small_model_bf16() {
  static const Model m = [] {
    Model r = *make_preset("small");
    round_matrices_to_bf16(r);
    return r;
  }();
  return m;
}

enum class Kind { kCpu, kCuda, kCudaEager, kCudaBf16 };

template <Kind kind>
void BM_EngineDecode(benchmark::State& state) {
  const auto batch = static_cast<int32_t>(state.range(0));
  const Model& model = kind == Kind::kCudaBf16 ? small_model_bf16() : small_model();
  EngineConfig c;
  c.kv.pool = pool_shape_for(model.config, 16, batch * 34, 0);  // 128 + 400 tokens each
  c.scheduler.max_num_batched_tokens = 4096;
  c.scheduler.max_num_seqs = batch;
  c.scheduler.prefill_chunk_size = 4096;
  c.scheduler.max_model_len = 4096;
  c.vocab_size = model.config.vocab_size;
  std::unique_ptr<Backend> backend;
  if constexpr (kind == Kind::kCpu) {
    CpuBackendConfig bc;
    bc.pool = c.kv.pool;
    backend = std::make_unique<CpuBackend>(model, bc);
  } else {
    CudaBackendConfig bc;
    bc.pool = c.kv.pool;
    bc.weight_dtype = kind == Kind::kCudaBf16 ? DType::kBF16 : DType::kF32;
    if (kind == Kind::kCudaEager) bc.max_graph_tokens = 0;
    auto made = make_cuda_backend(CudaFlavour::kDevice, model, bc);
    if (!made) {
      state.SkipWithError(made.status().message().c_str());
      return;
    }
    backend = std::move(*made);
  }
  Engine engine(c, *backend);
  for (int32_t i = 0; i < batch; ++i) {
    Rng rng(static_cast<uint64_t>(i));
    RequestSpec s;
    for (int j = 0; j < 128; ++j)
      s.prompt.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(model.config.vocab_size))));
    s.max_tokens = 400;
    engine.add_request(s);
  }
  if (!engine.step().is_ok()) state.SkipWithError("prefill failed");
  for (auto _ : state) {
    if (!engine.step().is_ok()) state.SkipWithError("decode step failed");
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * batch, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EngineDecode<Kind::kCpu>)->Arg(1)->Arg(8)->Arg(32)->Iterations(100)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineDecode<Kind::kCuda>)->Arg(1)->Arg(8)->Arg(32)->Iterations(100)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineDecode<Kind::kCudaEager>)->Arg(1)->Arg(8)->Arg(32)->Iterations(100)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineDecode<Kind::kCudaBf16>)->Arg(1)->Arg(8)->Arg(32)->Iterations(100)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvp

BENCHMARK_MAIN();
