// kvproof simulate: the cost model against hand-computed steps, the cost-model backend's
// contract, the traffic parsers and generators, the contiguous allocator, the allocation
// policies' memory accounting on constructed cases, determinism, and invariant checks on
// a simulated run of the real trace's first minutes.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "optimized/backends/cost_model.h"
#include "optimized/backends/cost_model_backend.h"
#include "optimized/engine/engine.h"
#include "simulate/contiguous_allocator.h"
#include "simulate/memory_accounting.h"
#include "simulate/report.h"
#include "simulate/simulate.h"
#include "simulate/traffic.h"

#ifndef KVPROOF_SHARED_TRACES_DIR
#define KVPROOF_SHARED_TRACES_DIR "../shared/traces"
#endif

namespace kvp {
namespace {

CostModelConfig llama2_7b_on_a100_80gb() {
  CostModelConfig c;
  c.model = *find_model_preset("llama-2-7b");
  c.gpu = *find_gpu_preset("a100-80gb");
  return c;
}

// One sequence per (new tokens, context length); positions are the context's last ones.
BatchPlan plan_of(const std::vector<std::pair<int32_t, int32_t>>& seqs) {
  BatchPlan p;
  p.query_start.push_back(0);
  int64_t id = 0;
  for (auto [n, ctx] : seqs) {
    p.seq_ids.push_back(id++);
    for (int32_t t = ctx - n; t < ctx; ++t) {
      p.token_ids.push_back(1);
      p.positions.push_back(t);
      p.slot_mapping.push_back(t);  // one sequence's table is blocks 0.. in these plans
    }
    p.query_start.push_back(static_cast<int32_t>(p.token_ids.size()));
    p.context_lens.push_back(ctx);
    p.needs_logits.push_back(1);
    p.logits_all.push_back(0);
  }
  int32_t max_blocks = 0;
  for (int32_t ctx : p.context_lens) max_blocks = std::max(max_blocks, (ctx + 15) / 16);
  p.max_blocks_per_seq = max_blocks;
  for (int32_t ctx : p.context_lens)
    for (int32_t j = 0; j < max_blocks; ++j) p.block_tables.push_back(j < (ctx + 15) / 16 ? j : -1);
  return p;
}

TEST(CostModel, PrefillStepMatchesHandComputation) {
  // Llama-2-7B (P = 6.74e9, L = 32, Hq = Hkv = 32, D = 128) on an A100-80GB (312 TFLOP/s at
  // 50%, 2039 GB/s at 80%), one sequence prefilling positions 0..99:
  //   flops = 2 * 6.74e9 * 100 + 4 * 32 * 32 * 128 * (1 + ... + 100 = 5050) = 1.3506476544e12
  //   bytes = 6.74e9 * 2 + 524288 * (100 + 100) = 1.35848576e10
  //   compute = 1.3506476544e12 / 1.56e14 = 8.6580 ms; memory = 1.35848576e10 / 1.6312e12 = 8.3281 ms
  //   step = 8.6580 ms + 2 ms overhead = 10.6580 ms (compute bound)
  const StepCost s = step_cost(llama2_7b_on_a100_80gb(), plan_of({{100, 100}}), 16);
  EXPECT_DOUBLE_EQ(s.flops, 1350647654400.0);
  EXPECT_DOUBLE_EQ(s.bytes, 13584857600.0);
  EXPECT_NEAR(s.total_s, 0.010657997784615385, 1e-12);
  EXPECT_TRUE(s.compute_bound());
}

TEST(CostModel, DecodeStepIsMemoryBound) {
  // Two decode tokens at context 500 and 1000:
  //   bytes = 6.74e9 * 2 + 524288 * (1500 + 2) = 1.4267480576e10 -> 8.7466 ms; flops -> 0.18 ms
  const StepCost s = step_cost(llama2_7b_on_a100_80gb(), plan_of({{1, 500}, {1, 1000}}), 16);
  EXPECT_DOUBLE_EQ(s.bytes, 14267480576.0);
  EXPECT_FALSE(s.compute_bound());
  EXPECT_NEAR(s.total_s, 0.010746616341343796, 1e-12);
}

TEST(CostModel, AHybridReadsTheWindowInItsWindowedLayersOnly) {
  // Gemma 3 1B (L = 26, 4 global + 22 windowed of 512, Hq = 4, Hkv = 1, D = 256, P = 1e9) on an
  // A100-80GB, one decode token at context 2000 (position 1999):
  //   a global layer reads 2000 positions, a windowed one 512 (positions 1488..1999)
  //   kv bytes per layer and token = 2 * 1 * 256 * 2 = 1024
  //   bytes = 1e9 * 2 + 1024 * (4 * (2000 + 1) + 22 * (512 + 1)) = 2e9 + 1024 * 19290 = 2019752960
  //   flops = 2 * 1e9 + 4 * 4 * 256 * (4 * 2000 + 22 * 512) = 2e9 + 4096 * 19264 = 2078905344
  CostModelConfig c;
  c.model = *find_model_preset("gemma-3-1b");
  c.gpu = *find_gpu_preset("a100-80gb");
  EXPECT_EQ(c.model.windowed_layers(), 22);
  EXPECT_EQ(c.model.kv_window(), 0);  // one block table: the global layers keep every block
  const StepCost s = step_cost(c, plan_of({{1, 2000}}), 16);
  EXPECT_DOUBLE_EQ(s.bytes, 2019752960.0);
  EXPECT_DOUBLE_EQ(s.flops, 2078905344.0);
  // The same model with every layer global reads 26 * 2001 positions.
  c.model.full_attention_layers = 26;
  EXPECT_DOUBLE_EQ(step_cost(c, plan_of({{1, 2000}}), 16).bytes, 2e9 + 1024.0 * 26 * 2001);
  c.model.full_attention_layers = 27;
  EXPECT_FALSE(c.validate().is_ok());
}

TEST(CostModel, SwapsCostHostLinkTime) {
  BatchPlan p = plan_of({});
  p.ops.swap_out = {{0, 0}, {1, 1}};
  const CostModelConfig c = llama2_7b_on_a100_80gb();
  const StepCost s = step_cost(c, p, 16);
  // 2 blocks * 16 tokens * 524288 bytes over 32 GB/s at 80%, plus the step overhead.
  EXPECT_NEAR(s.total_s, 2 * 16 * 524288.0 / (32e9 * 0.8) + 0.002, 1e-15);
}

TEST(CostModel, KvPoolIsMemoryTimesUtilizationMinusWeightsMinusReserve) {
  CostModelConfig c;
  c.model = *find_model_preset("llama-3-8b");
  c.gpu = *find_gpu_preset("h200");
  EXPECT_DOUBLE_EQ(c.kv_pool_bytes(), 141e9 * 0.9 - 8.03e9 * 2 - 2.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(c.kv_bytes_per_token(), 2.0 * 32 * 8 * 128 * 2);  // 131072: GQA, 8 KV heads
  EXPECT_EQ(c.num_device_blocks(16), static_cast<int64_t>(std::floor(c.kv_pool_bytes() / (131072.0 * 16))));
}

TEST(CostModel, PresetsAndErrors) {
  for (const char* m :
       {"llama-2-7b", "llama-2-13b", "llama-3-8b", "mistral-7b", "qwen2.5-7b", "gemma-3-1b", "gemma-3-27b"})
    EXPECT_TRUE(find_model_preset(m).is_ok()) << m;
  for (const char* g : {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "H200"})
    EXPECT_TRUE(find_gpu_preset(g).is_ok()) << g;
  auto bad = find_model_preset("gpt-5");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("llama-3-8b"), std::string::npos);
  CostModelConfig c = llama2_7b_on_a100_80gb();
  c.compute_efficiency = 1.5;
  EXPECT_FALSE(c.validate().is_ok());
}

TEST(CostModelBackend, ValidatesThenAdvancesClockAndReturnsOneWideRows) {
  const CostModelConfig c = llama2_7b_on_a100_80gb();
  KvPoolShape pool;
  pool.num_layers = 32;
  pool.num_kv_heads = 32;
  pool.head_dim = 128;
  pool.block_size = 16;
  pool.num_device_blocks = 1000;
  CostModelBackend backend(c, pool, {32000, 4096, 0, {}});
  StepOutput out;
  ASSERT_TRUE(backend.execute(plan_of({{100, 100}, {1, 40}}), out).is_ok());
  EXPECT_NEAR(backend.clock_s(), step_cost(c, plan_of({{100, 100}, {1, 40}}), 16).total_s, 1e-15);
  EXPECT_EQ(out.vocab_size, 1);
  EXPECT_EQ(out.logit_row_start, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(out.logits.size(), 2u);

  BatchPlan bad = plan_of({{1, 40}});
  bad.token_ids[0] = 32000;  // outside the vocabulary
  const double before = backend.clock_s();
  EXPECT_FALSE(backend.execute(bad, out).is_ok());
  EXPECT_EQ(backend.clock_s(), before);  // nothing changed
}

TEST(CostModelBackend, EngineRunsOnItAndForgetsOnlyFinishedRequests) {
  const CostModelConfig c = llama2_7b_on_a100_80gb();
  EngineConfig ec;
  ec.vocab_size = 32000;
  ec.kv.pool.num_layers = 32;
  ec.kv.pool.num_kv_heads = 32;
  ec.kv.pool.head_dim = 128;
  ec.kv.pool.num_device_blocks = 64;
  CostModelBackend backend(c, ec.kv.pool, {32000, 4096, 0, {}});
  auto engine = Engine::create(ec, backend);
  ASSERT_TRUE(engine.is_ok()) << engine.status().message();
  RequestSpec spec;
  spec.prompt = {5, 6, 7};
  spec.max_tokens = 4;
  const RequestId id = (*engine)->add_request(spec);
  EXPECT_FALSE((*engine)->forget(id));  // still waiting
  while ((*engine)->has_unfinished()) ASSERT_TRUE((*engine)->step().is_ok());
  EXPECT_EQ((*engine)->request(id).output(), (std::vector<int32_t>{0, 0, 0, 0}));  // one-wide rows: token 0
  EXPECT_EQ(backend.steps(), 4);
  EXPECT_GT(backend.clock_s(), 4 * c.step_overhead_s);
  EXPECT_TRUE((*engine)->forget(id));
  EXPECT_TRUE((*engine)->requests().empty());
  EXPECT_FALSE((*engine)->forget(id));  // unknown now
}

// ---- traffic ----

TEST(Traffic, AzureCsvArrivalsAreRelativeSeconds) {
  std::istringstream in(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:46.5000000,374,44\n"
      "2023-11-16 18:15:48.0000000,396,109\n"
      "2023-11-17 00:00:00,10,0\n");
  auto t = parse_azure_csv(in, "t.csv");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  ASSERT_EQ(t->requests.size(), 3u);
  EXPECT_DOUBLE_EQ(t->requests[0].arrival_s, 0);
  EXPECT_DOUBLE_EQ(t->requests[1].arrival_s, 1.5);
  EXPECT_DOUBLE_EQ(t->requests[2].arrival_s, 5 * 3600 + 44 * 60 + 13.5);  // across midnight
  EXPECT_EQ(t->requests[1].prompt_tokens, 396);
  EXPECT_EQ(t->requests[1].output_tokens, 109);
  EXPECT_EQ(t->requests[2].output_tokens, 1);  // 0 generated tokens read as 1
}

std::string csv_error(const std::string& text) {
  std::istringstream in(text);
  auto t = parse_azure_csv(in, "trace.csv");
  return t.is_ok() ? "" : t.status().message();
}

TEST(Traffic, AzureCsvErrorsNameLineAndField) {
  const std::string head = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  EXPECT_EQ(csv_error(head + "2023-11-16 18:15:46.5,374,44\n2023-11-16 18:15:47,12x,3\n"),
            "trace.csv:3: field ContextTokens: not an integer: '12x'");
  EXPECT_EQ(csv_error(head + "2023-11-16 18:15:46.5,374,-4\n"),
            "trace.csv:2: field GeneratedTokens: must be >= 0, got -4");
  EXPECT_EQ(csv_error(head + "2023-13-16 18:15:46.5,374,4\n").rfind("trace.csv:2: field TIMESTAMP: not a time", 0), 0u);
  EXPECT_EQ(csv_error(head + "1.0,0,4\n"), "trace.csv:2: field ContextTokens: must be >= 1, got 0");
  EXPECT_EQ(csv_error(head + "1.0,3\n"), "trace.csv:2: expected 3 fields, got 2");
  EXPECT_EQ(csv_error(head + "1.0,3,4\n\n1.0,3,x\n"), "trace.csv:4: field GeneratedTokens: not an integer: 'x'");
  EXPECT_EQ(csv_error("TIMESTAMP,Context,GeneratedTokens\n"),
            "trace.csv:1: field ContextTokens: missing from the header");
  EXPECT_NE(csv_error(""), "");
}

TEST(Traffic, JsonlParsesAndErrorsNameLineAndField) {
  std::istringstream ok(
      "{\"arrival_s\": 0.5, \"prompt_tokens\": 100, \"output_tokens\": 20, \"tenant\": 1, \"shared_prefix_tokens\": "
      "64}\n"
      "\n"
      "{\"arrival_s\": 0.25, \"prompt_tokens\": 10, \"output_tokens\": 2}\n");
  auto t = parse_traffic_jsonl(ok, "t.jsonl");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  ASSERT_EQ(t->requests.size(), 2u);
  EXPECT_EQ(t->requests[0].prompt_tokens, 10);  // sorted by arrival, restarted at 0
  EXPECT_DOUBLE_EQ(t->requests[1].arrival_s, 0.25);
  EXPECT_EQ(t->requests[1].shared_prefix_tokens, 64);

  auto error = [](const std::string& text) {
    std::istringstream in(text);
    auto r = parse_traffic_jsonl(in, "t.jsonl");
    return r.is_ok() ? std::string() : r.status().message();
  };
  EXPECT_EQ(
      error("{\"arrival_s\": 0, \"prompt_tokens\": 1, \"output_tokens\": 1}\n{\"arrival_s\": 1, \"output_tokens\": 1}"),
      "t.jsonl:2: field prompt_tokens: missing");
  EXPECT_EQ(error("{\"arrival_s\": 0, \"prompt_tokens\": 1.5, \"output_tokens\": 1}"),
            "t.jsonl:1: field prompt_tokens: not an integer: 1.5");
  EXPECT_EQ(error("{\"arrival_s\": \"x\", \"prompt_tokens\": 1, \"output_tokens\": 1}"),
            "t.jsonl:1: field arrival_s: not a finite number: \"x\"");
  EXPECT_EQ(error("{\"arrival_s\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1, \"shared_prefix_tokens\": 5}"),
            "t.jsonl:1: field shared_prefix_tokens: must be in [0, prompt_tokens], got 5");
  EXPECT_EQ(error("[1, 2]"), "t.jsonl:1: not a JSON object");
  EXPECT_EQ(error("{oops"), "t.jsonl:1: not a JSON object");
}

TEST(Traffic, SameSeedSameTrafficAndRateHolds) {
  auto spec = builtin_traffic("chat", 5, 4000, 0, 7);
  ASSERT_TRUE(spec.is_ok());
  const Traffic a = generate_traffic(*spec);
  const Traffic b = generate_traffic(*spec);
  ASSERT_EQ(a.requests.size(), 4000u);
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].arrival_s, b.requests[i].arrival_s);
    EXPECT_EQ(a.requests[i].prompt_tokens, b.requests[i].prompt_tokens);
  }
  EXPECT_NEAR(a.mean_rate(), 5, 0.3);
  spec->seed = 8;
  EXPECT_NE(generate_traffic(*spec).requests[1].arrival_s, a.requests[1].arrival_s);

  Traffic r = a;
  reshape_traffic(r, 1, 10, 0, 0);
  EXPECT_NEAR(r.mean_rate(), 10, 1e-9);
  reshape_traffic(r, 2, 0, 60, 0);  // twice as fast, the first minute
  EXPECT_NEAR(static_cast<double>(r.requests.size()), 1200, 120);
  EXPECT_LT(r.requests.back().arrival_s, 60);
}

TEST(Traffic, GammaArrivalsAreBurstierThanPoisson) {
  auto cv_of = [](const Traffic& t) {
    std::vector<double> gaps;
    for (std::size_t i = 1; i < t.requests.size(); ++i)
      gaps.push_back(t.requests[i].arrival_s - t.requests[i - 1].arrival_s);
    double mean = 0, var = 0;
    for (double g : gaps) mean += g / static_cast<double>(gaps.size());
    for (double g : gaps) var += (g - mean) * (g - mean) / static_cast<double>(gaps.size());
    return std::sqrt(var) / mean;
  };
  EXPECT_NEAR(cv_of(generate_traffic(*builtin_traffic("chat", 4, 5000, 0, 1))), 1.0, 0.1);
  EXPECT_NEAR(cv_of(generate_traffic(*builtin_traffic("bursty", 4, 5000, 0, 1))), 3.0, 0.6);
}

// ---- contiguous allocator ----

TEST(ContiguousAllocator, FirstFitMergesHolesAndExtendsInPlace) {
  sim::ContiguousAllocator a(100);
  EXPECT_EQ(a.allocate(30), 0);
  EXPECT_EQ(a.allocate(30), 30);
  EXPECT_EQ(a.allocate(30), 60);
  EXPECT_EQ(a.allocate(20), -1);  // 10 free
  a.free(30, 30);
  EXPECT_EQ(a.free_in_holes_smaller_than(35), 40);  // holes of 30 and 10
  EXPECT_EQ(a.largest_hole(), 30);
  EXPECT_FALSE(a.try_extend(0, 30, 61));
  EXPECT_TRUE(a.try_extend(0, 30, 45));
  EXPECT_EQ(a.allocate(15), 45);
  a.free(0, 45);
  a.free(45, 15);
  a.free(60, 30);
  EXPECT_EQ(a.num_holes(), 1);
  EXPECT_EQ(a.num_free(), 100);
}

// ---- the simulation ----

Traffic fixed_traffic(int64_t n, double gap_s, int64_t prompt, int64_t output) {
  Traffic t;
  t.name = "fixed";
  for (int64_t i = 0; i < n; ++i) t.requests.push_back({static_cast<double>(i) * gap_s, prompt, output, 0, 0});
  return t;
}

sim::SimOptions small_gpu_options() {
  // Llama-2-13B on an A100-40GB: about 9,500 token slots of KV memory (the paper's setting).
  sim::SimOptions o;
  o.model = "llama-2-13b";
  o.gpu = "a100-40gb";
  o.sample_interval_s = 0;
  return o;
}

TEST(Simulate, PagedSharesCountSlotsOfEveryHeldBlock) {
  // One request, prompt 20, output 3, block size 16, a sample before every step:
  //   before step 1: nothing held
  //   before step 2: 2 blocks = 32 slots; 20 tokens, 3 reserved (final length 23), 9 internal
  //   before step 3: 21 tokens, 2 reserved, 9 internal (step 3 emits the last token)
  sim::SimOptions o = small_gpu_options();
  auto r = sim::simulate(o, fixed_traffic(1, 1, 20, 3));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->memory.token_states, 41.0 / 64);
  EXPECT_DOUBLE_EQ(r->memory.reserved, 5.0 / 64);
  EXPECT_DOUBLE_EQ(r->memory.internal, 18.0 / 64);
  EXPECT_EQ(r->memory.external, 0);
  EXPECT_EQ(r->steps, 3);
}

// --kv-dtype: an fp8 KV cache is one byte per element, so the same pool holds twice bf16's
// token slots (the capacity half of the FP8 decision; verify --kv-dtype measures the accuracy
// half), and the report names the dtype; a bad name is refused by the setting's parser.
TEST(Simulate, Fp8KvDoublesTheTokenSlotsOfTheSamePool) {
  sim::SimOptions o = small_gpu_options();
  auto bf16 = sim::simulate(o, fixed_traffic(1, 1, 20, 3));
  ASSERT_TRUE(sim::apply_setting(o, "kv-dtype", "fp8-e4m3").is_ok());
  auto fp8 = sim::simulate(o, fixed_traffic(1, 1, 20, 3));
  ASSERT_TRUE(bf16.is_ok() && fp8.is_ok());
  EXPECT_EQ(bf16->kv_dtype, "bf16");
  EXPECT_EQ(fp8->kv_dtype, "fp8-e4m3");
  EXPECT_DOUBLE_EQ(fp8->kv_bytes_per_token * 2, bf16->kv_bytes_per_token);
  EXPECT_DOUBLE_EQ(fp8->kv_pool_bytes, bf16->kv_pool_bytes);
  EXPECT_NEAR(static_cast<double>(fp8->kv_capacity_tokens), 2.0 * static_cast<double>(bf16->kv_capacity_tokens), 16);
  EXPECT_FALSE(sim::apply_setting(o, "kv-dtype", "int4").is_ok());
}

TEST(Simulate, ForkedSamplesCountTheirSharedBlocksOnce) {
  // One request, prompt 20, output 3, n = 2, block size 16, a sample before every step:
  //   before step 1: nothing held
  //   before step 2: both samples hold the same 2 blocks (32 slots): 20 tokens, 3 reserved
  //                  (once, though both will fill them), 9 internal
  //   before step 3: block 1 was copied on the first write: 3 blocks (48 slots), 16 + 5 + 5
  //                  tokens, 2 + 2 reserved, 11 + 7 internal
  sim::SimOptions o = small_gpu_options();
  o.n = 2;
  o.check = true;
  auto r = sim::simulate(o, fixed_traffic(1, 1, 20, 3));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->timeline.size(), 3u);
  EXPECT_EQ(r->timeline[0].memory, (sim::MemorySlots{0, 0, 0, 0}));
  EXPECT_EQ(r->timeline[1].memory, (sim::MemorySlots{20, 3, 9, 0}));
  EXPECT_EQ(r->timeline[2].memory, (sim::MemorySlots{26, 4, 18, 0}));
  EXPECT_EQ(r->memory_slots, (sim::MemorySlots{46, 7, 27, 0}));
  EXPECT_DOUBLE_EQ(r->memory.reserved, 7.0 / 80);
  EXPECT_EQ(r->finished, 1);
  EXPECT_TRUE(sim::check_memory_shares(*r).is_ok());
}

// mistral-7b's 4,096-position window releases blocks behind it. One request, prompt 6000,
// output 3, block size 16, a sample before every step:
//   before step 2 (the prompt final): 375 blocks, the first (6000 - 4095) / 16 = 119
//     released: 256 held = 4096 slots, all token states (positions 1904..5999)
//   before step 3 (6001 final): 376 blocks, 119 released, 257 held = 4112 slots: 4097 token
//     states, 2 reserved (final length 6003), 13 internal
// With the window off, every block stays: 376 blocks = 6016 slots at most.
TEST(Simulate, ASlidingWindowHoldsOnlyTheBlocksItsWindowReads) {
  sim::SimOptions o = small_gpu_options();
  o.model = "mistral-7b";
  o.max_model_len = 8192;
  o.check = true;
  auto peak = [](const sim::SimReport& r) {
    int64_t held = 0;
    for (const sim::TimelinePoint& p : r.timeline) held = std::max(held, p.memory.held());
    return held;
  };
  auto windowed = sim::simulate(o, fixed_traffic(1, 1, 6000, 3));
  ASSERT_TRUE(windowed.is_ok()) << windowed.status().message();
  EXPECT_EQ(windowed->sliding_window, 4096);
  EXPECT_EQ(peak(*windowed), 4112);
  const sim::TimelinePoint& last = windowed->timeline.back();
  EXPECT_EQ(last.memory.token_states, 4097);
  EXPECT_EQ(last.memory.reserved, 2);
  EXPECT_EQ(last.memory.internal, 13);
  ASSERT_TRUE(sim::apply_setting(o, "sliding-window", "off").is_ok());
  auto full = sim::simulate(o, fixed_traffic(1, 1, 6000, 3));
  ASSERT_TRUE(full.is_ok()) << full.status().message();
  EXPECT_EQ(full->sliding_window, 0);
  EXPECT_EQ(peak(*full), 6016);
  EXPECT_FALSE(sim::apply_setting(o, "sliding-window", "512").is_ok());
}

// gemma-3-27b (62 layers: 10 global, 52 with window 1024) as KV-cache groups: 7 groups of 10
// layers (6 windowed, the last holding 2 layers in blocks sized for 10; 1 full), a block
// 16 positions x 10 layers x 2 (K, V) x 16 KV heads x 128 x 2 bytes = 1,310,720 B against
// 8,126,464 B for every layer's. One request, prompt 3000, output 3, a sample before every
// step:
//   before step 2 (3000 final): the full group 188 blocks: 3000 token states, 3 reserved
//     (final length 3003), 5 internal; each windowed group releases (3000 - 1023) / 16 = 123
//     and holds 65 blocks: positions 1968..2999 = 1032 token states, 3 reserved, 5 internal
//   before step 3 (3001 final): 3001 + 6 x 1033 token states, 7 x 2 reserved, 7 x 5 internal
// 578 blocks of 1,310,720 B against the window off's 188 of 8,126,464 B: 49.6% of the bytes.
TEST(Simulate, AHybridsWindowedGroupsHoldOnlyTheirWindowsBlocks) {
  sim::SimOptions o;
  o.model = "gemma-3-27b";
  o.gpu = "h100-80gb";
  o.sample_interval_s = 0;
  o.check = true;
  auto groups = sim::simulate(o, fixed_traffic(1, 1, 3000, 3));
  ASSERT_TRUE(groups.is_ok()) << groups.status().message();
  EXPECT_EQ(groups->kv_groups, "7 groups of 10 layers: 1 full, 6 with window 1024");
  EXPECT_EQ(groups->num_kv_groups, 7);
  EXPECT_EQ(groups->sliding_window, 1024);
  EXPECT_EQ(groups->num_device_blocks, static_cast<int64_t>(std::floor(groups->kv_pool_bytes / 1310720.0)));
  EXPECT_EQ(groups->kv_capacity_slots, groups->num_device_blocks * 16);
  EXPECT_EQ(groups->kv_capacity_tokens, groups->num_device_blocks * 16 / 7);
  ASSERT_EQ(groups->timeline.size(), 3u);
  EXPECT_EQ(groups->timeline[1].memory, (sim::MemorySlots{3000 + 6 * 1032, 7 * 3, 7 * 5, 0}));
  EXPECT_EQ(groups->timeline[2].memory, (sim::MemorySlots{3001 + 6 * 1033, 7 * 2, 7 * 5, 0}));
  EXPECT_EQ(groups->finished, 1);
  EXPECT_TRUE(sim::check_memory_shares(*groups).is_ok());

  ASSERT_TRUE(sim::apply_setting(o, "sliding-window", "off").is_ok());
  auto one = sim::simulate(o, fixed_traffic(1, 1, 3000, 3));
  ASSERT_TRUE(one.is_ok()) << one.status().message();
  EXPECT_EQ(one->kv_groups, "");
  EXPECT_EQ(one->num_kv_groups, 1);
  EXPECT_EQ(one->sliding_window, 0);
  EXPECT_EQ(one->num_device_blocks, static_cast<int64_t>(std::floor(one->kv_pool_bytes / 8126464.0)));
  EXPECT_EQ(one->kv_capacity_tokens, one->num_device_blocks * 16);
  ASSERT_EQ(one->timeline.size(), 3u);
  EXPECT_EQ(one->timeline[1].memory, (sim::MemorySlots{3000, 3, 5, 0}));
  // The same pool's share: 578 small blocks against 188 whole ones.
  EXPECT_DOUBLE_EQ(groups->timeline[1].kv_in_use, 578.0 / static_cast<double>(groups->num_device_blocks));
  EXPECT_DOUBLE_EQ(one->timeline[1].kv_in_use, 188.0 / static_cast<double>(one->num_device_blocks));
  EXPECT_LT(groups->timeline[1].kv_in_use, 0.5 * one->timeline[1].kv_in_use);
}

TEST(Simulate, ParallelSamplesNeedThePagedPolicy) {
  sim::SimOptions o = small_gpu_options();
  o.n = 2;
  o.policy = sim::AllocationPolicy::kContiguousOracle;
  auto r = sim::simulate(o, fixed_traffic(1, 1, 20, 3));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("paged policy"), std::string::npos);
}

KvCacheManager forked_manager() {
  // Block size 4; sequence 1 holds 6 tokens' slots in blocks {0, 1}, sequence 2 its fork.
  KvCacheConfig c;
  c.pool.block_size = 4;
  c.pool.num_device_blocks = 8;
  c.pool.num_host_blocks = 4;
  c.enable_prefix_caching = false;
  return KvCacheManager(c);
}

TEST(MemoryAccounting, CheckerRecountsAForkFromTheBlocksAndNamesBothNumbers) {
  KvCacheManager kv = forked_manager();
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7};
  ASSERT_TRUE(kv.add_sequence(1, 0, tokens).is_ok());
  std::vector<int64_t> mapping;
  ASSERT_TRUE(kv.allocate_slots(1, 6, mapping).is_ok());
  ASSERT_TRUE(kv.fork(1, 2).is_ok());
  sim::MemoryAccountingState st;
  st.kv = &kv;
  st.requests = {{1, 9}, {2, 7}};  // final lengths: 3 and 1 more slots, in the shared block 1
  // 2 blocks = 8 slots: 6 token states, slot 6 and 7 reserved (by sequence 1; sequence 2
  // only will fill slot 6), no internal.
  EXPECT_TRUE(sim::check_memory_accounting(st, {6, 2, 0, 0}).is_ok());
  // The shared blocks counted once per holder: the sum no longer is the memory in use.
  const Status twice = sim::check_memory_accounting(st, {12, 2, 0, 0});
  ASSERT_FALSE(twice.is_ok());
  EXPECT_NE(twice.message().find("split 14 slots"), std::string::npos) << twice.message();
  EXPECT_NE(twice.message().find("holds 8 slots in use"), std::string::npos) << twice.message();
  // The same sum, split wrongly.
  const Status split = sim::check_memory_accounting(st, {6, 0, 2, 0});
  ASSERT_FALSE(split.is_ok());
  EXPECT_NE(split.message().find("reserved: the simulator reports 0 slots, the KV manager's blocks hold 2"),
            std::string::npos)
      << split.message();
  // A sequence the simulator forgot.
  st.requests = {{1, 9}};
  EXPECT_FALSE(sim::check_memory_accounting(st, {6, 2, 0, 0}).is_ok());
}

// KV-cache groups: a full group and one of window 8, blocks of 4. 13 positions final: the
// full group's 4 blocks hold 13 token states, 2 reserved (final length 15), 1 internal; the
// windowed group released (13 - 7) / 4 = 1 entry and its 3 blocks hold positions 4..12 (9
// token states), 2 reserved, 1 internal.
TEST(MemoryAccounting, CheckerRecountsEveryKvCacheGroupsTable) {
  KvCacheConfig c;
  c.pool.block_size = 4;
  c.pool.num_device_blocks = 16;
  c.pool.num_host_blocks = 4;
  c.enable_prefix_caching = false;
  c.group_windows = {0, 8};
  KvCacheManager kv(c);
  std::vector<int32_t> tokens(13);
  for (int32_t i = 0; i < 13; ++i) tokens[static_cast<size_t>(i)] = i + 1;
  ASSERT_TRUE(kv.add_sequence(1, 0, tokens).is_ok());
  std::vector<std::vector<int64_t>> mappings(2);
  ASSERT_EQ(kv.allocate_slots(1, 13, kv.find_prefix(1), std::span<std::vector<int64_t>>(mappings)), AllocStatus::kOk);
  ASSERT_TRUE(kv.mark_final(1, 13).is_ok());
  ASSERT_EQ(kv.sequence(1)->group(1).num_window_released, 1);
  sim::MemoryAccountingState st;
  st.kv = &kv;
  st.requests = {{1, 15}};
  EXPECT_TRUE(sim::check_memory_accounting(st, {22, 4, 2, 0}).is_ok());
  // The windowed group forgotten: 16 slots split, 28 in use.
  const Status forgot = sim::check_memory_accounting(st, {13, 2, 1, 0});
  ASSERT_FALSE(forgot.is_ok());
  EXPECT_NE(forgot.message().find("holds 28 slots in use"), std::string::npos) << forgot.message();
  // The released entry's positions counted as token states, taken from the internal slots.
  const Status released = sim::check_memory_accounting(st, {26, 4, -2, 0});
  ASSERT_FALSE(released.is_ok());
  EXPECT_NE(released.message().find("token_states: the simulator reports 26 slots, the KV manager's blocks hold 22"),
            std::string::npos)
      << released.message();
}

TEST(MemoryAccounting, CheckerRecountsContiguousReservationsAndTheirHoles) {
  KvCacheManager kv = forked_manager();
  sim::MemoryAccountingState st;
  st.kv = &kv;
  st.contiguous = true;
  st.capacity = 100;
  // Reservations [0, 30) and [40, 60): holes of 10 and 40; the head waits for 20 slots, so
  // the hole of 10 is external fragmentation. No sequence has slots yet.
  st.requests = {{1, 25, 0, 30}, {2, 50, 40, 20}};
  st.free_slots = 50;
  st.head_reservation = 20;
  EXPECT_TRUE(sim::check_memory_accounting(st, {0, 45, 5, 10}).is_ok());
  const Status no_external = sim::check_memory_accounting(st, {0, 45, 5, 0});
  ASSERT_FALSE(no_external.is_ok());
  EXPECT_NE(no_external.message().find("cannot use 10 free"), std::string::npos) << no_external.message();
  st.requests[1].res_offset = 20;  // overlaps the first
  EXPECT_FALSE(sim::check_memory_accounting(st, {0, 45, 5, 10}).is_ok());
}

TEST(Simulate, BlockSizeOneHasNoInternalFragmentation) {
  sim::SimOptions o = small_gpu_options();
  o.block_size = 1;
  auto r = sim::simulate(o, generate_traffic(*builtin_traffic("chat", 2, 40, 0, 3)));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->finished + r->rejected, 40);
  EXPECT_EQ(r->memory.internal, 0);
  EXPECT_EQ(r->memory.reserved, 0);  // a block of one slot is only taken for a token
  EXPECT_DOUBLE_EQ(r->memory.token_states, 1.0);

  o.block_size = 128;
  auto big = sim::simulate(o, generate_traffic(*builtin_traffic("chat", 2, 40, 0, 3)));
  ASSERT_TRUE(big.is_ok());
  EXPECT_GT(big->memory.internal + big->memory.reserved, 0.01);
}

TEST(Simulate, ContiguousMaxIsExactWhenEveryRequestHasMaxLength) {
  // Every request is exactly max_model_len long: reserving max_model_len wastes nothing
  // beyond what is reserved for its own future tokens, exactly as the oracle.
  sim::SimOptions o = small_gpu_options();
  o.max_model_len = 1024;
  const Traffic t = fixed_traffic(6, 0.05, 512, 512);  // 6 x 1024 slots fit at once
  o.policy = sim::AllocationPolicy::kContiguousMax;
  auto max = sim::simulate(o, t);
  o.policy = sim::AllocationPolicy::kContiguousOracle;
  auto oracle = sim::simulate(o, t);
  ASSERT_TRUE(max.is_ok() && oracle.is_ok());
  EXPECT_EQ(max->finished, 6);
  EXPECT_EQ(max->memory.internal, 0);
  EXPECT_EQ(max->memory.external, 0);  // nobody waits
  EXPECT_DOUBLE_EQ(max->memory.token_states + max->memory.reserved, 1.0);
  EXPECT_DOUBLE_EQ(max->memory.token_states, oracle->memory.token_states);
  EXPECT_EQ(max->ttft_s.p99, oracle->ttft_s.p99);
}

TEST(Simulate, ContiguousMaxWastesWhatShortRequestsDoNotUse) {
  sim::SimOptions o = small_gpu_options();
  o.max_model_len = 2048;
  o.policy = sim::AllocationPolicy::kContiguousMax;
  auto r = sim::simulate(o, fixed_traffic(30, 0.01, 100, 412));  // final length 512 = a quarter
  ASSERT_TRUE(r.is_ok());
  EXPECT_NEAR(r->memory.internal / (r->memory.token_states + r->memory.reserved + r->memory.internal), 0.75, 1e-9);
  EXPECT_GT(r->memory.external, 0);  // 4 of 2048 fit in 9.5k slots; the next waits
  o.policy = sim::AllocationPolicy::kContiguousOracle;
  auto oracle = sim::simulate(o, fixed_traffic(30, 0.01, 100, 412));
  ASSERT_TRUE(oracle.is_ok());
  EXPECT_EQ(oracle->memory.internal, 0);
  EXPECT_GT(oracle->memory.token_states, r->memory.token_states);
  EXPECT_GT(r->e2e_s.p50, oracle->e2e_s.p50);  // fewer requests at once: slower
}

TEST(Simulate, Pow2ReallocatesPreemptsAndStillFinishesEveryRequestUnderChecks) {
  sim::SimOptions o = small_gpu_options();
  o.policy = sim::AllocationPolicy::kContiguousPow2;
  o.check = true;
  auto r = sim::simulate(o, generate_traffic(*builtin_traffic("chat", 8, 60, 0, 5)));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->finished + r->rejected, 60);
  EXPECT_GT(r->preemptions, 0);
  EXPECT_GT(r->memory.internal, 0);
  EXPECT_GT(r->checked_steps, 0);
}

TEST(Simulate, ConservativeAdmissionNeverPreemptsOptimisticDoesUnderPressure) {
  sim::SimOptions o = small_gpu_options();
  const Traffic t = generate_traffic(*builtin_traffic("chat", 8, 60, 0, 11));
  auto optimistic = sim::simulate(o, t);
  o.admission = AdmissionRule::kConservative;
  auto conservative = sim::simulate(o, t);
  ASSERT_TRUE(optimistic.is_ok()) << optimistic.status().message();
  ASSERT_TRUE(conservative.is_ok()) << conservative.status().message();
  EXPECT_GT(optimistic->preemptions, 0);
  EXPECT_EQ(conservative->preemptions, 0);
  EXPECT_EQ(conservative->finished, optimistic->finished);
  o.admission = AdmissionRule::kOptimistic;
  o.preemption = PreemptionMode::kSwap;
  auto swap = sim::simulate(o, t);
  ASSERT_TRUE(swap.is_ok()) << swap.status().message();
  EXPECT_GT(swap->swaps_out, 0);
}

TEST(Simulate, SameSeedSameResults) {
  sim::SimOptions o = small_gpu_options();
  o.sample_interval_s = 0.5;
  const Traffic t = generate_traffic(*builtin_traffic("shared-prefix", 6, 60, 0, 2));
  auto a = sim::simulate(o, t);
  auto b = sim::simulate(o, t);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  nlohmann::json ja = sim::to_json(*a), jb = sim::to_json(*b);
  for (auto* j : {&ja, &jb}) {
    j->erase("wall_s");
    j->erase("token_steps_per_s");
  }
  EXPECT_EQ(ja, jb);
  EXPECT_GT(a->prefix_hit_tokens, 0);  // four tenants' 512-token system prompts are shared
  o.seed = 1;
  auto c = sim::simulate(o, t);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->finished, a->finished);
}

TEST(Simulate, SweepIsTheCartesianProduct) {
  auto points = sim::expand_sweep(sim::SimOptions{}, {"block-size=16,128", "admission=optimistic,conservative"});
  ASSERT_TRUE(points.is_ok());
  ASSERT_EQ(points->size(), 4u);
  EXPECT_EQ((*points)[1].label, "block-size=16 admission=conservative");
  EXPECT_EQ((*points)[2].options.block_size, 128);
  EXPECT_EQ((*points)[1].options.admission, AdmissionRule::kConservative);
  auto bad = sim::expand_sweep(sim::SimOptions{}, {"colour=red"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("unknown setting 'colour'"), std::string::npos);
  EXPECT_FALSE(sim::expand_sweep(sim::SimOptions{}, {"block-size=0"}).is_ok());
  EXPECT_FALSE(sim::expand_sweep(sim::SimOptions{}, {"policy"}).is_ok());
}

TEST(Simulate, ModelThatDoesNotFitIsAnError) {
  sim::SimOptions o;
  o.model = "llama-2-13b";
  o.gpu = "a100-40gb";
  o.gpu_memory_utilization = 0.5;
  auto r = sim::simulate(o, fixed_traffic(1, 1, 10, 10));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("leaves no KV memory"), std::string::npos);
}

TEST(Simulate, InvariantCheckersPassOnTheRealTracesFirstMinutes) {
  const std::filesystem::path trace = std::filesystem::path(KVPROOF_SHARED_TRACES_DIR) / "azure_llm_2023_conv.csv";
  if (!std::filesystem::exists(trace))
    GTEST_SKIP() << "the Azure conversation trace is absent (" << trace.string()
                 << "); this check runs where ../shared/traces sits beside the checkout";
  auto t = load_traffic(trace);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  // The checkers walk the whole pool and every sequence's context after every step, so a
  // unit run takes the trace's first 15 s; KVPROOF_SIM_CHECK_SECONDS=180 takes 3 minutes.
  const char* env = std::getenv("KVPROOF_SIM_CHECK_SECONDS");
  reshape_traffic(*t, 1, 0, env != nullptr ? std::atof(env) : 15.0, 0);
  sim::SimOptions o;  // Llama-3-8B on an H200, docs/simulate.md's setting
  o.check = true;
  auto r = sim::simulate(o, *t);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->finished + r->rejected, static_cast<int64_t>(t->requests.size()));
  EXPECT_EQ(r->checked_steps, r->steps);
}

}  // namespace
}  // namespace kvp
