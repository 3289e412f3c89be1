// The paged engine against the reference transformer over a grid of schedules: every
// check of `kvproof verify` (invariants after every step, terminal states, no leak, logits
// at every position within the fp32 tolerance, greedy tokens, bitwise recompute and
// non-interference) must pass for each configuration.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "audit/audit.h"
#include "model/presets.h"
#include "optimized/backends/cuda_backend.h"
#include "verify/verify.h"

namespace kvp::verify {
namespace {

const Model& tiny() {
  static const Model m = *make_preset("tiny");
  return m;
}

VerifyOptions with_block_size(int32_t bs) {
  VerifyOptions o;
  o.block_size = bs;
  o.num_blocks = std::max(8, 192 / bs);  // the same ~192 token slots whatever the block size
  o.num_host_blocks = o.num_blocks / 2;
  return o;
}

void expect_passes(const Model& model, const Workload& w, const VerifyOptions& o, VerifyReport* out = nullptr) {
  auto report = run_verify(model, w, o);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_TRUE(report->passed()) << report->table();
  if (out) *out = *report;
}

Workload mixed(int64_t vocab = 512, uint64_t seed = 0) { return *builtin_workload("mixed", vocab, seed); }

class BlockSizes : public ::testing::TestWithParam<int32_t> {};
TEST_P(BlockSizes, EngineMatchesReference) { expect_passes(tiny(), mixed(), with_block_size(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Differential, BlockSizes, ::testing::Values(1, 2, 3, 16, 32));

class ChunkSizes : public ::testing::TestWithParam<int32_t> {};
TEST_P(ChunkSizes, EngineMatchesReference) {
  VerifyOptions o = with_block_size(4);
  o.prefill_chunk_size = GetParam();
  expect_passes(tiny(), mixed(), o);
}
INSTANTIATE_TEST_SUITE_P(Differential, ChunkSizes, ::testing::Values(3, 7, 64));

class KvHeads : public ::testing::TestWithParam<int64_t> {};
TEST_P(KvHeads, GqaMqaAndMhaMatchReference) {
  ModelConfig c = *preset_config("tiny");
  c.num_layers = 2;
  c.num_kv_heads = GetParam();
  expect_passes(make_random_model(c, 11), mixed(), with_block_size(4));
}
INSTANTIATE_TEST_SUITE_P(Differential, KvHeads, ::testing::Values(1, 2, 8));

TEST(Differential, PrefixCachingOff) {
  VerifyOptions o = with_block_size(4);
  o.prefix_caching = false;
  VerifyReport r;
  expect_passes(tiny(), mixed(), o, &r);
  for (const auto& [mode, m] : r.runs) EXPECT_EQ(m.counters.prefix_hit_tokens, 0);
}

TEST(Differential, MultipleTenantsWithGlobalPrefixSharing) {
  VerifyOptions o = with_block_size(4);
  o.global_prefix_sharing = true;
  expect_passes(tiny(), *builtin_workload("shared-prefix", 512, 3), o);
  o.global_prefix_sharing = false;
  expect_passes(tiny(), *builtin_workload("many-users", 512, 3), o);
}

TEST(Differential, ConservativeAdmissionNeverPreempts) {
  VerifyOptions o = with_block_size(4);
  o.admission = AdmissionRule::kConservative;
  VerifyReport r;
  expect_passes(tiny(), mixed(), o, &r);
  for (const auto& [mode, m] : r.runs) EXPECT_EQ(m.counters.preemptions, 0) << mode;
}

// The default configuration of `kvproof verify` exercises what it claims to: preemption in
// both modes, swapping, copy-on-write, prefix hits, chunked prefill, cancellation, poisoning.
TEST(Differential, DefaultsCoverPreemptionSwapPrefixHitsChunkingAndCancellation) {
  VerifyReport r;
  expect_passes(tiny(), mixed(), VerifyOptions{}, &r);
  ASSERT_EQ(r.runs.size(), 2u);
  const EngineCounters& recompute = r.runs[0].second.counters;
  const EngineCounters& swap = r.runs[1].second.counters;
  EXPECT_GT(recompute.preemptions, 0);
  EXPECT_GT(swap.preemptions, 0);
  EXPECT_GT(swap.swaps_out, 0);
  EXPECT_GT(swap.swaps_in, 0);
  EXPECT_GT(recompute.prefix_hit_tokens, 0);
  EXPECT_GT(recompute.cancellations, 0);
  EXPECT_GT(recompute.poisoned_blocks, 0);
  EXPECT_GT(recompute.copy_on_writes, 0);  // parallel samples fork their prompt
  EXPECT_GT(swap.copy_on_writes, 0);
  EXPECT_GT(recompute.prefill_tokens, VerifyOptions{}.prefill_chunk_size);  // prompts longer than a chunk
  for (const CheckResult& c : r.checks) EXPECT_GT(c.count, 0) << c.name;
}

// The CUDA backend's kernels, emulated on the CPU through the SIMT layer, pass every verify
// check on the default workload (about 12 s on the 2-core CI machine).
TEST(Differential, CudaEmuBackendPassesTheDefaults) {
  VerifyOptions o;
  o.backend = BackendKind::kCudaEmu;
  expect_passes(tiny(), mixed(), o);
}

// bf16 KV pools (the coarsest dtype): every check passes at the dtype's default tolerance,
// recompute and non-interference bitwise; the same run fails at f32's tolerance, so the
// logits check does see the rounding.
TEST(Differential, CudaEmuBackendWithBf16KvPassesItsToleranceAndFailsF32s) {
  VerifyOptions o;
  o.backend = BackendKind::kCudaEmu;
  o.kv_dtype = DType::kBF16;
  EXPECT_EQ(tolerance_for(o).value, 1.5e-2);
  expect_passes(tiny(), mixed(), o);
  o.tolerance = 2e-5;
  o.modes = {PreemptionMode::kRecompute};
  auto strict = run_verify(tiny(), *builtin_workload("short-chat", 512, 1), o);
  ASSERT_TRUE(strict.is_ok()) << strict.status().message();
  EXPECT_FALSE(strict->passed());
  bool logits_failed = false;
  for (const CheckResult& c : strict->checks)
    if (c.name.rfind("logits-vs-reference", 0) == 0) logits_failed = !c.passed;
  EXPECT_TRUE(logits_failed) << strict->table();
}

// The real architectures at small sizes: Qwen2 (q/k/v biases, tied embeddings, group 4),
// Llama with llama3 rope scaling and every bias, the same with linear rope scaling, and
// Mistral with sliding windows of 7, 4 and 3 positions over blocks of 4, Gemma 2 and Gemma 3; the
// cpu and cuda-emu backends each against the reference, every check of verify.
class Architectures : public ::testing::TestWithParam<std::tuple<int, const char*>> {};
TEST_P(Architectures, EngineMatchesReference) {
  ModelConfig c = *preset_config("tiny");
  c.num_layers = 2;
  switch (std::get<0>(GetParam())) {
    case 0:
      c.architecture = Architecture::kQwen2;
      c.qkv_bias = true;
      c.tie_word_embeddings = true;
      c.rope_theta = 1e6;
      break;
    case 1:
      c.rope_scaling = {RopeScaling::Type::kLlama3, 32.0, 1.0, 4.0, 64};
      c.rope_theta = 500000.0;
      c.qkv_bias = c.o_bias = c.mlp_bias = true;
      break;
    case 2: c.rope_scaling = {RopeScaling::Type::kLinear, 4.0, 1.0, 4.0, 0}; break;
    // Mistral with a sliding window (every layer): windows longer than a block (4), equal to
    // one and shorter; the workload's contexts are many windows long.
    case 3: c.architecture = Architecture::kMistral, c.sliding_window = 7; break;
    case 4: c.architecture = Architecture::kMistral, c.sliding_window = 4; break;
    case 5: c.architecture = Architecture::kMistral, c.sliding_window = 3; break;
    // Gemma 2 (window 3 on layer 0, caps that bend scores and logits, query_pre_attn_scalar
    // not head_dim) and Gemma 3 (window 4 on layer 0, q/k norms, a local RoPE base), both
    // with head_dim 32 independent of hidden / heads.
    case 6:
      c.architecture = Architecture::kGemma2;
      c.num_heads = 4, c.head_dim = 32, c.tie_word_embeddings = true;
      c.query_pre_attn_scalar = 20.0, c.attn_logit_softcapping = 2.0, c.final_logit_softcapping = 3.0;
      c.sliding_window = 3, c.sliding_layers = {true, false};
      break;
    default:
      c.architecture = Architecture::kGemma3;
      c.num_heads = 4, c.head_dim = 32, c.tie_word_embeddings = true;
      c.query_pre_attn_scalar = 32.0, c.rope_theta = 1e6, c.rope_local_base_freq = 1e4;
      c.sliding_window = 4, c.sliding_layers = {true, false};
      break;
  }
  VerifyOptions o = with_block_size(4);
  o.backend = parse_backend_kind(std::get<1>(GetParam())).value();
  expect_passes(make_random_model(c, 21), mixed(), o);
}
INSTANTIATE_TEST_SUITE_P(Differential, Architectures,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3, 4, 5, 6, 7),
                                            ::testing::Values("cpu", "cuda-emu")));

// The request `spec` as the engine would have run it, its rows the oracle's own (rounded
// to fp32) at the positions in [from, tokens).
Request request_with_oracle_rows(const ReferenceModel<double>& oracle, const std::vector<int32_t>& tokens,
                                 int64_t from = 0) {
  RequestSpec spec;
  spec.prompt = tokens;
  Request r = Request::record(spec, spec.prompt);
  auto cache = oracle.make_cache(static_cast<int64_t>(tokens.size()));
  const auto ref = *oracle.forward(r.tokens(), cache);
  r.logits.resize(static_cast<std::size_t>(ref.rows()));
  for (Eigen::Index p = from; p < ref.rows(); ++p) {
    r.logits[static_cast<std::size_t>(p)].resize(static_cast<std::size_t>(ref.cols()));
    for (Eigen::Index v = 0; v < ref.cols(); ++v)
      r.logits[static_cast<std::size_t>(p)][static_cast<std::size_t>(v)] = static_cast<float>(ref(p, v));
  }
  return r;
}

// The oracle comparisons are reused only for the same tokens and bitwise-equal engine rows:
// the same request again reuses them (the same counts and worst error, to the bit), one
// changed row runs the oracle again and fails, and so does another token.
TEST(OracleMemo, ComparisonsReusedOnlyForTheSameTokensAndBitwiseEqualRows) {
  const ReferenceModel<double> oracle(tiny());
  Request r = request_with_oracle_rows(oracle, {5, 17, 300, 2, 99, 41, 7, 256, 11, 3});
  OracleMemo memo;
  OracleStats stats;
  auto check = [&](const Request& req) {
    CheckResult logits("logits"), greedy("greedy");
    check_against_reference(oracle, req, 2e-5, logits, greedy, "r", &memo, &stats);
    return logits;
  };
  const CheckResult first = check(r);
  ASSERT_TRUE(first.passed) << first.detail;
  EXPECT_EQ(stats.sequences_run, 1);
  const CheckResult again = check(r);
  EXPECT_EQ(stats.comparisons_reused, 1);
  EXPECT_EQ(again.count, first.count);
  EXPECT_EQ(again.worst_error, first.worst_error);  // bitwise: the stored comparison
  EXPECT_TRUE(again.passed);

  Request bad = r;
  bad.logits[6][40] += 1.0f;  // one row, one logit
  const CheckResult changed = check(bad);
  EXPECT_EQ(stats.sequences_run, 2);
  EXPECT_FALSE(changed.passed);
  EXPECT_NE(changed.detail.find("position 6"), std::string::npos) << changed.detail;

  // Another token at position 3 (the rows now belong to other tokens).
  RequestSpec other_spec = r.spec;
  other_spec.prompt[3] = 4;
  Request other = Request::record(other_spec, other_spec.prompt);
  other.logits = r.logits;
  EXPECT_FALSE(check(other).passed);
  EXPECT_EQ(stats.sequences_run, 3);
  EXPECT_EQ(stats.comparisons_reused, 1);
}

// A sequence that shares a prefix with one the oracle ran, and has no engine rows there (a
// prefix-cache hit), starts from a copy of that run's dense cache: the oracle's logits from
// there are the bits a fresh run from position 0 gives, and so are the comparisons.
TEST(OracleMemo, AStoredPrefixGivesTheBitsOfAFreshRun) {
  const ReferenceModel<double> oracle(tiny());
  const std::vector<int32_t> a = {5, 17, 300, 2, 99, 41, 7, 256, 11, 3, 8, 400, 12, 13, 14, 15, 16, 18, 19, 20};
  std::vector<int32_t> b(a.begin(), a.begin() + 12);
  for (int32_t t : {77, 78, 79, 80, 81, 82, 83, 84, 85}) b.push_back(t);

  // The logits themselves: from a restored cache against from position 0.
  OracleMemo memo;
  OracleStats stats;
  auto run_a = oracle.make_cache(static_cast<int64_t>(a.size()));
  ASSERT_TRUE(oracle.forward(a, run_a).is_ok());
  memo.keep_cache(a, std::move(run_a));
  auto restored = oracle.make_cache(static_cast<int64_t>(b.size()));
  ASSERT_EQ(memo.restore_prefix(b, 100, restored), 12);
  const auto from_prefix = *oracle.forward(std::span<const int32_t>(b).subspan(12), restored);
  auto fresh_cache = oracle.make_cache(static_cast<int64_t>(b.size()));
  const auto fresh = *oracle.forward(b, fresh_cache);
  ASSERT_EQ(from_prefix.rows(), fresh.rows() - 12);
  EXPECT_TRUE(from_prefix == fresh.bottomRows(from_prefix.rows())) << "restored prefix changed a bit";
  // At most `limit` positions are restored.
  auto limited = oracle.make_cache(static_cast<int64_t>(b.size()));
  EXPECT_EQ(memo.restore_prefix(b, 5, limited), 5);
  EXPECT_EQ(limited.length(), 5);

  // Through compare_job: B's rows start at position 12, so 12 positions come from A's cache.
  OracleMemo jobs_memo;
  Request ra = request_with_oracle_rows(oracle, a);
  Request rb = request_with_oracle_rows(oracle, b, 12);
  auto job_a = *OracleJob::of(ra, "a", ra.logits);
  auto job_b = *OracleJob::of(rb, "b", rb.logits);
  ASSERT_TRUE(compare_job(oracle, job_a, &jobs_memo, stats).is_ok());
  const auto with_prefix = *compare_job(oracle, job_b, &jobs_memo, stats);
  EXPECT_EQ(stats.positions_restored, 12);
  EXPECT_EQ(stats.positions_run, static_cast<int64_t>(a.size() + b.size() - 12));
  OracleStats plain_stats;
  const auto from_zero = *compare_job(oracle, job_b, nullptr, plain_stats);
  EXPECT_EQ(plain_stats.positions_restored, 0);
  ASSERT_EQ(with_prefix.size(), from_zero.size());
  for (std::size_t p = 0; p < from_zero.size(); ++p) {
    EXPECT_EQ(with_prefix[p].present, from_zero[p].present) << p;
    EXPECT_EQ(with_prefix[p].err, from_zero[p].err) << p;
    EXPECT_EQ(with_prefix[p].scale, from_zero[p].scale) << p;
    EXPECT_EQ(with_prefix[p].best, from_zero[p].best) << p;
    EXPECT_EQ(with_prefix[p].margin, from_zero[p].margin) << p;
  }
}

// The dense caches stay within their byte budget, the least recently used dropped first; a
// run that extends a stored one replaces it.
TEST(OracleMemo, DenseCachesStayWithinTheirBudget) {
  const ReferenceModel<double> oracle(tiny());
  const int64_t one = oracle.make_cache(10).reserved_bytes();
  OracleMemo memo(true, 2 * one);
  auto keep = [&](std::vector<int32_t> t) {
    auto cache = oracle.make_cache(static_cast<int64_t>(t.size()));
    ASSERT_TRUE(oracle.forward(t, cache).is_ok());
    memo.keep_cache(std::move(t), std::move(cache));
  };
  auto restorable = [&](const std::vector<int32_t>& t) {
    auto cache = oracle.make_cache(static_cast<int64_t>(t.size()));
    return memo.restore_prefix(t, static_cast<int64_t>(t.size()), cache);
  };
  keep({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  keep({21, 22, 23, 24, 25, 26, 27, 28, 29, 30});
  EXPECT_EQ(memo.cached_bytes(), 2 * one);
  EXPECT_EQ(restorable({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), 10);  // the first is now the most recent
  keep({41, 42, 43, 44, 45, 46, 47, 48, 49, 50});              // drops the second
  EXPECT_EQ(memo.cached_bytes(), 2 * one);
  EXPECT_EQ(restorable({21, 22, 23}), 0);
  EXPECT_EQ(restorable({1, 2, 3}), 3);
  keep({41, 42, 43, 44, 45, 46, 47, 48, 49, 50});  // the same run again replaces it
  EXPECT_EQ(memo.cached_bytes(), 2 * one);
  OracleMemo off(false);
  auto cache = oracle.make_cache(10);
  ASSERT_TRUE(oracle.forward(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, cache).is_ok());
  off.keep_cache({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, std::move(cache));
  EXPECT_EQ(off.cached_bytes(), 0);
}

// Two reports with the same checks, check by check, to the bit.
// The check of that name in a report (a test failure when there is none).
const CheckResult& check_named(const VerifyReport& r, const std::string& name) {
  for (const CheckResult& c : r.checks)
    if (c.name == name) return c;
  static const CheckResult none("<none>");
  ADD_FAILURE() << "no check " << name << "\n" << r.table();
  return none;
}

void expect_same_checks(const VerifyReport& a, const VerifyReport& b) {
  ASSERT_EQ(a.checks.size(), b.checks.size());
  for (std::size_t i = 0; i < a.checks.size(); ++i) {
    EXPECT_EQ(a.checks[i].name, b.checks[i].name);
    EXPECT_EQ(a.checks[i].passed, b.checks[i].passed) << a.checks[i].name;
    EXPECT_EQ(a.checks[i].count, b.checks[i].count) << a.checks[i].name;
    EXPECT_EQ(a.checks[i].worst_error, b.checks[i].worst_error) << a.checks[i].name;
    EXPECT_EQ(a.checks[i].detail, b.checks[i].detail) << a.checks[i].name;
  }
}

// verify with and without the reuse: the same report, check by check, to the bit.
TEST(OracleMemo, VerifyReportIsTheSameWithAndWithoutReuse) {
  VerifyOptions with, without;
  without.oracle_memo = false;
  VerifyReport a, b;
  expect_passes(tiny(), mixed(), with, &a);
  expect_passes(tiny(), mixed(), without, &b);
  EXPECT_GT(a.oracle.comparisons_reused, 0);
  EXPECT_EQ(b.oracle.comparisons_reused, 0);
  EXPECT_EQ(b.oracle.positions_restored, 0);
  expect_same_checks(a, b);
}

// The oracle on a thread of its own (threads > 1) or at once (1 thread): the same report,
// check by check, to the bit, and the same work done and reused.
TEST(OracleChecks, VerifyReportIsTheSameWithTheOracleInTheBackground) {
  VerifyOptions one, two;
  one.num_threads = 1;
  two.num_threads = 2;
  VerifyReport a, b;
  expect_passes(tiny(), *builtin_workload("shared-prefix", 512, 0), one, &a);
  expect_passes(tiny(), *builtin_workload("shared-prefix", 512, 0), two, &b);
  EXPECT_GT(a.oracle.positions_restored, 0);
  EXPECT_EQ(a.oracle.sequences_run, b.oracle.sequences_run);
  EXPECT_EQ(a.oracle.positions_run, b.oracle.positions_run);
  EXPECT_EQ(a.oracle.positions_restored, b.oracle.positions_restored);
  EXPECT_EQ(a.oracle.comparisons_reused, b.oracle.comparisons_reused);
  // With two threads the non-interference re-runs run two at a time (under ThreadSanitizer
  // in CI's tsan step): the same verdicts, counts and details.
  EXPECT_GE(check_named(b, "non-interference[recompute]").count, 2);
  expect_same_checks(a, b);
}

// A job queued on the worker that fails is reported by finish(), naming the request and
// position; the verdicts come in submission order (the first failure is the first job's).
TEST(OracleChecks, AFailingJobIsReportedInSubmissionOrder) {
  const ReferenceModel<double> oracle(tiny());
  OracleChecks checks(oracle, OracleChecks::Options{});
  CheckResult logits("logits"), greedy("greedy");
  for (int i = 0; i < 4; ++i) {
    Request r = request_with_oracle_rows(oracle, {5, 17, 300, 2, 99, static_cast<int32_t>(41 + i), 7, 256});
    if (i >= 1) r.logits[static_cast<std::size_t>(i + 2)][3] += 1.0f;
    checks.submit(*OracleJob::of(r, "request " + std::to_string(i), r.logits), 2e-5, logits, greedy);
  }
  checks.finish();
  EXPECT_FALSE(logits.passed);
  EXPECT_EQ(logits.count, 32);
  EXPECT_NE(logits.detail.find("request 1 position 3"), std::string::npos) << logits.detail;
  EXPECT_EQ(checks.stats().sequences_run, 4);
}

// Streams are compared in order whatever order their jobs come in: a later stream's job
// submitted first waits until the earlier stream is closed and compared. Observable through
// the memo: B shares A's first 12 positions and has no rows there, so it starts from A's
// dense cache only if A ran first (12 positions restored; 0 had the worker taken B at once).
TEST(OracleChecks, AStreamIsComparedAfterTheStreamsBeforeIt) {
  const ReferenceModel<double> oracle(tiny());
  const std::vector<int32_t> a = {5, 17, 300, 2, 99, 41, 7, 256, 11, 3, 8, 400, 12, 13, 14, 15};
  std::vector<int32_t> b(a.begin(), a.begin() + 12);
  for (int32_t t : {77, 78, 79, 80}) b.push_back(t);
  Request ra = request_with_oracle_rows(oracle, a);
  Request rb = request_with_oracle_rows(oracle, b, 12);
  OracleChecks checks(oracle, OracleChecks::Options{});
  CheckResult logits_a("logits a"), greedy_a("greedy a"), logits_b("logits b"), greedy_b("greedy b");
  checks.submit(*OracleJob::of(rb, "b", rb.logits), 2e-5, logits_b, greedy_b, /*stream=*/1);
  checks.close(1);
  // Stream 1 is closed but stream 0 is still open: nothing of stream 1 is compared yet.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  checks.submit(*OracleJob::of(ra, "a", ra.logits), 2e-5, logits_a, greedy_a, /*stream=*/0);
  checks.close(0);
  checks.finish();
  EXPECT_EQ(checks.stats().sequences_run, 2);
  EXPECT_EQ(checks.stats().positions_restored, 12);
  EXPECT_TRUE(logits_a.passed) << logits_a.detail;
  EXPECT_TRUE(logits_b.passed) << logits_b.detail;
  EXPECT_EQ(logits_a.count, static_cast<int64_t>(a.size()));
  EXPECT_EQ(logits_b.count, static_cast<int64_t>(b.size() - 12));
}

// The CPU backend keeps f16 pools (and bf16, fp8: CudaEmu.GivesTheCpuBackendsBitsForEveryKvDtype):
// verify passes at f16's tolerance; an f64 pool is refused, naming kv_dtype.
TEST(Verify, CpuBackendRunsHalfPrecisionPoolsAndRefusesF64) {
  VerifyOptions o;
  o.kv_dtype = DType::kF16;
  o.modes = {PreemptionMode::kRecompute};
  auto r = run_verify(tiny(), *builtin_workload("short-chat", 512, 1), o);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->passed()) << r->table();
  o.kv_dtype = DType::kF64;
  auto f64 = run_verify(tiny(), mixed(), o);
  ASSERT_FALSE(f64.is_ok());
  EXPECT_NE(f64.status().message().find("kv_dtype"), std::string::npos) << f64.status().message();
}

TEST(Verify, UnknownOrAbsentBackendIsAnError) {
  VerifyOptions o;
  // Where cuda cannot run (no device or driver, or a build without CUDA), verify says why.
  if (const Status device = cuda_device_status(); !device) {
    o.backend = BackendKind::kCuda;
    auto absent = run_verify(tiny(), mixed(), o);
    ASSERT_FALSE(absent.is_ok());
    EXPECT_NE(absent.status().message().find(device.message()), std::string::npos) << absent.status().message();
  }
  // A name that is not a backend is refused where names become kinds, naming the ones there are.
  auto unknown = parse_backend_kind("tpu");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().message(), "unknown backend 'tpu' (cpu, cuda-emu, cuda)");
  for (const BackendKind k : kBackendKinds) EXPECT_EQ(parse_backend_kind(backend_name(k)).value(), k);
}

// A workload whose only request is rejected verifies nothing: the verdict must say so and
// fail, unless empty runs are explicitly allowed.
TEST(Verify, NothingVerifiedFailsUnlessAllowed) {
  WorkloadRequest too_long;
  too_long.spec.prompt.assign(600, 1);  // beyond max_model_len 512
  too_long.spec.max_tokens = 4;
  const Workload w{"rejected", {too_long}};
  VerifyOptions o;
  auto report = run_verify(tiny(), w, o);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_FALSE(report->passed()) << report->table();
  ASSERT_FALSE(report->nothing_verified.empty());
  EXPECT_NE(report->table().find("nothing verified for: "), std::string::npos) << report->table();
  EXPECT_NE(report->to_junit().find("nothing verified for"), std::string::npos);
  EXPECT_FALSE(report->to_json()["nothing_verified"].empty());
  o.allow_empty = true;
  auto allowed = run_verify(tiny(), w, o);
  ASSERT_TRUE(allowed.is_ok());
  EXPECT_TRUE(allowed->passed()) << allowed->table();
}

// Only sampled requests, no cancellation: the greedy and cancellation checks do not apply,
// so their zero counts are not "nothing verified".
TEST(Verify, ChecksThatDoNotApplyAreNotVacuous) {
  Workload w = mixed();
  for (WorkloadRequest& r : w.requests) {
    r.spec.sampling.temperature = 0.9f;
    r.cancel_step.reset();
  }
  VerifyReport r;
  expect_passes(tiny(), w, VerifyOptions{}, &r);
  EXPECT_TRUE(r.nothing_verified.empty());
  for (const CheckResult& c : r.checks) {
    if (c.name.rfind("greedy-tokens", 0) == 0 || c.name.rfind("cancellation", 0) == 0) {
      EXPECT_FALSE(c.applies) << c.name;
    }
  }
}

// The false alarms of a vacuity rule that counted what the workload could not give: each of
// these correct runs must pass, with the check that had nothing to see marked n/a and why.
TEST(Vacuity, CancelAfterItsRequestFinishedIsCheckedAsANoOp) {
  WorkloadRequest r;
  r.spec.prompt = {5, 6, 7, 8};
  r.spec.max_tokens = 3;
  r.cancel_step = 8;  // after it finished (step 3 or so), while another request keeps the run going
  WorkloadRequest other = r;
  other.cancel_step.reset();
  other.arrival_step = 10;
  VerifyReport report;
  expect_passes(tiny(), Workload{"late-cancel", {r, other}}, VerifyOptions{}, &report);
  const CheckResult& c = check_named(report, "cancellation[recompute]");
  EXPECT_TRUE(c.applies);
  EXPECT_EQ(c.count, 1);
  EXPECT_NE(c.detail.find("no cancel took effect: 1 arrived after its request finished"), std::string::npos)
      << c.detail;
  EXPECT_TRUE(report.nothing_verified.empty()) << report.table();
}

TEST(Vacuity, EveryRequestCancelledStillChecksTheirComputedPositions) {
  Workload w = mixed();
  for (WorkloadRequest& r : w.requests) r.cancel_step = r.arrival_step + 2;
  VerifyReport report;
  expect_passes(tiny(), w, VerifyOptions{}, &report);
  const CheckResult& logits = check_named(report, "logits-vs-reference[recompute]");
  EXPECT_GT(logits.count, 0);
  const CheckResult& iso = check_named(report, "non-interference[recompute]");
  EXPECT_FALSE(iso.applies);
  EXPECT_NE(iso.detail.find("no request finished normally"), std::string::npos) << iso.detail;
  EXPECT_NE(report.table().find("n/a"), std::string::npos);
}

TEST(Vacuity, SampledRequestsUnderSpeculationGetTheDeterminismCheck) {
  Workload w = mixed();
  for (WorkloadRequest& r : w.requests) {
    r.spec.sampling.temperature = 0.9f;
    r.spec.sampling.seed = 7;
  }
  VerifyOptions o;
  o.speculation.proposer = ProposerKind::kNgram;
  o.speculation.k = 3;
  o.modes = {PreemptionMode::kRecompute};
  VerifyReport report;
  expect_passes(tiny(), w, o, &report);
  EXPECT_FALSE(check_named(report, "non-interference[recompute]").applies);
  const CheckResult& det = check_named(report, "determinism[recompute]");
  EXPECT_TRUE(det.applies);
  EXPECT_GT(det.count, 0);
  EXPECT_TRUE(report.nothing_verified.empty()) << report.table();
}

// The isolation audit on its default multi-tenant workload: every check passes and covers
// something (the backend's own tenant-scope check saw every block read).
TEST(Audit, MultiTenantWorkloadPassesEveryIsolationCheck) {
  auto report = run_audit(tiny(), *builtin_workload("multi-tenant", 512, 0), AuditOptions{});
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_TRUE(report->passed()) << report->summary();
  for (const CheckResult& c : report->checks) EXPECT_GT(c.count, 0) << c.name;
  EXPECT_EQ(report->tenants, 3);
  EXPECT_GT(report->prefix_hit_tokens, 0);
  EXPECT_GT(report->block_reuses, 0);
  EXPECT_EQ(report->checks[2].name, "backend-read-scope");
  EXPECT_EQ(report->checks[2].count, report->block_reads);
}

// Both halves of isolation: the multi-tenant shape shows reuse within every tenant and
// identical prefixes across tenants that were not shared; a disabled prefix cache would pass
// "no cross-tenant sharing" too, so without reuse the evidence is vacuous and fails.
TEST(Audit, IsolationEvidenceShowsBothHalvesOnTheMultiTenantShape) {
  auto report = run_audit(tiny(), *builtin_workload("multi-tenant", 512, 0), AuditOptions{});
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_TRUE(report->passed()) << report->summary();
  EXPECT_EQ(report->reuses_within_tenant.size(), 3u) << report->summary();
  for (const auto& [tenant, n] : report->reuses_within_tenant) EXPECT_GT(n, 0) << "tenant " << tenant;
  EXPECT_EQ(report->tenant_pairs.size(), 3u) << report->summary();
  for (const auto& [pair, e] : report->tenant_pairs) {
    EXPECT_GT(e.identical_prefix_requests, 0) << pair.first << "," << pair.second;
    EXPECT_EQ(e.shared_blocks, 0) << pair.first << "," << pair.second;
  }
  EXPECT_NE(report->summary().find("tenants 0 and 1:"), std::string::npos) << report->summary();
}

// A hybrid model audits as KV-cache groups (tiny-gemma3: 6 groups of 1 layer, 5 windowed),
// its stream carrying group_idx. A prefix hit logs a windowed group's entries before its
// window as shares of block -1: the evidence must not count them as blocks of any tenant
// (counted as tenant 0's, they showed 5 blocks shared between tenants 0 and 2, and the
// evidence check failed on them).
TEST(Audit, AHybridModelAuditsAsKvCacheGroups) {
  const Model gemma3 = *make_preset("tiny-gemma3");
  auto report = run_audit(gemma3, *builtin_workload("multi-tenant", gemma3.config.vocab_size, 0), AuditOptions{});
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_TRUE(report->passed()) << report->summary();
  EXPECT_GT(report->prefix_hit_tokens, 0);
  EXPECT_EQ(report->tenant_pairs.size(), 3u) << report->summary();
  for (const auto& [pair, e] : report->tenant_pairs) EXPECT_EQ(e.shared_blocks, 0) << pair.first << "," << pair.second;
  EXPECT_NE(report->summary().find("as in the event log, in 6 KV-cache groups"), std::string::npos)
      << report->summary();
}

TEST(Audit, NoReuseWithinATenantIsVacuousUnlessAllowed) {
  AuditOptions a;
  a.engine.prefix_caching = false;
  auto report = run_audit(tiny(), *builtin_workload("multi-tenant", 512, 0), a);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_FALSE(report->passed()) << report->summary();
  EXPECT_NE(report->summary().find("isolation not demonstrated: the cache never reused a block within a tenant"),
            std::string::npos)
      << report->summary();
  a.allow_empty = true;
  auto allowed = run_audit(tiny(), *builtin_workload("multi-tenant", 512, 0), a);
  ASSERT_TRUE(allowed.is_ok());
  EXPECT_TRUE(allowed->passed()) << allowed->summary();
}

TEST(Audit, GlobalSharingShowsBlocksSharedAcrossTenants) {
  AuditOptions a;
  a.engine.global_prefix_sharing = true;
  auto report = run_audit(tiny(), *builtin_workload("multi-tenant", 512, 0), a);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_TRUE(report->passed()) << report->summary();
  int64_t shared = 0;
  for (const auto& [pair, e] : report->tenant_pairs) shared += e.shared_blocks;
  EXPECT_GT(shared, 0) << report->summary();
}

}  // namespace
}  // namespace kvp::verify
