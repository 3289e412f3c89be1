// Invariant checkers for KvCacheManager: one function per invariant (docs/architecture.md,
// "Invariants and their checkers", states each).
// Each returns ok, or an error describing the first violation found (pool, block id,
// sequence id, expected vs actual). Unit tests, property tests, fuzzers and `kvproof
// verify/audit` all call these same functions. They only read the manager, in O(state).
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "optimized/backends/batch_plan.h"
#include "optimized/kv/kv_cache_manager.h"

namespace kvp {

// I1 conservation, per pool: every block is exactly one of free (in the fresh list),
// in use (refcount > 0, in no list) or cached-evictable (in the evictable list);
// free + in use + evictable = pool size; the list counters match the lists.
Status check_conservation(const KvCacheManager& m);

// I2 refcount exactness, per pool: a block's refcount equals the number of block-table
// entries naming it (the prefix cache holds no reference); none is negative; a free
// block has refcount 0 and no owner.
Status check_refcounts(const KvCacheManager& m);

// I3 exclusive write: every slot in `slot_mapping` (just returned by allocate_slots for
// `seq`) lies in a device block of seq's table with refcount 1 that is not cached.
// With KV-cache groups, `slot_mapping` is group `group`'s and the block is in its table.
Status check_exclusive_write(const KvCacheManager& m, SeqId seq, std::span<const int64_t> slot_mapping,
                             int64_t group = 0);

// I4 isolation: all holders of a device block hold it at the same table index, in the same
// tenant scope, and agree on every token before the block's end (up to their slots); a
// cached block's entry matches each holder's tokens, salt and parent block (by generation).
Status check_isolation(const KvCacheManager& m);

// I5 mapping: per sequence, num_final <= num_slots <= tokens; the table holds exactly
// ceil(num_slots / block_size) distinct in-range blocks of its pool; positions map to
// distinct slots. With KV-cache groups: no block is in two of a sequence's tables, and each
// group maps positions to distinct slots.
Status check_mapping(const KvCacheManager& m);

// I11 sliding window (KvCacheConfig::sliding_window W > 0): a sequence's leading
// window_dead_blocks(num_final) table entries, exactly, are released (kNoBlock): every block
// a token it will still run attends to is held (none released early), and none that no such
// token reads is kept (a windowed sequence holds what its window and its unfinished tokens
// need, no more). With W = 0 no entry is ever released. check_plan adds the step's half: no
// new token attends to a released entry.
// With KV-cache groups, per group with the group's window (KvCacheConfig::window_of): no
// block a token the sequence will still run attends to is released in any group, and a
// windowed group keeps only what its window and the unfinished tokens need.
Status check_window_blocks(const KvCacheManager& m);

// I12 group agreement (KV-cache groups): every sequence has one table per group, and every
// group's table covers exactly the sequence's positions (ceil(num_slots / block_size)
// entries, released ones included): the groups agree on its length. check_isolation adds
// that a block is held, and cached, in one group only (all holders and its cache entry name
// the same group) and check_prefix_cache that a chain never crosses groups.
Status check_group_tables(const KvCacheManager& m);

// I13 prefix-hit rule, for a PrefixHit just found (KvCacheManager::find_prefix): a sequence
// that may take a hit (no slots, prefix caching on) skips k whole blocks, k <= (tokens-1)/bs;
// every group's chain has exactly k blocks, block i of group g being a cached block of group
// g holding the sequence's block i chained onto the chain's block i-1; and k is maximal: not
// every group caches the sequence's block k after its chain (found by scanning the cache,
// not its index). A windowed group's chain, too, reaches back to block 0 (this manager's rule:
// a chain is matched from its root), and the blocks before the window of position k*bs go
// back to the cache when taken (I11). num_evictable counts the kept hit blocks of refcount 0.
Status check_prefix_hit(const KvCacheManager& m, const PrefixHit& hit);

// I5 for a plan: `slot_mapping` holds the slots of positions start, start+1, ... of `seq`
// as the table formula (kernels/kv_index.h) gives them.
// With KV-cache groups: group `group`'s table.
Status check_slot_mapping(const KvCacheManager& m, SeqId seq, int64_t start, std::span<const int64_t> slot_mapping,
                          int64_t group = 0);

// Prefix-cache consistency: a device block is marked cached iff the cache has an entry for
// it; each entry is indexed once under its hash; the hash is the chain hash of its parent's
// hash (while the parent is still current), salt and tokens.
Status check_prefix_cache(const KvCacheManager& m, struct ChainHashMemo* memo = nullptr);

// Entries whose chain hash check_prefix_cache recomputed and found right, kept with the exact
// inputs (parent hash, salt, tokens) and the hash: an entry seen again with the same inputs
// and hash is not hashed again. That makes the check after every operation (the fuzzers,
// the property tests) cost a comparison per unchanged entry instead of a SHA-256, and hides
// nothing: any change of an input or of the stored hash is recomputed.
struct ChainHashMemo {
  struct Verified {
    bool valid = false;
    bool has_parent = false;
    BlockHash parent{};
    int64_t salt = 0;
    std::vector<int32_t> tokens;
    BlockHash hash{};
  };
  std::vector<Verified> by_block;
};

// I9 accepted-only cache: no block registered in the prefix cache holds a position that was
// rolled back (a rejected speculative token, a truncated tail): no cached device block is
// one that truncate dropped a position of while it was registered (same generation, per
// KvCacheManager::rolled_back_generation), unless it was registered again since with
// final tokens.
Status check_accepted_only_cache(const KvCacheManager& m);

// Cache hygiene: every cached block is reachable from a root of its chain: following the
// entries' parent handles from any cached block reaches a first block (parent -1) through
// blocks that are all cached and current (the generation the child was registered under).
// A block cached under a parent that is no longer cached can never be found again (find()
// matches the parent handle): it is unreachable waste that still occupies the evictable list.
Status check_cache_reachable(const KvCacheManager& m);

// I6 no leak: with no sequences, no block of either pool is in use and every refcount is 0.
// (Holds trivially while sequences exist.)
Status check_no_leak(const KvCacheManager& m);

// I6 after a flush: no sequences, no cache entries, every block of both pools free.
Status check_all_free(const KvCacheManager& m);

// The scheduler's bounds a plan must respect (I8).
struct PlanBounds {
  int64_t max_num_batched_tokens = 0;
  int64_t max_num_seqs = 0;
  int64_t max_model_len = 0;
  int64_t num_running = 0;  // running sequences when the plan was made
};

// What check_plan saw, for reports (audit's coverage figures).
struct PlanReadStats {
  int64_t block_reads = 0;        // (sequence, block-table entry) pairs attention reads
  int64_t kv_position_reads = 0;  // per new token, the context positions it attends to
  std::vector<int32_t> blocks;    // every block read (with repeats)
};

// The per-plan checker, called on every plan before it runs (verify, audit, the engine
// properties, a backend's audit mode):
//   I8  tokens <= max_num_batched_tokens, num_running <= max_num_seqs, every context
//       length <= max_model_len;
//   I5  each sequence is known and on the device, its context length is its slot count,
//       its block-table row is exactly its table (then -1 padding), and its slot mapping
//       is the table formula's (check_slot_mapping);
//   I3  every slot written is exclusive (check_exclusive_write);
//   I4  every block attention reads is held only by sequences in the reader's tenant scope
//       (any tenant with global prefix sharing);
//   I10 the plan's token ids are the sequence's tokens at those positions;
//   I11 no new token attends to a block-table entry the sliding window released.
// Fills `stats` when given. O(plan + device-resident table entries).
Status check_plan(const KvCacheManager& m, const BatchPlan& plan, const PlanBounds& bounds,
                  PlanReadStats* stats = nullptr);

// All of the above that hold at any time (I1, I2, I12, I4, I5, I11, prefix cache, hygiene, I9, I6).
Status check_all(const KvCacheManager& m, ChainHashMemo* memo = nullptr);

}  // namespace kvp
