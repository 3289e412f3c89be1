// The backend conformance suite: what every Backend must do, written once and run for each
// backend factory (instantiations at the end of this file; a new backend joins with one
// line). Against the reference oracle (teacher-forced logits at every position) and against
// itself across schedules (N1: bitwise equality whatever the block size, block ids,
// chunking, batch composition and thread count), its memory ops in plan order (swap,
// copy-on-write, poison), NaN for stale or unwritten reads, the audit-mode read scope, and
// its refusal of malformed plans before anything runs. Only Backend's interface is used.
#include "tests/backend_conformance.h"

#include "optimized/backends/cpu_backend.h"
#include "optimized/backends/cuda_backend.h"
#include "optimized/backends/plan_validation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/dtype.h"
#include "common/rng.h"
#include "kernels/kv_index.h"
#include "model/presets.h"
#include "reference/reference_model.h"

#include "kernels/cuda/model_kernels.h"  // the flavour's namespace: dev with KVP_CUDA_DEVICE_FLAVOUR
#if !defined(KVP_CUDA_DEVICE_FLAVOUR)
#include "kernels/simt/runtime.h"
#endif

namespace kvp {
namespace {

using testing::BackendConformance;
using testing::BackendFactory;
using testing::BackendParams;

using Logits = std::vector<float>;  // [positions, vocab] row-major

const Model& tiny() {
  static const Model m = *make_preset("tiny", 0);
  return m;
}

std::vector<int32_t> tokens_for(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  return t;
}

// `count` distinct block ids of [0, num_blocks) in a seeded random order (non-contiguous,
// non-monotonic), skipping `exclude`.
std::vector<int32_t> scrambled_table(int64_t count, int32_t num_blocks, uint64_t seed,
                                     const std::vector<int32_t>& exclude = {}) {
  std::vector<int32_t> ids;
  for (int32_t b = 0; b < num_blocks; ++b)
    if (std::find(exclude.begin(), exclude.end(), b) == exclude.end()) ids.push_back(b);
  Rng rng(seed);
  for (std::size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.below(i)]);
  EXPECT_GE(static_cast<int64_t>(ids.size()), count);
  ids.resize(static_cast<std::size_t>(count));
  return ids;
}

// ---- plans built by hand, with kernels/kv_index.h's slot formula ----

// One sequence's part of a plan: its new tokens, the position of the first, its block table.
struct SeqChunk {
  std::vector<int32_t> table;
  std::vector<int32_t> tokens;
  int32_t first_position = 0;
  bool needs_logits = true;
  bool logits_all = true;
};

BatchPlan make_plan(const std::vector<SeqChunk>& seqs, int32_t block_size, KvPlanOps ops = {}) {
  BatchPlan p;
  p.query_start.push_back(0);
  for (const SeqChunk& s : seqs)
    p.max_blocks_per_seq = std::max(p.max_blocks_per_seq, static_cast<int32_t>(s.table.size()));
  int64_t id = 0;
  for (const SeqChunk& s : seqs) {
    p.seq_ids.push_back(id++);
    const auto n = static_cast<int32_t>(s.tokens.size());
    p.query_start.push_back(p.query_start.back() + n);
    p.context_lens.push_back(s.first_position + n);
    std::vector<int32_t> row = s.table;
    row.resize(static_cast<std::size_t>(p.max_blocks_per_seq), -1);
    p.block_tables.insert(p.block_tables.end(), row.begin(), row.end());
    p.needs_logits.push_back(s.needs_logits);
    p.logits_all.push_back(s.logits_all);
    for (int32_t k = 0; k < n; ++k) {
      const int32_t pos = s.first_position + k;
      p.token_ids.push_back(s.tokens[static_cast<std::size_t>(k)]);
      p.positions.push_back(pos);
      p.slot_mapping.push_back(kernels::slot_of(s.table.data(), pos, block_size));
    }
  }
  p.ops = std::move(ops);
  return p;
}

// Rows of sequence i in `out`, appended to `dst`.
void append_rows(const StepOutput& out, int64_t i, Logits& dst) {
  const auto begin = out.logit_row_start[static_cast<std::size_t>(i)];
  const auto end = out.logit_row_start[static_cast<std::size_t>(i) + 1];
  dst.insert(dst.end(), out.row(begin), out.row(begin) + (end - begin) * out.vocab_size);
}

// A sequence in a multi-step schedule: its tokens, fed in chunks of the given sizes (one
// per step from start_step on), through its block table.
struct SeqSchedule {
  std::vector<int32_t> tokens;
  std::vector<int> chunks;
  std::vector<int32_t> table;
  int start_step = 0;
};

// Runs every sequence's chunks, batching whatever is due at each step in the order given,
// and returns each sequence's logits at every position.
std::vector<Logits> run_schedule(Backend& backend, const std::vector<SeqSchedule>& seqs) {
  std::vector<Logits> logits(seqs.size());
  std::vector<std::size_t> next_chunk(seqs.size(), 0);
  std::vector<int32_t> done(seqs.size(), 0);
  for (int step = 0;; ++step) {
    std::vector<SeqChunk> batch;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      if (step < seqs[i].start_step || next_chunk[i] == seqs[i].chunks.size()) continue;
      const int n = seqs[i].chunks[next_chunk[i]++];
      SeqChunk c;
      c.table = seqs[i].table;
      c.table.resize(
          static_cast<std::size_t>(kernels::blocks_for_tokens(done[i] + n, backend.pool_shape().block_size)));
      c.tokens.assign(seqs[i].tokens.begin() + done[i], seqs[i].tokens.begin() + done[i] + n);
      c.first_position = done[i];
      done[i] += n;
      batch.push_back(c);
      who.push_back(i);
    }
    if (batch.empty()) {
      bool all_done = true;
      for (std::size_t i = 0; i < seqs.size(); ++i) all_done = all_done && next_chunk[i] == seqs[i].chunks.size();
      if (all_done) break;
      continue;
    }
    StepOutput out;
    const Status st = backend.execute(make_plan(batch, backend.pool_shape().block_size), out);
    EXPECT_TRUE(st.is_ok()) << st.message();
    if (!st.is_ok()) return logits;
    for (std::size_t k = 0; k < who.size(); ++k) append_rows(out, static_cast<int64_t>(k), logits[who[k]]);
  }
  return logits;
}

std::vector<int> chunks_of(int total, std::vector<int> sizes) {
  std::vector<int> out;
  std::size_t k = 0;
  while (total > 0) {
    const int n = std::min(total, sizes[std::min(k++, sizes.size() - 1)]);
    out.push_back(n);
    total -= n;
  }
  return out;
}

Logits run_one(Backend& backend, const std::vector<int32_t>& tokens, const std::vector<int32_t>& table,
               std::vector<int> chunk_sizes) {
  return run_schedule(backend, {{tokens, chunks_of(static_cast<int>(tokens.size()), chunk_sizes), table, 0}})[0];
}

// The K (value = false) or V of one slot of one layer: [num_kv_heads * head_dim] floats.
std::vector<float> kv_at(const Backend& b, PoolKind pool, bool value, int64_t layer, int64_t slot) {
  const KvPoolShape& shape = b.pool_shape();
  const int64_t width = static_cast<int64_t>(shape.num_kv_heads) * shape.head_dim;
  std::vector<float> k, v;
  const Status st = b.read_block(pool, layer, static_cast<int32_t>(slot / shape.block_size), k, v);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!st.is_ok()) return std::vector<float>(static_cast<std::size_t>(width), 0.0f);
  const std::vector<float>& src = value ? v : k;
  const auto off = static_cast<std::ptrdiff_t>((slot % shape.block_size) * width);
  return {src.begin() + off, src.begin() + off + width};
}

// The K (or V) of a whole block of one layer.
std::vector<float> block_kv(const Backend& b, PoolKind pool, bool value, int64_t layer, int32_t block) {
  std::vector<float> k, v;
  const Status st = b.read_block(pool, layer, block, k, v);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return value ? v : k;
}

bool bitwise_equal(const Logits& a, const Logits& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Worst |a - r| / max|r_row| over all rows; the reference's fp32-vs-fp64 bound is 2e-5.
template <typename T>
double worst_relative_error(const Logits& a, const ref::Matrix<T>& r) {
  EXPECT_EQ(static_cast<int64_t>(a.size()), r.rows() * r.cols());
  double worst = 0;
  for (Eigen::Index row = 0; row < r.rows(); ++row) {
    double scale = 0, err = 0;
    for (Eigen::Index j = 0; j < r.cols(); ++j) {
      const double ref = static_cast<double>(r(row, j));
      scale = std::max(scale, std::abs(ref));
      const double diff = std::abs(static_cast<double>(a[static_cast<std::size_t>(row * r.cols() + j)]) - ref);
      err = std::isnan(diff) ? INFINITY : std::max(err, diff);
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

template <typename T>
ref::Matrix<T> reference_logits(const Model& m, const std::vector<int32_t>& tokens) {
  const ReferenceModel<T> model(m);
  auto cache = model.make_cache(static_cast<int64_t>(tokens.size()));
  auto r = model.forward(tokens, cache);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return *r;
}

constexpr double kFp32Bound = 2e-5;  // tests/reference_model_test.cc: measured fp32-vs-fp64 bound

// ---- against the reference ----

TEST_P(BackendConformance, MatchesReferenceThroughScrambledBlockTable) {
  const auto tokens = tokens_for(40, tiny().config.vocab_size, 1);
  const auto table = scrambled_table(10, 32, 7);  // 40 positions / block size 4
  const auto r64 = reference_logits<double>(tiny(), tokens);
  const auto r32 = reference_logits<float>(tiny(), tokens);
  // The default partition (one partition here) and a small one (five partitions, merged).
  for (int64_t partition : {kernels::kDefaultAttentionPartition, int64_t{8}}) {
    const auto backend_owned = make_backend(tiny(), 32, 4, 1, partition);
    Backend& backend = *backend_owned;
    const Logits got = run_one(backend, tokens, table, {40});
    const double e64 = worst_relative_error(got, r64);
    const double e32 = worst_relative_error(got, r32);
    std::printf("partition %lld: max rel error vs fp64 %.3g, vs fp32 %.3g\n", static_cast<long long>(partition), e64,
                e32);
    EXPECT_LE(e64, kFp32Bound) << "partition " << partition;
    EXPECT_LE(e32, kFp32Bound) << "partition " << partition;
  }
}

// 300 positions cross two boundaries of the default 128-position partition.
TEST_P(BackendConformance, LongContextAcrossPartitionsMatchesReference) {
  const auto tokens = tokens_for(300, tiny().config.vocab_size, 2);
  const auto backend_owned = make_backend(tiny(), 40, 16);
  Backend& backend = *backend_owned;
  const Logits got = run_one(backend, tokens, scrambled_table(19, 40, 3), {100, 150, 50});
  EXPECT_LE(worst_relative_error(got, reference_logits<double>(tiny(), tokens)), kFp32Bound);
}

// GQA is tiny's 8 heads over 2 KV heads; here the two ends: MQA (1 KV head) and MHA.
TEST_P(BackendConformance, MultiQueryAndMultiHeadConfigsMatchReference) {
  for (int64_t kv_heads : {int64_t{1}, int64_t{8}}) {
    ModelConfig c = tiny().config;
    c.num_layers = 2;
    c.num_kv_heads = kv_heads;
    const Model m = make_random_model(c, 11);
    const auto tokens = tokens_for(30, c.vocab_size, 4);
    const auto backend_owned = make_backend(m, 16, 3, 2, 8);
    Backend& backend = *backend_owned;
    const Logits got = run_one(backend, tokens, scrambled_table(10, 16, 5), {12, 1, 17});
    EXPECT_LE(worst_relative_error(got, reference_logits<double>(m, tokens)), kFp32Bound) << "kv_heads " << kv_heads;
  }
}

// The K/V of position p sit in slot_of(table, p): compared with the reference's dense cache.
TEST_P(BackendConformance, WritesKeysAndValuesIntoTheSlotsOfTheBlockTable) {
  const Model& m = tiny();
  const auto tokens = tokens_for(13, m.config.vocab_size, 6);
  const auto table = scrambled_table(5, 12, 8);
  const auto backend_owned = make_backend(m, 12, 3);
  Backend& backend = *backend_owned;
  run_one(backend, tokens, table, {13});
  const ReferenceModel<double> model(m);
  auto cache = model.make_cache(13);
  ASSERT_TRUE(model.forward(tokens, cache).is_ok());
  const int64_t d = m.config.head_dim;
  for (int64_t l = 0; l < m.config.num_layers; ++l) {
    for (int64_t p = 0; p < 13; ++p) {
      const int64_t slot = kernels::slot_of(table.data(), p, 3);
      for (int64_t h = 0; h < m.config.num_kv_heads; ++h) {
        for (int64_t i = 0; i < d; ++i) {
          EXPECT_NEAR(kv_at(backend, PoolKind::kDevice, false, l, slot)[h * d + i], cache.keys(l, h)(p, i), 1e-4)
              << l << " " << p;
          EXPECT_NEAR(kv_at(backend, PoolKind::kDevice, true, l, slot)[h * d + i], cache.values(l, h)(p, i), 1e-4)
              << l << " " << p;
        }
      }
    }
  }
}

// ---- N1: the engine against itself, bitwise ----

TEST_P(BackendConformance, ChunkedPrefillAndDecodeAreBitwiseEqualToOneChunk) {
  const auto tokens = tokens_for(70, tiny().config.vocab_size, 9);
  const auto table = scrambled_table(18, 24, 10);
  const auto a_owned = make_backend(tiny(), 24, 4, 1, 16);
  Backend& a = *a_owned;
  const auto b_owned = make_backend(tiny(), 24, 4, 1, 16);
  Backend& b = *b_owned;
  const auto c_owned = make_backend(tiny(), 24, 4, 1, 16);
  Backend& c = *c_owned;
  const Logits whole = run_one(a, tokens, table, {70});
  const Logits chunked = run_one(b, tokens, table, {13, 29, 1, 27});
  const Logits decode = run_one(c, tokens, table, {1});
  EXPECT_TRUE(bitwise_equal(whole, chunked));
  EXPECT_TRUE(bitwise_equal(whole, decode));
}

TEST_P(BackendConformance, BlockSizeDoesNotChangeLogitsBitwise) {
  const auto tokens = tokens_for(200, tiny().config.vocab_size, 12);
  Logits first;
  for (int32_t bs : {1, 3, 16}) {
    const auto blocks = kernels::blocks_for_tokens(200, bs);
    const auto pool = static_cast<int32_t>(blocks + 5);
    const auto backend_owned = make_backend(tiny(), pool, bs, 2);
    Backend& backend = *backend_owned;
    const Logits got = run_one(backend, tokens, scrambled_table(blocks, pool, 13 + static_cast<uint64_t>(bs)), {64});
    if (first.empty()) {
      first = got;
    } else {
      EXPECT_TRUE(bitwise_equal(first, got)) << "block size " << bs;
    }
  }
}

// A target sequence with three others: longer and shorter, prefilling in chunks while the
// target decodes and the other way round, the target in the middle of the batch.
std::vector<SeqSchedule> mixed_batch(const std::vector<int32_t>& target, const std::vector<int32_t>& target_table,
                                     int32_t num_blocks, int32_t block_size) {
  const int64_t vocab = tiny().config.vocab_size;
  std::vector<SeqSchedule> seqs;
  std::vector<int32_t> used = target_table;
  const auto add = [&](int n, std::vector<int> chunk_sizes, int start_step, uint64_t seed) {
    const auto table = scrambled_table(kernels::blocks_for_tokens(n, block_size), num_blocks, seed, used);
    used.insert(used.end(), table.begin(), table.end());
    seqs.push_back({tokens_for(n, vocab, seed), chunks_of(n, chunk_sizes), table, start_step});
  };
  add(90, {50, 40, 1}, 0, 21);  // long prompt in two chunks, then decodes
  add(6, {5, 1}, 1, 22);        // short prompt, then decodes
  seqs.push_back({target, chunks_of(static_cast<int>(target.size()), {30, 1}), target_table, 1});
  add(150, {150, 1}, 3, 23);  // arrives while the target decodes
  return seqs;
}

TEST_P(BackendConformance, BatchCompositionDoesNotChangeLogitsBitwise) {
  const int32_t bs = 4, num_blocks = 120;
  const auto target = tokens_for(40, tiny().config.vocab_size, 20);
  const auto table = scrambled_table(10, num_blocks, 24);
  const auto alone_owned = make_backend(tiny(), num_blocks, bs, 1, 16);
  Backend& alone = *alone_owned;
  const Logits solo = run_one(alone, target, table, {30, 1});
  const auto batched_owned = make_backend(tiny(), num_blocks, bs, 1, 16);
  Backend& batched = *batched_owned;
  const auto logits = run_schedule(batched, mixed_batch(target, table, num_blocks, bs));
  EXPECT_TRUE(bitwise_equal(solo, logits[2]));
  // And under other block ids in another pool.
  const auto elsewhere_owned = make_backend(tiny(), num_blocks, bs, 1, 16);
  Backend& elsewhere = *elsewhere_owned;
  EXPECT_TRUE(bitwise_equal(solo, run_one(elsewhere, target, scrambled_table(10, num_blocks, 25), {40})));
}

TEST_P(BackendConformance, ThreadCountDoesNotChangeLogitsBitwise) {
  const int32_t bs = 4, num_blocks = 120;
  const auto target = tokens_for(40, tiny().config.vocab_size, 30);
  const auto table = scrambled_table(10, num_blocks, 31);
  std::vector<std::vector<Logits>> runs;
  for (int threads : {1, 4, 3}) {
    const auto backend_owned = make_backend(tiny(), num_blocks, bs, threads, 16);
    Backend& backend = *backend_owned;
    runs.push_back(run_schedule(backend, mixed_batch(target, table, num_blocks, bs)));
  }
  for (std::size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (std::size_t s = 0; s < runs[0].size(); ++s)
      EXPECT_TRUE(bitwise_equal(runs[0][s], runs[r][s])) << "run " << r << " sequence " << s;
  }
}

// ---- memory ops ----

// Prefills `tokens` into `table` and returns the logits of one decode of `next` at the end.
Logits decode_after_prefill(Backend& backend, const std::vector<int32_t>& tokens, const std::vector<int32_t>& table,
                            int32_t next) {
  StepOutput out;
  EXPECT_TRUE(backend.execute(make_plan({{table, tokens, 0}}, backend.pool_shape().block_size), out).is_ok());
  SeqChunk d{table, {next}, static_cast<int32_t>(tokens.size())};
  EXPECT_TRUE(backend.execute(make_plan({d}, backend.pool_shape().block_size), out).is_ok());
  return out.logits;
}

bool all_nan(const Logits& l) {
  return !l.empty() && std::all_of(l.begin(), l.end(), [](float v) { return std::isnan(v); });
}

TEST_P(BackendConformance, SwapOutThenInToOtherBlocksKeepsNextDecodeBitwise) {
  const int32_t bs = 4;
  const auto tokens = tokens_for(37, tiny().config.vocab_size, 40);
  const std::vector<int32_t> t1 = scrambled_table(10, 24, 41);
  const std::vector<int32_t> t2 = scrambled_table(10, 24, 42, t1);  // disjoint from t1
  const auto plain_owned = make_backend(tiny(), 24, bs, 1, 16);
  Backend& plain = *plain_owned;
  const Logits expected = decode_after_prefill(plain, tokens, t1, 5);

  for (bool one_step : {true, false}) {
    const auto backend_owned = make_backend(tiny(), 24, bs, 1, 16, /*host_blocks=*/12);
    Backend& backend = *backend_owned;
    StepOutput out;
    ASSERT_TRUE(backend.execute(make_plan({{t1, tokens, 0}}, bs), out).is_ok());
    KvPlanOps out_ops, in_ops;
    for (std::size_t j = 0; j < t1.size(); ++j) {
      out_ops.swap_out.push_back({t1[j], static_cast<int32_t>(11 - j)});
      out_ops.poison.push_back(t1[j]);  // the device copy is gone: the data must come from the host
      in_ops.swap_in.push_back({static_cast<int32_t>(11 - j), t2[j]});
    }
    const SeqChunk decode{t2, {5}, 37};
    if (one_step) {
      KvPlanOps all = out_ops;
      all.swap_in = in_ops.swap_in;
      ASSERT_TRUE(backend.execute(make_plan({decode}, bs, all), out).is_ok());
    } else {
      ASSERT_TRUE(backend.execute(make_plan({}, bs, out_ops), out).is_ok());  // a step of ops only
      EXPECT_TRUE(out.logits.empty());
      ASSERT_TRUE(backend.execute(make_plan({decode}, bs, in_ops), out).is_ok());
    }
    EXPECT_TRUE(bitwise_equal(expected, out.logits)) << "one step " << one_step;
  }
}

// plan_ops.h's order: swap_out, block_copies, poison, swap_in. Block 2 is read by the
// swap-out and the copy before it is poisoned, then refilled by the swap-in.
TEST_P(BackendConformance, RunsOpsInPlanOrder) {
  const int32_t bs = 4;
  const auto backend_owned = make_backend(tiny(), 8, bs, 1, kernels::kDefaultAttentionPartition, 2);
  Backend& backend = *backend_owned;
  StepOutput out;
  ASSERT_TRUE(backend.execute(make_plan({{{2}, tokens_for(4, tiny().config.vocab_size, 55), 0}}, bs), out).is_ok());
  const int64_t layer = tiny().config.num_layers - 1;
  const auto block_values = [&](PoolKind pool, bool value, int32_t block) {
    return block_kv(backend, pool, value, layer, block);
  };
  const std::vector<float> keys = block_values(PoolKind::kDevice, false, 2);
  const std::vector<float> values = block_values(PoolKind::kDevice, true, 2);
  ASSERT_TRUE(std::none_of(keys.begin(), keys.end(), [](float v) { return std::isnan(v); }));
  KvPlanOps ops;
  ops.swap_out = {{2, 1}};
  ops.block_copies = {{2, 6}};
  ops.poison = {2};
  ops.swap_in = {{1, 2}};
  ASSERT_TRUE(backend.execute(make_plan({}, bs, ops), out).is_ok());
  EXPECT_EQ(block_values(PoolKind::kHost, false, 1), keys);
  EXPECT_EQ(block_values(PoolKind::kHost, true, 1), values);
  EXPECT_EQ(block_values(PoolKind::kDevice, false, 6), keys);
  EXPECT_EQ(block_values(PoolKind::kDevice, true, 6), values);
  EXPECT_EQ(block_values(PoolKind::kDevice, false, 2), keys);
  EXPECT_EQ(block_values(PoolKind::kDevice, true, 2), values);
}

TEST_P(BackendConformance, BlockCopyGivesAPrivateCopyWithTheSameLogits) {
  const int32_t bs = 4;
  const auto tokens = tokens_for(10, tiny().config.vocab_size, 50);
  const std::vector<int32_t> table = {6, 1, 3};  // block 3 holds positions 8, 9
  const auto plain_owned = make_backend(tiny(), 8, bs);
  Backend& plain = *plain_owned;
  const Logits expected = decode_after_prefill(plain, tokens, table, 7);

  const auto backend_owned = make_backend(tiny(), 8, bs);
  Backend& backend = *backend_owned;
  StepOutput out;
  ASSERT_TRUE(backend.execute(make_plan({{table, tokens, 0}}, bs), out).is_ok());
  KvPlanOps ops;
  ops.block_copies.push_back({3, 5});
  ASSERT_TRUE(backend.execute(make_plan({{{6, 1, 5}, {7}, 10}}, bs, ops), out).is_ok());
  EXPECT_TRUE(bitwise_equal(expected, out.logits));
  // The decode wrote slot 2 of the copy only; the shared original is untouched there.
  EXPECT_FALSE(std::isnan(kv_at(backend, PoolKind::kDevice, false, 0, kernels::slot_of_block(5, 2, bs))[0]));
  EXPECT_TRUE(std::isnan(kv_at(backend, PoolKind::kDevice, false, 0, kernels::slot_of_block(3, 2, bs))[0]));
}

TEST_P(BackendConformance, PoisonedBlockYieldsNanLogitsWhenRead) {
  const int32_t bs = 4;
  const auto tokens = tokens_for(12, tiny().config.vocab_size, 60);
  const std::vector<int32_t> table = {2, 0, 4, 7};
  const auto backend_owned = make_backend(tiny(), 8, bs);
  Backend& backend = *backend_owned;
  StepOutput out;
  ASSERT_TRUE(backend.execute(make_plan({{table, tokens, 0}}, bs), out).is_ok());
  ASSERT_FALSE(all_nan(out.logits));

  // Poisoning a block the sequence does not read changes nothing.
  const auto twin_owned = make_backend(tiny(), 8, bs);
  Backend& twin = *twin_owned;
  const Logits expected = decode_after_prefill(twin, tokens, table, 3);
  KvPlanOps unrelated;
  unrelated.poison = {5};
  ASSERT_TRUE(backend.execute(make_plan({{table, {3}, 12}}, bs, unrelated), out).is_ok());
  EXPECT_TRUE(bitwise_equal(expected, out.logits));

  KvPlanOps ops;
  ops.poison = {0};
  ASSERT_TRUE(backend.execute(make_plan({{table, {9}, 13}}, bs, ops), out).is_ok());
  EXPECT_TRUE(all_nan(out.logits));
  for (int64_t l = 0; l < tiny().config.num_layers; ++l) {
    for (int64_t off = 0; off < bs; ++off) {
      const int64_t slot = kernels::slot_of_block(0, off, bs);
      for (int64_t i = 0; i < tiny().config.kv_dim(); ++i) {
        EXPECT_TRUE(std::isnan(kv_at(backend, PoolKind::kDevice, false, l, slot)[i]));
        EXPECT_TRUE(std::isnan(kv_at(backend, PoolKind::kDevice, true, l, slot)[i]));
      }
    }
  }
}

// A context position that no one wrote (the pool starts as NaN) shows up as NaN (I7).
// Audit mode: a plan that carries the tenant scope of every block is refused, before
// anything runs, when a sequence would read a block another tenant holds.
TEST_P(BackendConformance, AuditModeRefusesReadsOfAnotherTenantsBlocks) {
  const int32_t bs = 4;
  const auto tokens = tokens_for(10, tiny().config.vocab_size, 61);
  const std::vector<int32_t> table = {6, 1, 3};
  const auto backend_owned = make_backend(tiny(), 8, bs);
  Backend& backend = *backend_owned;
  StepOutput out;
  BatchPlan plan = make_plan({{table, tokens, 0}}, bs);
  plan.seq_tenants = {7};
  plan.block_tenants.assign(8, -1);
  for (int32_t b : table) plan.block_tenants[static_cast<std::size_t>(b)] = 7;
  ASSERT_TRUE(backend.execute(plan, out).is_ok());
  EXPECT_EQ(backend.audited_block_reads(), 3);

  BatchPlan next = make_plan({{table, {5}, 10}}, bs);
  next.seq_tenants = {7};
  next.block_tenants = plan.block_tenants;
  next.block_tenants[1] = 8;  // block-table index 1 now belongs to tenant 8
  const Status refused = backend.execute(next, out);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("would read block 1 (block-table index 1), held by tenant 8"), std::string::npos)
      << refused.message();
  next.block_tenants[1] = -1;  // or by no one at all
  EXPECT_FALSE(backend.execute(next, out).is_ok());
  EXPECT_EQ(backend.audited_block_reads(), 3);  // refused plans read nothing
}

TEST_P(BackendConformance, ReadOfAnUnwrittenSlotYieldsNanLogits) {
  const int32_t bs = 4;
  const auto backend_owned = make_backend(tiny(), 8, bs);
  Backend& backend = *backend_owned;
  StepOutput out;
  // Positions 0..5 were never computed; the plan claims a context of 7.
  ASSERT_TRUE(backend.execute(make_plan({{{1, 3}, {42}, 6}}, bs), out).is_ok());
  EXPECT_TRUE(all_nan(out.logits));
}

// ---- logits rows and malformed plans ----

TEST_P(BackendConformance, ReturnsTheLogitRowsThePlanAsksFor) {
  const int32_t bs = 4;
  const auto a = tokens_for(9, tiny().config.vocab_size, 70);
  const auto b = tokens_for(5, tiny().config.vocab_size, 71);
  const auto c = tokens_for(3, tiny().config.vocab_size, 72);
  const auto backend_owned = make_backend(tiny(), 16, bs);
  Backend& backend = *backend_owned;
  SeqChunk sa{{0, 1, 2}, a, 0, true, false};  // last row only
  SeqChunk sb{{3, 4}, b, 0, false, false};    // a prefill chunk that is not the last: none
  SeqChunk sc{{5}, c, 0, true, true};         // every row
  StepOutput out;
  ASSERT_TRUE(backend.execute(make_plan({sa, sb, sc}, bs), out).is_ok());
  EXPECT_EQ(out.vocab_size, tiny().config.vocab_size);
  EXPECT_EQ(out.logit_row_start, (std::vector<int32_t>{0, 1, 1, 4}));
  ASSERT_EQ(out.logits.size(), static_cast<std::size_t>(4 * out.vocab_size));
  const auto alone_owned = make_backend(tiny(), 16, bs);
  Backend& alone = *alone_owned;
  const Logits full = run_one(alone, a, {0, 1, 2}, {9});
  EXPECT_TRUE(bitwise_equal(Logits(out.row(0), out.row(1)), Logits(full.end() - out.vocab_size, full.end())));
}

TEST_P(BackendConformance, RejectsMalformedPlansWithoutChangingAnything) {
  const int32_t bs = 4;
  const auto backend_owned = make_backend(tiny(), 8, bs, 1, kernels::kDefaultAttentionPartition, 2);
  Backend& backend = *backend_owned;
  const BatchPlan good = make_plan({{{3, 6}, tokens_for(6, tiny().config.vocab_size, 80), 0}}, bs);
  // Each case breaks one rule of validate_plan and nothing else, and must be refused for
  // that rule's reason: a rule whose cases another rule also caught could be dropped unseen.
  struct Case {
    const char* what;
    void (*mutate)(BatchPlan&);
    const char* reason;  // a fragment of that rule's message, and of no other's
  };
  const Case cases[] = {
      {"block id past the pool", [](BatchPlan& p) { p.block_tables[1] = 8; },
       "block table entry 1: block 8 is outside the device pool"},
      {"negative block id in use", [](BatchPlan& p) { p.block_tables[0] = -1; },
       "block table entry 0: block -1 is outside the device pool"},
      {"slot past the pool", [](BatchPlan& p) { p.slot_mapping[2] = 32; }, "slot_mapping[2] = 32 is outside"},
      {"slot below -1", [](BatchPlan& p) { p.slot_mapping[2] = -2; }, "slot_mapping[2] = -2 is outside"},
      {"positions shorter than tokens", [](BatchPlan& p) { p.positions.pop_back(); }, "positions must have num_tokens"},
      {"slot_mapping longer than tokens", [](BatchPlan& p) { p.slot_mapping.push_back(0); },
       "slot_mapping must have num_groups * num_tokens"},
      {"KV-cache groups the backend does not have", [](BatchPlan& p) { p.num_groups = 2; },
       "num_groups is 2, the backend's KV cache has 1 group"},
      {"query_start too short", [](BatchPlan& p) { p.query_start.pop_back(); }, "query_start has 1 entries"},
      {"query_start not starting at 0", [](BatchPlan& p) { p.query_start[0] = 1; }, "query_start[0] must be 0"},
      {"query_start not ending at num_tokens", [](BatchPlan& p) { p.query_start[1] = 5; },
       "query_start[num_seqs] = 5 but the plan has 6 tokens"},
      {"context_lens missing", [](BatchPlan& p) { p.context_lens.clear(); },
       "context_lens, needs_logits and logits_all must each have"},
      {"needs_logits too long", [](BatchPlan& p) { p.needs_logits.push_back(1); },
       "context_lens, needs_logits and logits_all must each have"},
      {"block_tables size", [](BatchPlan& p) { p.block_tables.push_back(0); }, "block_tables has 3 entries"},
      {"negative max_blocks_per_seq",
       [](BatchPlan& p) {
         p.max_blocks_per_seq = -1;
         p.block_tables.clear();
       },
       "max_blocks_per_seq must be >= 0"},
      {"context shorter than the new tokens",
       [](BatchPlan& p) {
         p.context_lens[0] = 5;  // 6 new tokens
       },
       "is shorter than its 6 new tokens"},
      {"context needs more blocks than the table",
       [](BatchPlan& p) {
         p.context_lens[0] = 9;
         for (int t = 0; t < 6; ++t) p.positions[static_cast<std::size_t>(t)] = 3 + t;
       },
       "needs 3 blocks, max_blocks_per_seq is 2"},
      {"positions not the last of the context", [](BatchPlan& p) { p.positions[0] = 1; },
       "positions[0] = 1, expected 0"},
      {"token outside the vocabulary", [](BatchPlan& p) { p.token_ids[0] = 512; },
       "token_ids[0] = 512 is outside the vocabulary"},
      {"negative token", [](BatchPlan& p) { p.token_ids[0] = -3; }, "token_ids[0] = -3 is outside the vocabulary"},
      {"context past max_position_embeddings",
       [](BatchPlan& p) {
         // Positions, table and blocks all consistent with the long context: only the
         // max_position_embeddings rule (2048 for tiny) can refuse it.
         p.context_lens[0] = 4000;
         p.max_blocks_per_seq = 1000;
         p.block_tables.assign(1000, 0);
         for (int t = 0; t < 6; ++t) p.positions[static_cast<std::size_t>(t)] = 4000 - 6 + t;
       },
       "context_len 4000 exceeds max_position_embeddings 2048"},
      {"swap_out to a host block past the pool",
       [](BatchPlan& p) {
         p.ops.swap_out.push_back({0, 2});
       },
       "swap_out destination: block 2 is outside the host pool"},
      {"swap_out from a device block past the pool",
       [](BatchPlan& p) {
         p.ops.swap_out.push_back({8, 0});
       },
       "swap_out source: block 8 is outside the device pool"},
      {"block copy from a block past the pool",
       [](BatchPlan& p) {
         p.ops.block_copies.push_back({9, 0});
       },
       "block copy source: block 9"},
      {"block copy to a block past the pool",
       [](BatchPlan& p) {
         p.ops.block_copies.push_back({0, 9});
       },
       "block copy destination: block 9"},
      {"poison of a negative block", [](BatchPlan& p) { p.ops.poison.push_back(-1); }, "poison: block -1"},
      {"swap_in from a host block past the pool",
       [](BatchPlan& p) {
         p.ops.swap_in.push_back({5, 0});
       },
       "swap_in source: block 5 is outside the host pool"},
      {"swap_in to a device block past the pool",
       [](BatchPlan& p) {
         p.ops.swap_in.push_back({0, 100});
       },
       "swap_in destination: block 100 is outside the device pool"},
  };
  // Written once, so that a rejected plan's ops (poison of block 3) or K/V writes would show.
  StepOutput first;
  ASSERT_TRUE(backend.execute(good, first).is_ok());
  const auto snapshot = [&] {
    std::vector<float> keys;
    for (int32_t block = 0; block < backend.pool_shape().num_device_blocks; ++block) {
      const std::vector<float> k = block_kv(backend, PoolKind::kDevice, false, 0, block);
      keys.insert(keys.end(), k.begin(), k.end());
    }
    return keys;
  };
  const std::vector<float> before = snapshot();
  for (const Case& c : cases) {
    BatchPlan bad = good;
    bad.ops.poison.push_back(3);  // a valid op that must not run when the plan is rejected
    for (int64_t& slot : bad.slot_mapping) slot = (slot + 8) % 32;  // K/V writes that must not happen
    c.mutate(bad);
    StepOutput out;
    out.vocab_size = -7;
    const Status st = backend.execute(bad, out);
    EXPECT_FALSE(st.is_ok()) << c.what;
    if (!st.is_ok()) {
      EXPECT_NE(st.message().find(c.reason), std::string::npos) << c.what << ": " << st.message();
    }
    EXPECT_EQ(out.vocab_size, -7) << c.what;
  }
  const std::vector<float> after = snapshot();
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
  StepOutput again;
  ASSERT_TRUE(backend.execute(good, again).is_ok());
  EXPECT_TRUE(bitwise_equal(first.logits, again.logits));
}

// fp8 pools carry their scales in the pool shape: validate_plan refuses, naming the entry, a
// pool whose scales are missing, short, zero, negative, NaN or infinite, and scales on a pool
// that is not fp8; a cuda-emu backend refuses such a pool at construction.
TEST(PlanValidation, Fp8PoolScalesAreCheckedAtEveryPlan) {
  const int32_t bs = 4;
  const PlanLimits limits{tiny().config.vocab_size, tiny().config.max_position_embeddings, 0, {}};
  const BatchPlan good = make_plan({{{3, 6}, tokens_for(6, tiny().config.vocab_size, 80), 0}}, bs);
  KvPoolShape pool = pool_shape_for(tiny().config, bs, 8, 2, DType::kF8E4M3);
  const auto cells = static_cast<std::size_t>(pool.num_layers * pool.num_kv_heads);
  pool.k_scales.assign(cells, 0.5f);
  pool.v_scales.assign(cells, 2.0f);
  ASSERT_TRUE(validate_plan(good, pool, limits).is_ok());
  EXPECT_EQ(pool.k_scale(1, 1), 0.5f);
  struct Case {
    const char* what;
    std::function<void(KvPoolShape&)> edit;
    const char* reason;
  };
  const Case cases[] = {
      {"no scales", [](KvPoolShape& p) { p.k_scales.clear(); }, "k_scales has 0 entries"},
      {"one short", [](KvPoolShape& p) { p.v_scales.pop_back(); }, "v_scales has"},
      {"zero", [](KvPoolShape& p) { p.k_scales[3] = 0.0f; }, "k_scales[layer 1, kv head 1]"},
      {"negative", [](KvPoolShape& p) { p.v_scales[0] = -1.0f; }, "v_scales[layer 0, kv head 0]"},
      {"NaN", [](KvPoolShape& p) { p.v_scales[1] = std::nanf(""); }, "finite and > 0"},
      {"infinite", [](KvPoolShape& p) { p.k_scales[0] = INFINITY; }, "finite and > 0"},
      {"scales on bf16", [](KvPoolShape& p) { p.kv_dtype = DType::kBF16; }, "KV scales are for fp8 pools"},
  };
  for (const Case& c : cases) {
    KvPoolShape bad = pool;
    c.edit(bad);
    const Status st = validate_plan(good, bad, limits);
    ASSERT_FALSE(st.is_ok()) << c.what;
    EXPECT_NE(st.message().find(c.reason), std::string::npos) << c.what << ": " << st.message();
    CudaBackendConfig bc;
    bc.pool = bad;
    EXPECT_FALSE(make_cuda_backend(CudaFlavour::kEmulated, tiny(), bc).is_ok()) << c.what;
  }
  CudaBackendConfig bc;
  bc.pool = pool;
  EXPECT_TRUE(make_cuda_backend(CudaFlavour::kEmulated, tiny(), bc).is_ok());
}

// Every limit validate_plan enforces, on both sides: its last valid value is accepted, one
// past it refused (the rejection test above breaks each rule; this pins where each starts).
// A sliding window (PlanLimits::window): entries wholly before the window of a sequence's
// first new token may be -1 (released by the engine); from that block on every entry must
// name a block, or the backend refuses the plan before running anything.
TEST(PlanValidation, ReleasedEntriesOnlyBeforeTheFirstNewTokensWindow) {
  const KvPoolShape pool = pool_shape_for(tiny().config, 4, /*num_device_blocks=*/8, /*num_host_blocks=*/2);
  BatchPlan p;
  p.seq_ids = {1};
  p.query_start = {0, 1};
  p.context_lens = {20};  // positions 0..19 in 5 blocks of 4; the new token is position 19
  p.max_blocks_per_seq = 5;
  p.block_tables = {-1, -1, -1, 3, 4};  // window 6: position 19 reads 14..19, blocks 3 and 4
  p.needs_logits = {1};
  p.logits_all = {0};
  p.token_ids = {5};
  p.positions = {19};
  p.slot_mapping = {4 * 4 + 3};
  PlanLimits limits{tiny().config.vocab_size, tiny().config.max_position_embeddings, /*window=*/6, {}};
  EXPECT_TRUE(validate_plan(p, pool, limits).is_ok()) << validate_plan(p, pool, limits).message();
  // Without the window every entry is read.
  limits.window = 0;
  const Status no_window = validate_plan(p, pool, limits);
  EXPECT_NE(no_window.message().find("block table entry 0"), std::string::npos) << no_window.message();
  // Window 7 reads from position 13: block 3 still; window 9 from 11, block 2, released.
  limits.window = 7;
  EXPECT_TRUE(validate_plan(p, pool, limits).is_ok());
  limits.window = 9;
  const Status early = validate_plan(p, pool, limits);
  EXPECT_NE(early.message().find("block table entry 2 (released, but a new token attends to it)"), std::string::npos)
      << early.message();
}

TEST(PlanValidation, EachLimitAcceptsItsLastValueAndRefusesOnePast) {
  const int32_t bs = 4;
  const KvPoolShape pool = pool_shape_for(tiny().config, bs, /*num_device_blocks=*/8, /*num_host_blocks=*/2);
  const PlanLimits limits{tiny().config.vocab_size, tiny().config.max_position_embeddings, 0, {}};
  const BatchPlan good = make_plan({{{3, 6}, tokens_for(6, tiny().config.vocab_size, 80), 0}}, bs);
  ASSERT_TRUE(validate_plan(good, pool, limits).is_ok());
  struct Side {
    const char* what;
    std::function<void(BatchPlan&, int64_t)> set;  // sets the limited value to `v`
    int64_t last;                                  // the last valid value
    bool upper = true;                             // false: `last` is the lowest valid value
  };
  const int64_t max_pos = limits.max_position_embeddings;
  const auto long_context = [](BatchPlan& p, int64_t context) {
    p.context_lens[0] = static_cast<int32_t>(context);
    p.max_blocks_per_seq = static_cast<int32_t>((context + 3) / 4);
    p.block_tables.assign(static_cast<std::size_t>(p.max_blocks_per_seq), 0);
    for (int t = 0; t < 6; ++t) p.positions[static_cast<std::size_t>(t)] = static_cast<int32_t>(context - 6 + t);
  };
  const Side sides[] = {
      {"block id", [](BatchPlan& p, int64_t v) { p.block_tables[1] = static_cast<int32_t>(v); }, 7},
      {"lowest block id", [](BatchPlan& p, int64_t v) { p.block_tables[1] = static_cast<int32_t>(v); }, 0, false},
      {"slot", [](BatchPlan& p, int64_t v) { p.slot_mapping[2] = v; }, 31},
      {"lowest slot (-1: no write)", [](BatchPlan& p, int64_t v) { p.slot_mapping[2] = v; }, -1, false},
      {"token id", [](BatchPlan& p, int64_t v) { p.token_ids[0] = static_cast<int32_t>(v); },
       tiny().config.vocab_size - 1},
      {"lowest token id", [](BatchPlan& p, int64_t v) { p.token_ids[0] = static_cast<int32_t>(v); }, 0, false},
      {"context length", long_context, max_pos},
      {"context length against the table",
       [](BatchPlan& p, int64_t v) {  // 2 blocks of 4 hold 8 positions
         p.context_lens[0] = static_cast<int32_t>(v);
         for (int t = 0; t < 6; ++t) p.positions[static_cast<std::size_t>(t)] = static_cast<int32_t>(v - 6 + t);
       },
       8},
      {"context length against the new tokens",
       [](BatchPlan& p, int64_t v) {  // a context of 6 holds the 6 new tokens
         p.context_lens[0] = static_cast<int32_t>(v);
         for (int t = 0; t < 6; ++t) p.positions[static_cast<std::size_t>(t)] = static_cast<int32_t>(v - 6 + t);
       },
       6, false},
      {"swap_out destination",
       [](BatchPlan& p, int64_t v) {
         p.ops.swap_out.push_back({0, static_cast<int32_t>(v)});
       },
       1},
      {"swap_in source",
       [](BatchPlan& p, int64_t v) {
         p.ops.swap_in.push_back({static_cast<int32_t>(v), 5});
       },
       1},
      {"block copy destination",
       [](BatchPlan& p, int64_t v) {
         p.ops.block_copies.push_back({5, static_cast<int32_t>(v)});
       },
       7},
  };
  // Rules with no numeric limit, each refused for its own reason: a sequence with no new
  // token, and a later new token's position (not only the first's).
  BatchPlan two = make_plan(
      {{{3, 6}, tokens_for(6, tiny().config.vocab_size, 80), 0}, {{1}, tokens_for(2, tiny().config.vocab_size, 81), 0}},
      bs);
  ASSERT_TRUE(validate_plan(two, pool, limits).is_ok());
  two.query_start[1] = 0;  // sequence 0 has no new token
  const Status empty = validate_plan(two, pool, limits);
  EXPECT_NE(empty.message().find("sequence 0: query_start must increase"), std::string::npos) << empty.message();
  BatchPlan audited = good;  // the audit arrays: a tenant per sequence, a holder per device block
  audited.seq_tenants = {0};
  audited.block_tenants.assign(8, 0);
  EXPECT_TRUE(validate_plan(audited, pool, limits).is_ok());
  audited.block_tenants.pop_back();
  const Status short_audit = validate_plan(audited, pool, limits);
  EXPECT_NE(short_audit.message().find("audit arrays must have num_seqs = 1 and num_device_blocks = 8 entries"),
            std::string::npos)
      << short_audit.message();
  BatchPlan late = good;
  late.positions[3] = 0;
  const Status position = validate_plan(late, pool, limits);
  EXPECT_NE(position.message().find("positions[3] = 0, expected 3"), std::string::npos) << position.message();
  for (const Side& side : sides) {
    BatchPlan at = good, past = good;
    side.set(at, side.last);
    side.set(past, side.upper ? side.last + 1 : side.last - 1);
    const Status at_st = validate_plan(at, pool, limits);
    EXPECT_TRUE(at_st.is_ok()) << side.what << " " << side.last << ": " << at_st.message();
    EXPECT_FALSE(validate_plan(past, pool, limits).is_ok())
        << side.what << " " << (side.upper ? side.last + 1 : side.last - 1) << " accepted";
  }
}

// ---- one line per backend ----

[[maybe_unused]] Result<std::unique_ptr<Backend>> make_cpu(const Model& m, const BackendParams& p) {
  CpuBackendConfig c;
  c.pool = p.pool;
  c.num_threads = p.num_threads;
  c.attention_partition = p.attention_partition;
  auto b = CpuBackend::create(m, c);
  if (!b) return b.status();
  return std::unique_ptr<Backend>(std::move(*b));
}

// The CUDA backend in the flavour this binary tests: "cuda-emu" (SIMT-emulated kernels,
// backend_conformance_test) or "cuda" (nvcc kernels on a GPU, backend_conformance_gpu_test,
// built with KVP_CUDA_DEVICE_FLAVOUR).
#if defined(KVP_CUDA_DEVICE_FLAVOUR)
constexpr CudaFlavour kCudaFlavour = CudaFlavour::kDevice;
#else
constexpr CudaFlavour kCudaFlavour = CudaFlavour::kEmulated;
#endif
Result<std::unique_ptr<Backend>> make_cuda(const Model& m, const BackendParams& p) {
  CudaBackendConfig c;
  c.pool = p.pool;
  c.attention_partition = p.attention_partition;
  c.weight_dtype = p.weight_dtype;
  c.max_graph_tokens = p.max_graph_tokens;
  return make_cuda_backend(kCudaFlavour, m, c);
}

std::string factory_name(const ::testing::TestParamInfo<BackendFactory>& p) {
  std::string name;
  for (char ch : p.param.name) name += (ch == '-' ? '_' : ch);
  return name;
}

// The projection kernels' lanes per row (process-wide), restored however a test ends.
struct ProjectLanesRestore {
  int saved = kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS::project_lanes();
  ~ProjectLanesRestore() { kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS::set_project_lanes(saved); }
};

// A short schedule for the slow emulated paths (shuffles): 40 tokens in chunks of 20, 19 and 1,
// and 30 in 29 and 1 joining at step 1, through scrambled tables of a pool of `pool_blocks`.
std::vector<SeqSchedule> short_two_sequence_schedule(int64_t vocab, int32_t pool_blocks) {
  std::vector<SeqSchedule> seqs(2);
  seqs[0].tokens = tokens_for(40, vocab, 1);
  seqs[0].chunks = chunks_of(40, {20, 19, 1});
  seqs[0].table = scrambled_table(10, pool_blocks, 5);
  seqs[1].tokens = tokens_for(30, vocab, 2);
  seqs[1].chunks = chunks_of(30, {29, 1});
  seqs[1].table = scrambled_table(8, pool_blocks, 6, seqs[0].table);
  seqs[1].start_step = 1;
  return seqs;
}

// bf16 weights (--weight-dtype bf16): every matrix stored as bf16 and widened exactly as a
// kernel reads it, so on a model whose matrices are bf16 values the CUDA backend gives the
// bits it gives with fp32 weights of the same values, in either flavour (the emulated one and,
// in backend_conformance_gpu_test, the GPU), for every projection kernel (tiny-qwen2-hybrid:
// biases, project_qkv_rope_kv; tiny-gemma3: q/k norms, project_qkv, GeGLU, tied embeddings)
// and with a thread or a half-warp per row. Not vacuous: rounding the matrices to bf16
// changes the logits.
TEST(CudaWeights, Bf16WeightsGiveTheBitsOfFp32WeightsOfTheSameValues) {
  if (kCudaFlavour == CudaFlavour::kDevice && !cuda_device_status()) GTEST_SKIP() << cuda_device_status().message();
  const ProjectLanesRestore restore;
  for (const char* preset : {"tiny-qwen2-hybrid", "tiny-gemma3"}) {
    SCOPED_TRACE(preset);
    const Model fp32 = *make_preset(preset, 0);
    Model rounded = fp32;
    round_matrices_to_bf16(rounded);
    ASSERT_TRUE(matrices_are_bf16(rounded));
    ASSERT_FALSE(matrices_are_bf16(fp32));
    const std::vector<SeqSchedule> seqs = short_two_sequence_schedule(fp32.config.vocab_size, 64);
    BackendParams p;
    p.pool = pool_shape_for(fp32.config, 4, 64, 0, DType::kF32);
    p.attention_partition = 8;
    auto f32_unrounded = make_cuda(fp32, p);
    ASSERT_TRUE(f32_unrounded.is_ok()) << f32_unrounded.status().message();
    const std::vector<Logits> unrounded = run_schedule(**f32_unrounded, seqs);
    for (const int lanes : {1, 16}) {
      SCOPED_TRACE("lanes " + std::to_string(lanes));
      ASSERT_TRUE(kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS::set_project_lanes(lanes));
      p.weight_dtype = DType::kF32;
      auto f32 = make_cuda(rounded, p);
      p.weight_dtype = DType::kBF16;
      auto bf16 = make_cuda(rounded, p);
      ASSERT_TRUE(f32.is_ok()) << f32.status().message();
      ASSERT_TRUE(bf16.is_ok()) << bf16.status().message();
      const std::vector<Logits> a = run_schedule(**f32, seqs);
      const std::vector<Logits> b = run_schedule(**bf16, seqs);
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_FALSE(a[i].empty() || all_nan(a[i])) << "sequence " << i;
        EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "sequence " << i;
        EXPECT_FALSE(bitwise_equal(a[i], unrounded[i])) << "sequence " << i;
      }
    }
  }
}

// A model whose matrices are not bf16 values is refused bf16 weights, naming the tensor: the
// backend would otherwise compute with values the oracle does not have.
TEST(CudaWeights, Bf16WeightsRefuseAMatrixThatIsNotBf16) {
  if (kCudaFlavour == CudaFlavour::kDevice && !cuda_device_status()) GTEST_SKIP() << cuda_device_status().message();
  const Model m = *make_preset("tiny", 0);
  BackendParams p;
  p.pool = pool_shape_for(m.config, 4, 16, 0, DType::kF32);
  p.weight_dtype = DType::kBF16;
  auto b = make_cuda(m, p);
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("weight_dtype bf16: tensor embed_tokens element 0"), std::string::npos)
      << b.status().message();
  EXPECT_NE(b.status().message().find("is not a bf16 value"), std::string::npos) << b.status().message();
  p.weight_dtype = DType::kF16;
  auto f16 = make_cuda(m, p);
  ASSERT_FALSE(f16.is_ok());
  EXPECT_NE(f16.status().message().find("weight_dtype must be F32 or BF16"), std::string::npos)
      << f16.status().message();
}

// CUDA graphs (CudaBackendConfig::max_graph_tokens). Nine sequences join one a step, then
// decode 14 tokens each: pure decode steps of 9 down to 1 sequences, replayed from graphs
// padded to 16, 8, 4, 2 or 1 tokens, re-captured as the block tables widen (4 -> 8 entries)
// and as the contexts cross attention partitions. A 64-token prompt at step 0 sizes the step
// buffers beyond what those graphs need; twelve 8-token prompts at a later step regrow them,
// so every graph captured before holds freed pointers and must be dropped. Two cases:
//   - Llama (tiny), partitions of 12, regrowth at step 16: step 17 has step 15's shape
//     (8 tokens, 8 entries, 2 partitions), so a graph kept past the regrowth is replayed;
//   - Gemma 2 (sliding layers, soft-caps), partitions of 11, regrowth at step 20: step 17
//     needs 3 partitions where steps 15 and 16 (8 tokens, 8 entries) had 2, so a graph found
//     without its partition count is replayed with too small a grid.
// Graph replays must give every real row the bits eager steps give, and leave the pool
// bitwise equal to the eager run's (a padded token writes nothing: block 0, which the
// padding's attention reads, is sequence 0's first block).
TEST(CudaGraphs, PaddedDecodeReplaysGiveEveryRealRowTheEagerBitsAndWriteNothingElse) {
  if (kCudaFlavour == CudaFlavour::kDevice && !cuda_device_status()) GTEST_SKIP() << cuda_device_status().message();
  struct Case {
    const char* preset;
    int64_t partition;
    int regrow_step;
  };
  for (const Case& k : {Case{"tiny", 12, 16}, Case{"tiny-gemma2", 11, 20}}) {
    SCOPED_TRACE(k.preset);
    const Model m = *make_preset(k.preset, 0);
    std::vector<SeqSchedule> seqs(22);
    std::vector<int32_t> used = {0};
    for (int i = 0; i < 22; ++i) {
      SeqSchedule& s = seqs[static_cast<std::size_t>(i)];
      const int prompt = i < 9 ? 6 + i : (i == 9 ? 64 : 8);
      const int decodes = i < 9 ? 14 : 0;
      s.tokens = tokens_for(prompt + decodes, m.config.vocab_size, 40 + static_cast<uint64_t>(i));
      s.chunks = decodes == 0 ? std::vector<int>{prompt} : chunks_of(prompt + decodes, std::vector<int>{prompt, 1});
      s.table =
          scrambled_table(kernels::blocks_for_tokens(prompt + decodes, 4), 200, 70 + static_cast<uint64_t>(i), used);
      if (i == 0) s.table.insert(s.table.begin(), 0);
      used.insert(used.end(), s.table.begin(), s.table.end());
      s.start_step = i < 9 ? i : (i == 9 ? 0 : k.regrow_step);
    }
    BackendParams p;
    p.pool = pool_shape_for(m.config, 4, 200, 0, DType::kF32);
    p.attention_partition = k.partition;
    p.max_graph_tokens = 0;
    auto eager = make_cuda(m, p);
    p.max_graph_tokens = 64;
    auto graphs = make_cuda(m, p);
    ASSERT_TRUE(eager.is_ok()) << eager.status().message();
    ASSERT_TRUE(graphs.is_ok()) << graphs.status().message();
    const std::vector<Logits> a = run_schedule(**eager, seqs);
    const std::vector<Logits> b = run_schedule(**graphs, seqs);
    // Pure decode steps: 9..22 but the regrowth (steps 0..8 and it carry prompts: eager).
    EXPECT_EQ((*graphs)->graph_replays(), 13);
    EXPECT_EQ((*eager)->graph_replays(), 0);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_FALSE(a[i].empty() || all_nan(a[i])) << "sequence " << i;
      EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "sequence " << i;
    }
    for (int64_t layer = 0; layer < m.config.num_layers; ++layer) {
      for (int32_t block = 0; block < 200; ++block) {
        for (const bool value : {false, true}) {
          const std::vector<float> x = block_kv(**eager, PoolKind::kDevice, value, layer, block);
          const std::vector<float> y = block_kv(**graphs, PoolKind::kDevice, value, layer, block);
          ASSERT_EQ(x.size(), y.size());
          ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0)
              << "layer " << layer << " block " << block << (value ? " V" : " K");
        }
      }
    }
  }
}

TEST(CudaGraphs, PaddedTokenCountsAreVllmsCaptureSizes) {
  const std::vector<std::pair<int64_t, int64_t>> expected = {{1, 1},  {2, 2},   {3, 4},   {5, 8},   {8, 8},
                                                             {9, 16}, {16, 16}, {17, 24}, {63, 64}, {64, 64}};
  for (const auto& [n, padded] : expected) EXPECT_EQ(graph_tokens(n, 64), padded) << n;
  EXPECT_EQ(graph_tokens(65, 64), 0);
  EXPECT_EQ(graph_tokens(0, 64), 0);
  EXPECT_EQ(graph_tokens(1, 0), 0);
  EXPECT_EQ(graph_tokens(11, 12), 12);  // capped at the largest size captured
}

#if defined(KVP_CUDA_DEVICE_FLAVOUR)
// No device: no backend to instantiate; the Device test below says why.
std::vector<BackendFactory> gpu_factories() {
  if (!cuda_device_status()) return {};
  return {BackendFactory{"cuda", make_cuda}};
}
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendConformance);
INSTANTIATE_TEST_SUITE_P(Cuda, BackendConformance, ::testing::ValuesIn(gpu_factories()), factory_name);
TEST(CudaDevice, Present) {
  const Status why = cuda_device_status();
  if (!why) GTEST_SKIP() << why.message();
}
#else
INSTANTIATE_TEST_SUITE_P(Cpu, BackendConformance, ::testing::Values(BackendFactory{"cpu", make_cpu}),
                         [](const ::testing::TestParamInfo<BackendFactory>& p) { return p.param.name; });
INSTANTIATE_TEST_SUITE_P(CudaEmu, BackendConformance, ::testing::Values(BackendFactory{"cuda-emu", make_cuda}),
                         factory_name);

// Scales for an fp8 pool of `m` that differ per layer, per KV head and between K and V (so a
// backend that used the wrong one, or none, would give other bits): 2^-5 .. about 0.1.
void set_test_scales(const ModelConfig& m, KvPoolShape& pool) {
  const auto n = static_cast<std::size_t>(m.num_layers * m.num_kv_heads);
  pool.k_scales.resize(n);
  pool.v_scales.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    pool.k_scales[i] = 0.03125f * (1.0f + 0.37f * static_cast<float>(i % 5));
    pool.v_scales[i] = 0.015625f * (1.0f + 0.61f * static_cast<float>(i % 3));
  }
}

constexpr DType kEveryKvDtype[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2};

// Two sequences through scrambled block tables of a 128-block pool: 150 tokens in chunks of
// 40, 37 and 1 (several attention partitions of 32), and 90 in 64 and 1, joining at step 1.
std::vector<SeqSchedule> two_sequence_schedule(int64_t vocab) {
  std::vector<SeqSchedule> seqs(2);
  seqs[0].tokens = tokens_for(150, vocab, 1);
  seqs[0].chunks = chunks_of(150, {40, 37, 1});
  seqs[0].table = scrambled_table(38, 128, 5);
  seqs[1].tokens = tokens_for(90, vocab, 2);
  seqs[1].chunks = chunks_of(90, {64, 1});
  seqs[1].table = scrambled_table(23, 128, 6, seqs[0].table);
  seqs[1].start_step = 1;
  return seqs;
}

// Runs `seqs` through the CPU backend and the emulated CUDA backend built with `p` and expects
// every sequence's logits bitwise equal (and not empty, not all NaN); returns the CPU's, or
// nothing when a backend could not be built or ran short.
std::vector<Logits> cpu_logits_if_emu_gives_their_bits(const Model& m, const BackendParams& p,
                                                       const std::vector<SeqSchedule>& seqs) {
  auto cpu = make_cpu(m, p);
  auto emu = make_cuda(m, p);
  EXPECT_TRUE(cpu.is_ok()) << cpu.status().message();
  EXPECT_TRUE(emu.is_ok()) << emu.status().message();
  if (!cpu.is_ok() || !emu.is_ok()) return {};
  std::vector<Logits> a = run_schedule(**cpu, seqs);
  const std::vector<Logits> b = run_schedule(**emu, seqs);
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size()) return {};
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_FALSE(a[i].empty()) << "sequence " << i;
    EXPECT_FALSE(all_nan(a[i])) << "sequence " << i;
    EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "sequence " << i;
  }
  return a;
}

// The emulated CUDA kernels call the CPU backend's loops one output per CUDA thread, so they
// give the CPU backend's bits, for every KV dtype (the same conversions on write, the same
// scaled reads): chunked prefill across several attention partitions, GQA, two sequences
// batched through scrambled block tables, then decode.
TEST(CudaEmu, GivesTheCpuBackendsBitsForEveryKvDtype) {
  const Model& m = tiny();
  const std::vector<SeqSchedule> seqs = two_sequence_schedule(m.config.vocab_size);
  std::vector<std::vector<Logits>> by_dtype;
  for (const DType dtype : kEveryKvDtype) {
    SCOPED_TRACE(dtype_name(dtype));
    BackendParams p;
    p.pool = pool_shape_for(m.config, 4, 128, 0, dtype);
    if (is_fp8(dtype)) set_test_scales(m.config, p.pool);
    p.attention_partition = 32;
    const std::vector<Logits> a = cpu_logits_if_emu_gives_their_bits(m, p, seqs);
    ASSERT_FALSE(a.empty());
    by_dtype.push_back(a);
  }
  // Not vacuous: each KV dtype rounds differently, so no two give the same logits.
  for (std::size_t x = 0; x < by_dtype.size(); ++x)
    for (std::size_t y = x + 1; y < by_dtype.size(); ++y)
      EXPECT_FALSE(bitwise_equal(by_dtype[x][0], by_dtype[y][0]))
          << dtype_name(kEveryKvDtype[x]) << " vs " << dtype_name(kEveryKvDtype[y]);
}

// Gemma 2 and Gemma 3 (tiny-gemma2, tiny-gemma3: windowed and full layers, soft-capped
// scores and logits, q/k norms, two RoPE bases, GeGLU, sandwich norms) and Qwen2
// (tiny-qwen2-hybrid: q/k/v biases, windowed and full layers): the emulated CUDA kernels
// give the CPU backend's bits there too, chunked prefill across partitions and windows, two
// sequences batched, then decode.
TEST(CudaEmu, GivesTheCpuBackendsBitsForGemma) {
  for (const char* preset : {"tiny-gemma2", "tiny-gemma3", "tiny-qwen2-hybrid"}) {
    SCOPED_TRACE(preset);
    const Model m = *make_preset(preset, 0);
    const std::vector<SeqSchedule> seqs = two_sequence_schedule(m.config.vocab_size);
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(dtype_name(dtype));
      BackendParams p;
      p.pool = pool_shape_for(m.config, 4, 128, 0, dtype);
      p.attention_partition = 32;
      cpu_logits_if_emu_gives_their_bits(m, p, seqs);
    }
  }
}

// The emulated engine with a half-warp per projection row (the GPU's layout: lane l the
// definition's partial sum l, the tree as a shuffle butterfly) instead of a thread per row:
// still the CPU backend's bits.
TEST(CudaEmu, SixteenLanesPerProjectionRowGiveTheCpuBackendsBits) {
  const ProjectLanesRestore restore;
  ASSERT_TRUE(kvp::cuda_kernels::emu::set_project_lanes(16));
  // Qwen2 (biases; project_qkv_rope_kv) and Gemma 3 (q/k norms: project_qkv; GeGLU): every
  // projection kernel, on the short schedule (the emulated shuffles are slow), over partitions
  // of 8 positions.
  for (const char* preset : {"tiny-qwen2-hybrid", "tiny-gemma3"}) {
    SCOPED_TRACE(preset);
    const Model m = *make_preset(preset, 0);
    const std::vector<SeqSchedule> seqs = short_two_sequence_schedule(m.config.vocab_size, 128);
    BackendParams p;
    p.pool = pool_shape_for(m.config, 4, 128, 0, DType::kBF16);
    p.attention_partition = 8;
    cpu_logits_if_emu_gives_their_bits(m, p, seqs);
  }
}

// The engine's step is at most seven launches a layer, eight with Gemma 3's q/k norms, plus
// four (the embedding and the first layer's input norm; the final norm and the LM head): the
// fused kernels (project_qkv_rope_kv, or project_qkv and heads_rope_kv; attention with its
// merge; project; add_norm; project_gated; project; add_norm). The unfused layer was 17
// launches (Llama), 19 (Gemma 2), 21 (Gemma 3). Counted by the SIMT layer on this thread, for
// a prefill and a decode step of every architecture.
TEST(CudaEmu, AStepIsAtMostSevenLaunchesALayerEightWithQkNorms) {
  for (const char* preset : {"tiny", "tiny-qwen2-hybrid", "tiny-gemma2", "tiny-gemma3"}) {
    SCOPED_TRACE(preset);
    const Model m = *make_preset(preset, 0);
    BackendParams p;
    p.pool = pool_shape_for(m.config, 4, 16, 0, DType::kF32);
    p.attention_partition = 32;
    auto emu = make_cuda(m, p);
    ASSERT_TRUE(emu.is_ok()) << emu.status().message();
    const std::vector<int32_t> table = {3, 1, 4, 0};
    const std::vector<int32_t> prompt = tokens_for(12, m.config.vocab_size, 7);
    const uint64_t per_layer = m.config.qk_norm() ? 8 : 7;
    const uint64_t bound = per_layer * static_cast<uint64_t>(m.config.num_layers) + 4;
    for (const SeqChunk& chunk : {SeqChunk{table, prompt, 0}, SeqChunk{table, {prompt[0]}, 12}}) {
      StepOutput out;
      const uint64_t before = kvp::simt::launches_on_this_thread();
      const Status st = (*emu)->execute(make_plan({chunk}, 4), out);
      const uint64_t launches = kvp::simt::launches_on_this_thread() - before;
      ASSERT_TRUE(st.is_ok()) << st.message();
      EXPECT_GT(launches, 0u);  // counted at all
      EXPECT_LE(launches, bound) << chunk.tokens.size() << " tokens, " << m.config.num_layers << " layers";
    }
  }
}

// The CPU backend's pools in every KV dtype: a written element reads back as a value of the
// pool's type (times its KV head's scale, fp8), unwritten slots and poisoned blocks read as
// NaN and make the logits that read them NaN, and a swap round trip keeps the next decode's
// bits.
TEST(CpuBackend, PoolsOfEveryKvDtypeHoldTheirTypesValuesAndPoison) {
  const Model& m = tiny();
  const int32_t bs = 4;
  const auto tokens = tokens_for(12, m.config.vocab_size, 60);
  const std::vector<int32_t> table = {2, 0, 4, 7};
  const std::vector<int32_t> moved = {6, 1, 3, 5};
  for (const DType dtype : kEveryKvDtype) {
    SCOPED_TRACE(dtype_name(dtype));
    BackendParams p;
    p.pool = pool_shape_for(m.config, bs, 8, 4, dtype);
    if (is_fp8(dtype)) set_test_scales(m.config, p.pool);
    auto made = make_cpu(m, p);
    ASSERT_TRUE(made.is_ok()) << made.status().message();
    Backend& backend = **made;
    std::vector<float> k, v;
    ASSERT_TRUE(backend.read_block(PoolKind::kDevice, 0, 5, k, v).is_ok());
    for (std::size_t i = 0; i < k.size(); ++i) ASSERT_TRUE(std::isnan(k[i]) && std::isnan(v[i])) << i;

    StepOutput out;
    ASSERT_TRUE(backend.execute(make_plan({{table, tokens, 0}}, bs), out).is_ok());
    ASSERT_FALSE(all_nan(out.logits));
    const auto heads = m.config.num_kv_heads;
    for (int64_t l = 0; l < m.config.num_layers; ++l) {
      ASSERT_TRUE(backend.read_block(PoolKind::kDevice, l, 0, k, v).is_ok());
      for (std::size_t i = 0; i < k.size(); ++i) {
        const int64_t head = static_cast<int64_t>(i) / m.config.head_dim % heads;
        for (const bool is_k : {true, false}) {
          const float x = is_k ? k[i] : v[i];
          const float s = is_k ? p.pool.k_scale(l, head) : p.pool.v_scale(l, head);
          // Back to the type and out again: the same value when it is one of the type's.
          float again = x;
          if (dtype == DType::kF16) again = f16_to_float(float_to_f16(x));
          if (dtype == DType::kBF16) again = bf16_to_float(float_to_bf16(x));
          if (dtype == DType::kF8E4M3) again = fp8_e4m3_to_float(float_to_fp8_e4m3(x / s)) * s;
          if (dtype == DType::kF8E5M2) again = fp8_e5m2_to_float(float_to_fp8_e5m2(x / s)) * s;
          ASSERT_FALSE(std::isnan(x)) << "layer " << l << " element " << i;
          ASSERT_EQ(again, x) << "layer " << l << " element " << i << (is_k ? " K" : " V");
        }
      }
    }

    // Swap the sequence's blocks out and into other blocks: the next decode has the same bits.
    auto twin = make_cpu(m, p);
    ASSERT_TRUE(twin.is_ok());
    const Logits expected = decode_after_prefill(**twin, tokens, table, 3);
    KvPlanOps ops;
    for (std::size_t i = 0; i < table.size(); ++i) ops.swap_out.push_back({table[i], static_cast<int32_t>(i)});
    for (std::size_t i = 0; i < table.size(); ++i) ops.swap_in.push_back({static_cast<int32_t>(i), moved[i]});
    for (int32_t b : table) ops.poison.push_back(b);
    ASSERT_TRUE(backend.execute(make_plan({{moved, {3}, 12}}, bs, ops), out).is_ok());
    EXPECT_TRUE(bitwise_equal(expected, out.logits));

    // The old blocks were poisoned: they read as NaN, and a sequence reading them gets NaN logits.
    ASSERT_TRUE(backend.read_block(PoolKind::kDevice, 1, table[0], k, v).is_ok());
    for (std::size_t i = 0; i < k.size(); ++i) ASSERT_TRUE(std::isnan(k[i]) && std::isnan(v[i])) << i;
    ASSERT_TRUE(backend.execute(make_plan({{table, {9}, 13}}, bs), out).is_ok());
    EXPECT_TRUE(all_nan(out.logits));
  }
}
#endif

}  // namespace
}  // namespace kvp
