// KvCacheManager: the only API the scheduler uses to manage KV-cache memory.
//
// It owns the device pool (BlockAllocator), the host swap pool (a second BlockAllocator),
// the prefix cache and one SequenceState per sequence. Every method is one state
// transition; every fallible method either succeeds completely or returns an error and
// changes nothing at all (no refcount, no list order, no table, no plan op, no log line).
//
// Token life cycle of a sequence:
//   tokens      all known tokens (prompt, generated, speculative drafts): append_tokens
//   num_slots   positions 0..num_slots-1 have reserved slots: allocate_slots
//   num_final   positions 0..num_final-1 are final (their K/V is written and will never be
//               rolled back): mark_final. Only final full blocks enter the prefix cache.
//   num_final <= num_slots <= tokens.size()
//
// Typical use per new sequence: add_sequence; hit = find_prefix(s) (the cached prefix it may
// take: the tokens it may skip); allocate_slots(s, len - hit.num_tokens, hit, mapping) == kOk
// (which first takes the hit's blocks) ... after the step ran: mark_final(s, len). Per decode
// step: append_tokens(s, {t}); allocate_slots(s, 1, find_prefix(s), mapping); after the step
// ran: mark_final. A speculative step gives allocate_slots its drafts as lookahead: they are
// appended with slots of their own, or nothing changes.
// take_plan_ops() once per step hands the block copies, swaps and poisons to the backend.
//
// Invariants I1, I2, I4, I5, I6 (stated in docs/architecture.md) are checked by
// optimized/checkers/invariants.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "optimized/kv/block_allocator.h"
#include "optimized/kv/block_hash.h"
#include "optimized/kv/block_table.h"
#include "optimized/kv/event_log.h"
#include "optimized/kv/kv_pool_shape.h"
#include "optimized/kv/plan_ops.h"
#include "optimized/kv/prefix_cache.h"

namespace kvp {

using SeqId = int64_t;

struct KvCacheConfig {
  // The pools' shape (the manager uses the block counts and block size; the model
  // dimensions are carried so the engine can check its backend against them).
  KvPoolShape pool;
  // Blocks kept free when admitting a sequence that holds no blocks yet, so running
  // sequences can keep growing (applies to can_allocate/allocate_slots of empty tables).
  int32_t watermark_blocks = 0;
  bool enable_prefix_caching = true;
  // Prefix sharing across tenants (otherwise scoped to a tenant: the tenant is the salt).
  bool global_prefix_sharing = false;
  // Freed device blocks are listed in KvPlanOps::poison (audit mode, I7).
  bool poison_on_free = false;
  // Bits of SHA-256 kept in the chain hash; tests use a few to force collisions.
  int hash_bits = 256;
  // Every layer's sliding window (ModelConfig::kv_window; 0: none). With W > 0, once
  // positions [0, F) of a sequence are final, no token it will still run attends below
  // F - W + 1, so its table entries wholly before that are released (kNoBlock): the leading
  // window_dead_blocks(F) entries, exactly (I11). The backend refuses a plan that reads one.
  int64_t sliding_window = 0;
  // KV-cache groups (vLLM's hybrid allocator): one entry per group, its layers' sliding
  // window (0: full attention). Every sequence has one block table per group, all over the
  // one device pool: a block belongs to one group's table at a time, and a group's window
  // releases its table's leading entries as sliding_window does for the single group (I11,
  // per group). Empty: one group whose window is sliding_window. REQUIRES (validate):
  // sliding_window == 0 when set, every window >= 0. kv_groups.h derives them from a model.
  std::vector<int64_t> group_windows;

  int64_t num_groups() const { return group_windows.empty() ? 1 : static_cast<int64_t>(group_windows.size()); }
  int64_t window_of(int64_t group) const {
    return group_windows.empty() ? sliding_window : group_windows[static_cast<size_t>(group)];
  }
  // Whether any group has a window (a block may be released before its sequence ends).
  bool any_window() const;
  // With groups of which some are windowed and some not: the first full-attention group,
  // the anchor every other group's cached blocks are registered under (see KvCacheManager's
  // prefix cache); -1 otherwise (each group's blocks chain onto its own).
  int64_t anchor_group() const;
};

// Returns an error naming the first bad field.
Status validate(const KvCacheConfig& config);

enum class AllocStatus {
  kOk,     // allocate_slots would succeed now
  kLater,  // not enough free blocks now (or the watermark would be crossed)
  kNever,  // the request can never succeed: the table would exceed the pool, or the
           // arguments are invalid (unknown or swapped sequence, too few tokens)
};
const char* to_string(AllocStatus s);

// One sequence's table in one KV-cache group, and the group's bookkeeping of it.
struct GroupTable {
  BlockTable table;  // device blocks, or host blocks while swapped
  // Leading full final blocks already offered to the prefix cache.
  int64_t num_registered_blocks = 0;
  // Leading table entries the group's sliding window released (kNoBlock), and the handle the
  // last of them had: the parent a later block is registered in the prefix cache under.
  int64_t num_window_released = 0;
  BlockHandle window_parent;
};

struct SequenceState {
  SeqId id = 0;
  int64_t tenant = 0;
  std::vector<int32_t> tokens;
  int64_t num_slots = 0;
  int64_t num_final = 0;
  // One table per KV-cache group (KvCacheConfig::num_groups()), every one covering
  // positions [0, num_slots): the groups differ in their blocks and in what their windows
  // released, never in length.
  std::vector<GroupTable> groups = std::vector<GroupTable>(1);
  bool swapped = false;  // the tables name host-pool blocks
  // Memo: chain hashes of the leading full blocks of `tokens` (pure function of tokens).
  mutable std::vector<BlockHash> block_hashes;

  // Group 0's table and bookkeeping: the only group of a model without hybrid layers.
  BlockTable& table() { return groups[0].table; }
  const BlockTable& table() const { return groups[0].table; }
  GroupTable& group(int64_t g) { return groups[static_cast<size_t>(g)]; }
  const GroupTable& group(int64_t g) const { return groups[static_cast<size_t>(g)]; }
  int64_t num_groups() const { return static_cast<int64_t>(groups.size()); }
};

// One prefix-cache lookup (vLLM v1's get_computed_blocks): the cached blocks a sequence with
// no slots yet takes as its first blocks. find_prefix makes it; can_allocate and
// allocate_slots take it, so one admission looks the cache up once and the answer
// can_allocate gave is the one allocate_slots acts on. A hit is valid until the manager's
// next state change (any successful non-const method other than take_plan_ops and
// set_event_log): it names blocks and counts refcounts that a change may alter.
struct PrefixHit {
  SeqId seq = -1;
  // Per KV-cache group, the cached chain, first block first; every group's chain is as long
  // (the hit is what every group can serve: the shortest group's chain). Empty (no chains at
  // all) where no lookup was made: a sequence that holds slots, or prefix caching off.
  std::vector<std::vector<int32_t>> blocks;
  int64_t num_tokens = 0;     // blocks[g].size() * block_size: the positions the sequence skips
  int32_t num_evictable = 0;  // hit blocks kept with refcount 0 (they leave the available pool)
  int64_t num_looked_up = 0;  // blocks that were looked up (hits plus misses, for the stats)
  uint64_t version = 0;       // KvCacheManager::version() when it was found
};

class KvCacheManager {
 public:
  // REQUIRES: validate(config).is_ok().
  explicit KvCacheManager(const KvCacheConfig& config);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // --- sequences and tokens ---

  // A new sequence with an empty table. Error: id in use.
  Status add_sequence(SeqId seq, int64_t tenant, std::span<const int32_t> tokens);
  // The same, taking over `tokens` as the sequence's token history (no copy): a caller
  // whose history moves here while the sequence lives (the Scheduler) reads it back through
  // sequence(seq)->tokens, and gets it back from free(seq, &tokens).
  Status add_sequence(SeqId seq, int64_t tenant, std::vector<int32_t>&& tokens);
  // Appends known tokens (no slots yet). Error: unknown sequence.
  Status append_tokens(SeqId seq, std::span<const int32_t> tokens);
  // Declares positions 0..num_final-1 final; newly full final blocks enter the prefix cache.
  // Error: unknown or swapped sequence, num_final < current or > num_slots.
  Status mark_final(SeqId seq, int64_t num_final);

  // --- slots ---

  // The prefix-cache hit of a sequence with an empty table: the longest chain of cached
  // blocks whose tokens (and parents') equal its own, within its tenant scope, at most
  // tokens-1 tokens so the last token is always recomputed. An empty hit for any other
  // sequence, an unknown one, or with prefix caching off. Does not change state (it may
  // memoize hashes).
  PrefixHit find_prefix(SeqId seq) const;
  // Whether `hit` is find_prefix(seq) with no state change since: the one test every method
  // that takes a PrefixHit makes of it (here and in the Scheduler), refusing a stale one.
  bool is_current(const PrefixHit& hit, SeqId seq) const { return hit.seq == seq && hit.version == version_; }
  // find_prefix(seq).num_tokens: the leading tokens the sequence may skip.
  int64_t cached_prefix_tokens(SeqId seq) const { return find_prefix(seq).num_tokens; }

  // Whether allocate_slots(seq, n_new_tokens, hit, ...) with `num_lookahead` lookahead
  // tokens would return kOk now, and if not, whether it ever could.
  // REQUIRES: `hit` is find_prefix(seq) with no state change since (checked).
  AllocStatus can_allocate(SeqId seq, int64_t n_new_tokens, const PrefixHit& hit, int64_t num_lookahead = 0) const;
  // can_allocate(seq, n_new_tokens, find_prefix(seq)): for callers with no hit in hand.
  AllocStatus can_allocate(SeqId seq, int64_t n_new_tokens) const;

  // Reserves slots for positions [s, s + n + k) where s = num_slots after taking the hit
  // (an empty table first takes the hit's blocks) and k = lookahead.size(): the n new tokens
  // the sequence already has, then the lookahead tokens (speculative drafts), appended to its
  // tokens here. Appends the n + k slots to `slot_mapping`. Writing into a shared or cached
  // last block first copies it (copy-on-write: a block copy in the plan ops).
  // Returns can_allocate(seq, n, hit, k): kOk having done all of it, or kLater / kNever
  // having changed nothing at all (not the tokens, not `slot_mapping`), so the fit of
  // drafts is decided before anything changes.
  // REQUIRES: `hit` is find_prefix(seq) with no state change since (checked).
  // REQUIRES: one KV-cache group (config().num_groups() == 1).
  AllocStatus allocate_slots(SeqId seq, int64_t n_new_tokens, const PrefixHit& hit, std::vector<int64_t>& slot_mapping,
                             std::span<const int32_t> lookahead = {});
  // The same for any number of groups: group g's slots (its table's blocks) are appended to
  // slot_mappings[g]. REQUIRES: slot_mappings.size() == config().num_groups().
  AllocStatus allocate_slots(SeqId seq, int64_t n_new_tokens, const PrefixHit& hit,
                             std::span<std::vector<int64_t>> slot_mappings, std::span<const int32_t> lookahead = {});
  // allocate_slots(seq, n_new_tokens, find_prefix(seq), slot_mapping), as a Status naming
  // the sequence and the refusal: for callers with no hit in hand (tests, benchmarks).
  Status allocate_slots(SeqId seq, int64_t n_new_tokens, std::vector<int64_t>& slot_mapping);

  // Ends a sequence: its blocks are released tail first (so the tails of cached chains are
  // the first evicted). Error: unknown sequence.
  // With `token_history`, the sequence's tokens are moved into it (the other half of
  // add_sequence taking them over).
  Status free(SeqId seq, std::vector<int32_t>* token_history = nullptr);

  // A new sequence `child` sharing every block of `parent` (and its tokens, slots, finality).
  // The first write by either to a shared block copies it. Error: unknown parent, child id
  // in use, parent swapped.
  Status fork(SeqId parent, SeqId child);

  // Drops the tail: tokens beyond new_len are forgotten, whole blocks past the end are
  // released (tail first). Error: unknown sequence, new_len < 0 or > tokens.size().
  // This is speculative rollback (rejected draft tokens) and n-best trimming. I9
  // accepted-only cache: a device block in the prefix cache that held a dropped position
  // leaves the prefix cache (the position was rolled back, so the block no longer names
  // accepted tokens only), and is recorded in rolled_back_generation() so that
  // check_accepted_only_cache can tell if it ever stays registered. Rejected speculative
  // tokens are never final (the scheduler marks only accepted positions final), so a
  // speculative rollback never touches a cached block. Error too (nothing changed): new_len
  // would need positions a sliding window already released (I11).
  Status truncate(SeqId seq, int64_t new_len);

  // Moves the sequence's blocks to the host pool (plan op swap_out) and releases the device
  // blocks; entries a sliding window released stay released. Error: unknown or already
  // swapped sequence, too few free host blocks.
  Status swap_out(SeqId seq);
  // Whether swap_in(seq) would succeed now.
  bool can_swap_in(SeqId seq) const;
  // Moves a swapped sequence back to fresh device blocks (plan op swap_in). Error: unknown
  // or not swapped sequence, too few available device blocks.
  Status swap_in(SeqId seq);

  // --- prefix cache ---

  // Evicts up to n least recently released cached blocks; returns how many.
  int32_t evict_cached(int32_t n);
  // Forgets every prefix-cache entry; evictable blocks become free.
  void flush_prefix_cache();

  // Table entries wholly before the window of position `num_final` (the first position a
  // sequence with num_final final positions may still run): max(0, (num_final - W + 1) / bs)
  // with W = config().window_of(group) > 0, else 0. I11: a sequence's leading entries in
  // that group's table, exactly these, are kNoBlock.
  int64_t window_dead_blocks(int64_t num_final, int64_t group = 0) const;

  // --- plan ops and audit ---

  // The ops accumulated since the last call (see plan_ops.h for execution order).
  KvPlanOps take_plan_ops();
  const KvPlanOps& pending_plan_ops() const { return ops_; }
  // Records every later state change in `log` (nullptr: stop). The log must outlive its use.
  void set_event_log(EventLog* log);

  // --- observers ---

  const KvCacheConfig& config() const { return config_; }
  int32_t block_size() const { return config_.pool.block_size; }
  const BlockAllocator& device_allocator() const { return device_; }
  const BlockAllocator& host_allocator() const { return host_; }
  const PrefixCache& prefix_cache() const { return cache_; }
  // nullptr when unknown.
  const SequenceState* sequence(SeqId seq) const;
  const std::unordered_map<SeqId, SequenceState>& sequences() const { return seqs_; }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  // The salt a sequence's blocks are hashed with (0 with global sharing).
  int64_t salt_of(const SequenceState& s) const { return config_.global_prefix_sharing ? 0 : s.tenant; }
  // Whether prefix-cache entry e holds s's full block i: its salt, its tokens and its chain
  // hash (any group: the caller compares e.group).
  bool same_block_content(const PrefixCacheEntry& e, const SequenceState& s, int64_t i) const;
  // Chain hash of full block i of the sequence's tokens. REQUIRES: (i+1)*block_size <= tokens.
  const BlockHash& block_hash(const SequenceState& s, int64_t i) const;
  // Counts state changes (every successful non-const method but take_plan_ops and
  // set_event_log); a PrefixHit is valid while it is unchanged.
  uint64_t version() const { return version_; }
  // I9 bookkeeping: the generation a device block had when truncate dropped one of its
  // positions while it was in the prefix cache (-1: never, or re-registered since with
  // final tokens). REQUIRES: 0 <= block < num_device_blocks.
  int64_t rolled_back_generation(int32_t block) const { return rolled_back_generation_[static_cast<size_t>(block)]; }

 private:
  friend class KvCacheManagerTestPeer;  // tests corrupt state to prove the checkers see it

  PrefixHit find_prefix(const SequenceState& s) const;
  bool needs_copy_on_write(const SequenceState& s, int64_t group, int64_t n_new_tokens) const;
  // Group g's longest chain of cached blocks matching s's leading full blocks, at most
  // max_blocks long.
  std::vector<int32_t> cached_chain(const SequenceState& s, int64_t group, int64_t max_blocks) const;
  // Whether group g's cached blocks are registered under the anchor group's (anchor_group()).
  bool anchored(int64_t g) const { return config_.anchor_group() >= 0 && g != config_.anchor_group(); }
  // find_prefix's lookup with an anchor: the longest anchor chain of k blocks for which every
  // other group caches the blocks its window needs before position k * block_size.
  void find_anchored_hit(const SequenceState& s, int64_t max_blocks, PrefixHit& hit) const;
  // The public can_allocate and allocate_slots past the lookup of the sequence and the
  // check of the hit's stamp.
  AllocStatus can_allocate(const SequenceState& s, int64_t n_new_tokens, const PrefixHit& hit,
                           int64_t num_lookahead) const;
  AllocStatus allocate_slots(SequenceState* s, int64_t n_new_tokens, const PrefixHit& hit,
                             std::span<std::vector<int64_t>> slot_mappings, std::span<const int32_t> lookahead);
  void take_prefix_hit(SequenceState& s, const PrefixHit& hit);
  void changed() { ++version_; }
  int32_t take_device_block(bool is_copy_dst);
  void release_device_block(int32_t block);
  void release_tail_to(SequenceState& s, int64_t num_blocks);
  // Releases the entries each group's window has left behind (window_dead_blocks(s.num_final, g)).
  void release_window_blocks(SequenceState& s);
  void register_final_blocks(SequenceState& s);
  void register_final_blocks(SequenceState& s, int64_t group, int64_t num_full_final_blocks);
  void drop_cache_entry(int32_t block);
  // Drops the cache entries chained onto `block` (just evicted), and theirs, transitively.
  void drop_orphans(int32_t block);
  SequenceState* find(SeqId seq);
  // The table entries that hold a block (those no window released), group by group: what
  // a swap moves.
  struct LiveEntry {
    int64_t group = 0;
    int64_t index = 0;
  };
  static std::vector<LiveEntry> live_entries(const SequenceState& s);

  void log(const KvEvent& event);
  bool logging() const { return log_ != nullptr; }

  KvCacheConfig config_;
  BlockAllocator device_;
  BlockAllocator host_;
  PrefixCache cache_;
  std::unordered_map<SeqId, SequenceState> seqs_;
  mutable const SequenceState* last_found_ = nullptr;  // lookup memo, see sequence()
  KvPlanOps ops_;
  EventLog* log_ = nullptr;
  std::vector<int64_t> rolled_back_generation_;  // per device block, see rolled_back_generation()
  uint64_t version_ = 0;                         // see version()
};

}  // namespace kvp
