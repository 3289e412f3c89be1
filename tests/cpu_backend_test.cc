// What is particular to the CPU backend (its config); everything a backend must do is in
// the conformance suite (backend_conformance_test.cc), which runs the CPU backend too.
#include "optimized/backends/cpu_backend.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/rng.h"
#include "model/presets.h"
#include "optimized/backends/plan_validation.h"
#include "optimized/engine/engine.h"

namespace kvp {
namespace {

const Model& tiny() {
  static const Model m = *make_preset("tiny", 0);
  return m;
}

TEST(CpuBackend, CreateRejectsBadConfigs) {
  CpuBackendConfig c;
  c.pool = pool_shape_for(tiny().config, 4, 4, 0);
  c.pool.num_layers += 1;  // a pool laid out for another model
  auto wrong_model = CpuBackend::create(tiny(), c);
  ASSERT_FALSE(wrong_model.is_ok());
  EXPECT_NE(wrong_model.status().message().find("num_layers"), std::string::npos) << wrong_model.status().message();
  c.pool.num_layers -= 1;
  c.pool.kv_dtype = DType::kF64;
  auto f64 = CpuBackend::create(tiny(), c);
  ASSERT_FALSE(f64.is_ok());
  EXPECT_NE(f64.status().message().find("kv_dtype"), std::string::npos) << f64.status().message();
  c.pool.kv_dtype = DType::kF8E4M3;  // fp8 without its scales
  auto unscaled = CpuBackend::create(tiny(), c);
  ASSERT_FALSE(unscaled.is_ok());
  EXPECT_NE(unscaled.status().message().find("k_scales"), std::string::npos) << unscaled.status().message();
  c.pool.kv_dtype = DType::kF32;
  c.pool.block_size = 0;
  EXPECT_FALSE(CpuBackend::create(tiny(), c).is_ok());
  c.pool.block_size = 4;
  c.num_threads = 0;
  EXPECT_FALSE(CpuBackend::create(tiny(), c).is_ok());
  c.num_threads = 2;
  c.pool.num_device_blocks = 0;
  EXPECT_FALSE(CpuBackend::create(tiny(), c).is_ok());
  c.pool.num_device_blocks = 4;
  auto ok = CpuBackend::create(tiny(), c);
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ((*ok)->num_device_slots(), 16);
  EXPECT_STREQ((*ok)->name(), "cpu");
}

// Runs the engine to the end; every captured logit row of `ids`, request by request.
std::vector<std::vector<float>> run_and_collect(Engine& engine, const std::vector<RequestId>& ids) {
  while (engine.has_unfinished()) EXPECT_TRUE(engine.step().is_ok());
  std::vector<std::vector<float>> rows;
  for (RequestId id : ids) {
    for (const auto& row : engine.request(id).logits) rows.push_back(row);
  }
  return rows;
}

// The same rows, bit for bit.
void expect_same_rows(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].size(), want[r].size()) << what;
    EXPECT_EQ(0, std::memcmp(got[r].data(), want[r].data(), want[r].size() * sizeof(float))) << what << ", row " << r;
  }
}

// Every logit of a few requests (prefill chunks and decode steps), run on the tiny model with
// the given projection ISA and thread count.
std::vector<std::vector<float>> run_logits(kernels::GemmIsa isa, int threads) {
  const Model& model = tiny();
  EngineConfig c;
  c.kv.pool = pool_shape_for(model.config, 4, 64, 0);
  c.scheduler.max_num_batched_tokens = 64;
  c.scheduler.prefill_chunk_size = 16;
  c.vocab_size = model.config.vocab_size;
  CpuBackendConfig bc;
  bc.pool = c.kv.pool;
  bc.gemm_isa = isa;
  bc.num_threads = threads;
  CpuBackend backend(model, bc);
  Engine engine(c, backend);
  Rng rng(5);
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i) {
    RequestSpec s;
    for (int j = 0; j < 20 + 7 * i; ++j) s.prompt.push_back(static_cast<int32_t>(rng.below(500)));
    s.max_tokens = 6;
    s.capture_logits = true;
    ids.push_back(engine.add_request(s));
  }
  return run_and_collect(engine, ids);
}

TEST(CpuBackend, EveryGemmIsaAndThreadCountGivesTheSameLogitBits) {
  const auto want = run_logits(kernels::GemmIsa::kScalar, 1);
  ASSERT_FALSE(want.empty());
  int compared = 0;
  for (kernels::GemmIsa isa : {kernels::GemmIsa::kScalar, kernels::GemmIsa::kAvx2, kernels::GemmIsa::kAvx512}) {
    if (!kernels::gemm_isa_supported(isa)) continue;
    for (int threads : {1, 2}) {
      expect_same_rows(run_logits(isa, threads), want,
                       std::string(kernels::gemm_isa_name(isa)) + " threads " + std::to_string(threads));
      ++compared;
    }
  }
  EXPECT_GE(compared, 2);
}

TEST(CpuBackend, CreateRejectsAnIsaTheCpuLacks) {
  for (kernels::GemmIsa isa : {kernels::GemmIsa::kAvx2, kernels::GemmIsa::kAvx512}) {
    if (kernels::gemm_isa_supported(isa)) continue;
    CpuBackendConfig c;
    c.pool = pool_shape_for(tiny().config, 4, 4, 0);
    c.gemm_isa = isa;
    auto r = CpuBackend::create(tiny(), c);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("gemm_isa"), std::string::npos) << r.status().message();
  }
}

// Attention long enough to run on the threads (kMinParallelMacs), split by work, not by
// count: a 600-token prefill chunk (each thread a run of whole tokens), then decode steps of
// two sequences (too few tokens: items of one KV head each). Every logit has the same bits
// at 1, 2 and 5 threads.
std::vector<std::vector<float>> run_long_context_logits(int threads) {
  // The small preset's attention shape (8 query heads over 4 KV heads of 32), with 2 layers
  // and a short vocabulary and MLP: the attention's cost decides whether it runs threaded;
  // the rest only makes the test slower (it runs under ThreadSanitizer in CI).
  static const Model model = [] {
    ModelConfig config = *preset_config("small");
    config.num_layers = 2;
    config.vocab_size = 256;
    config.intermediate_size = 128;
    return make_random_model(config, 3);
  }();
  EngineConfig c;
  c.kv.pool = pool_shape_for(model.config, 16, 2 * 80, 0);
  c.scheduler.max_num_batched_tokens = 1200;
  c.scheduler.prefill_chunk_size = 600;
  c.scheduler.max_model_len = 4096;
  c.vocab_size = model.config.vocab_size;
  CpuBackendConfig bc;
  bc.pool = c.kv.pool;
  bc.num_threads = threads;
  CpuBackend backend(model, bc);
  Engine engine(c, backend);
  Rng rng(9);
  std::vector<RequestId> ids;
  for (int i = 0; i < 2; ++i) {
    RequestSpec s;
    for (int j = 0; j < 1100 + 60 * i; ++j)
      s.prompt.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(model.config.vocab_size))));
    s.max_tokens = 4;
    s.capture_logits = true;
    ids.push_back(engine.add_request(s));
  }
  return run_and_collect(engine, ids);
}

TEST(CpuBackend, ThreadedAttentionGivesTheSameLogitBitsAtEveryThreadCount) {
  const auto want = run_long_context_logits(1);
  ASSERT_GE(want.size(), 8u);
  for (int threads : {2, 5}) {
    expect_same_rows(run_long_context_logits(threads), want, std::to_string(threads) + " threads");
  }
}

}  // namespace
}  // namespace kvp
