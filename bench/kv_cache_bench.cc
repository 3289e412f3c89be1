// ns per operation of the paged KV-cache core. Targets on the 2-core dev machine:
// allocate+free <= 50 ns, a decode append without a new block <= 20 ns, prefix lookup
// bounded by SHA-256 speed.
#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

#include "optimized/kv/block_allocator.h"
#include "optimized/kv/kv_cache_manager.h"

namespace kvp {
namespace {

std::vector<int32_t> prompt_of(int n, int start = 1) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// One block out of the allocator and back.
void BM_AllocatorAllocateFree(benchmark::State& state) {
  BlockAllocator a(1024);
  for (auto _ : state) {
    const int32_t b = a.allocate().block;
    benchmark::DoNotOptimize(b);
    a.release(b);
  }
}
BENCHMARK(BM_AllocatorAllocateFree);

// Through the manager: a one-token sequence takes a block, then frees it.
void BM_ManagerAllocateFree(benchmark::State& state) {
  KvCacheConfig c;
  c.pool.num_device_blocks = 1024;
  c.pool.block_size = 16;
  c.enable_prefix_caching = false;
  KvCacheManager m(c);
  const std::vector<int32_t> one = {1};
  std::vector<int64_t> slots;
  slots.reserve(16);
  SeqId id = 0;
  for (auto _ : state) {
    (void)m.add_sequence(id, 0, one);
    (void)m.allocate_slots(id, 1, slots);
    (void)m.free(id);
    slots.clear();
    ++id;
  }
}
BENCHMARK(BM_ManagerAllocateFree);

// Decode append: one token appended and its slot returned. Arg 0: into the sequence's last
// block (block size 2^20: never a new block); arg 1: a new block every time (block size 1).
// Every 4000 tokens the sequence is truncated outside the timed region, so the benchmark
// times the append, not its own unbounded token-vector growth. `allocate` is the slot
// reservation the benchmark times after the append.
template <typename Allocate>
void decode_append(benchmark::State& state, Allocate allocate) {
  const bool new_block = state.range(0) == 1;
  KvCacheConfig c;
  c.pool.num_device_blocks = new_block ? 4096 : 64;
  c.pool.block_size = new_block ? 1 : 1 << 20;
  c.enable_prefix_caching = !new_block;
  KvCacheManager m(c);
  (void)m.add_sequence(0, 0, prompt_of(1));
  std::vector<int64_t> slots;
  slots.reserve(1);
  (void)m.allocate_slots(0, 1, slots);
  const int32_t tok = 5;
  int64_t n = 0;
  for (auto _ : state) {
    slots.clear();
    (void)m.append_tokens(0, {&tok, 1});
    allocate(m, slots);
    benchmark::DoNotOptimize(slots.data());
    if (++n == 4000) {
      state.PauseTiming();
      (void)m.truncate(0, 1);
      n = 0;
      state.ResumeTiming();
    }
  }
  state.SetLabel(new_block ? "new block" : "no new block");
}
// Through the Status convenience (it looks the prefix up itself).
void BM_DecodeAppend(benchmark::State& state) {
  decode_append(state, [](KvCacheManager& m, std::vector<int64_t>& slots) { (void)m.allocate_slots(0, 1, slots); });
}
BENCHMARK(BM_DecodeAppend)->Arg(0)->Arg(1);
// As the scheduler takes the step: one prefix lookup whose hit allocate_slots acts on
// (before the PrefixHit: can_allocate, then allocate_slots, each looking the prefix up).
void BM_SchedulerDecodeAppend(benchmark::State& state) {
  decode_append(state, [](KvCacheManager& m, std::vector<int64_t>& slots) {
    (void)m.allocate_slots(0, 1, m.find_prefix(0), slots);
  });
}
BENCHMARK(BM_SchedulerDecodeAppend)->Arg(0)->Arg(1);

// Prefix lookup of a cached 4k-token prompt (256 blocks of 16): hashing plus verification.
// Reported per lookup; divide by 4 for us per 1k tokens.
void BM_PrefixLookup4k(benchmark::State& state) {
  KvCacheConfig c;
  c.pool.num_device_blocks = 1024;
  c.pool.block_size = 16;
  KvCacheManager m(c);
  const std::vector<int32_t> prompt = prompt_of(4096);
  std::vector<int64_t> slots;
  (void)m.add_sequence(0, 0, prompt);
  (void)m.allocate_slots(0, 4096, slots);
  (void)m.mark_final(0, 4096);
  SeqId id = 1;
  for (auto _ : state) {
    // A fresh sequence each time, so the hash memo is cold (hashing is part of the lookup).
    state.PauseTiming();
    (void)m.add_sequence(id, 0, prompt);
    state.ResumeTiming();
    benchmark::DoNotOptimize(m.cached_prefix_tokens(id));
    state.PauseTiming();
    (void)m.free(id);
    ++id;
    state.ResumeTiming();
  }
  state.counters["tokens"] = 4096;
}
BENCHMARK(BM_PrefixLookup4k)->Unit(benchmark::kMicrosecond);

// The SHA-256 chain hash alone over 4k tokens (the bound for the lookup).
void BM_ChainHash4k(benchmark::State& state) {
  const std::vector<int32_t> prompt = prompt_of(4096);
  for (auto _ : state) {
    BlockHash h{};
    for (size_t i = 0; i < 256; ++i) {
      h = chain_hash(i == 0 ? nullptr : &h, 0, std::span<const int32_t>(prompt).subspan(i * 16, 16), 256);
    }
    benchmark::DoNotOptimize(h);
  }
}
BENCHMARK(BM_ChainHash4k)->Unit(benchmark::kMicrosecond);

// Fork a 64-token sequence (4 blocks of 16, last one partial) and write one token:
// copy-on-write of the last block; then free the child.
void BM_ForkThenCopyOnWrite(benchmark::State& state) {
  KvCacheConfig c;
  c.pool.num_device_blocks = 1024;
  c.pool.block_size = 16;
  c.enable_prefix_caching = false;
  KvCacheManager m(c);
  std::vector<int64_t> slots;
  (void)m.add_sequence(0, 0, prompt_of(60));
  (void)m.allocate_slots(0, 60, slots);
  const int32_t tok = 5;
  SeqId id = 1;
  for (auto _ : state) {
    slots.clear();
    (void)m.fork(0, id);
    (void)m.append_tokens(id, {&tok, 1});
    (void)m.allocate_slots(id, 1, slots);
    benchmark::DoNotOptimize(slots.data());
    state.PauseTiming();
    (void)m.free(id);
    m.take_plan_ops();
    ++id;
    state.ResumeTiming();
  }
}
BENCHMARK(BM_ForkThenCopyOnWrite);

}  // namespace
}  // namespace kvp

BENCHMARK_MAIN();
