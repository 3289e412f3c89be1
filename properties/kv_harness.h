// A driver for KvCacheManager shared by the property tests and the operation fuzzer.
//
// It plays the backend and keeps a trivial model beside the manager:
//   - a simulated KV pool: each device and host slot holds the (tenant, position, token)
//     written there, or nothing / poison. Plan ops are applied in the documented order and
//     every slot mapping is "written". After every command, every position of every
//     resident sequence must read back its own (tenant, position, token) through its block
//     table: a wrong slot, a skipped copy-on-write, a wrong prefix hit, a lost swap or a
//     stale block all show up here (I3, I4, I5, I7 end to end).
//   - per sequence: its tokens, slot count and residency, compared with the manager's.
// A failed allocation or swap must leave a snapshot of the whole state unchanged
// (atomicity). How much is checked after each command is the harness's scope:
//   kEverything (the property tests): every invariant checker (check_all) and every
//       resident sequence read back through its table, after every command;
//   kTouched (the operation fuzzer): work in proportion to the command: the sequences it
//       touched are compared with the model and read back, each allocation's slots are
//       checked (I3, I5 for the plan), and every kFullCheckEvery commands, and in drain(),
//       everything is checked as in kEverything. A corruption of a sequence the command did
//       not touch (a skipped copy-on-write seen by the other holder, a refcount left
//       behind) is found at the next full check, within the same input.
// OpKind::kSpeculate is a speculative step: draft tokens given to allocate_slots as lookahead
// (appended with slots, written, or refused having changed nothing),
// never final, then all but the accepted ones rolled back with truncate and the accepted
// ones marked final; the prefix cache must never register a rejected draft (I9), and every
// kept position must read back its own token.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "optimized/checkers/invariants.h"
#include "optimized/kv/kv_cache_manager.h"

namespace kvp::testing {

// What one command does (KvHarness::apply). Fuzzers and properties draw an integer and map it
// with Op::drawn (the draw modulo kCount), so every draw names a kind and a checked-in fuzz
// input keeps its meaning.
enum class OpKind : uint8_t {
  kPrefill,       // add a sequence, prefill its prompt past the cached prefix
  kPrefillChunk,  // the same, prefilling none, half or all of it (chunked prefill)
  kAppend,        // append 1 to 3 tokens, final or not
  kFork,          // fork a sequence (refused when it is swapped)
  kTruncate,      // truncate a sequence
  kFree,          // free a sequence
  kSwapOut,       // swap a sequence out (a failure changes nothing)
  kSwapIn,        // swap it in (succeeds exactly when can_swap_in says so)
  kEvict,         // evict 1 to 4 cached blocks
  kFlush,         // flush the prefix cache (one draw in four)
  kSpeculate,     // drafts appended, verified, the rejected ones rolled back
  kCount          // not a command
};
const char* op_kind_name(OpKind kind);

struct Op {
  OpKind kind = OpKind::kPrefill;
  // Arguments: each used as |x| modulo what the kind needs (which sequence, how many tokens).
  int a = 0;
  int b = 0;
  int c = 0;
  static Op drawn(int kind, int a, int b, int c);
};

enum class CheckScope { kEverything, kTouched };

class KvHarness {
 public:
  explicit KvHarness(const KvCacheConfig& config, CheckScope scope = CheckScope::kEverything);
  static constexpr int64_t kFullCheckEvery = 16;

  // Applies one command; an error describes the first broken check.
  Status apply(const Op& op);
  // Checks everything (as kEverything does after each command), then frees every sequence,
  // flushes the cache, and checks that every block is free (I6).
  Status drain();

  const KvCacheManager& manager() const { return m_; }
  KvCacheManager& manager() { return m_; }
  int64_t commands() const { return commands_; }
  static constexpr int kNumKinds = static_cast<int>(OpKind::kCount);

 private:
  struct Cell {
    int64_t tenant = -1;  // -1: never written; -2: poison
    int64_t position = 0;
    int32_t token = 0;
    friend bool operator==(const Cell&, const Cell&) = default;
  };
  struct ModelSeq {
    int64_t tenant = 0;
    std::vector<int32_t> tokens;
    int64_t num_slots = 0;
    bool swapped = false;
  };
  struct Snapshot {
    std::vector<int32_t> free_list, evictable_list, host_free_list;
    std::vector<int32_t> refcounts;
    std::map<SeqId, std::vector<std::vector<int32_t>>> tables;  // per KV-cache group
    std::map<SeqId, int64_t> slots;
    std::map<SeqId, std::vector<int32_t>> tokens;
    uint64_t version = 0;
    int64_t cache_size = 0;
    size_t ops = 0;
    friend bool operator==(const Snapshot&, const Snapshot&) = default;
  };

  // The model's own tenant scope (not the manager's salt), so a scoping bug shows up.
  int64_t scope_of(const ModelSeq& s) const { return config_.global_prefix_sharing ? 0 : s.tenant; }
  Snapshot snapshot() const;
  std::vector<int32_t> make_prompt(int a, int b, int c) const;
  SeqId pick(int a) const;  // an existing sequence (or -1)
  // allocate_slots(s, n, find_prefix(s), ..., lookahead), checked against can_allocate and
  // the model; a refusal must change nothing.
  Status allocate(SeqId s, int64_t n, std::span<const int32_t> lookahead = {});
  // One method per command (see OpKind); each returns an error only for a broken check.
  Status add_and_prefill(int a, int b, int c, bool chunked);
  Status append(int a, int b, int c);
  Status fork(int a);
  Status truncate(int a, int b);
  Status free_sequence(int a);
  Status swap_out(int a);
  Status swap_in(int a);
  Status speculate(int a, int b, int c);
  void apply_plan_ops();
  Status check();                   // everything
  Status check_sequence(SeqId id);  // one sequence against the model, read back through its table
  void touch(SeqId s) { touched_.push_back(s); }

  KvCacheConfig config_;
  KvCacheManager m_;
  std::vector<Cell> device_pool_, host_pool_;
  std::map<SeqId, ModelSeq> model_;
  SeqId next_id_ = 0;
  ChainHashMemo hash_memo_;
  int64_t commands_ = 0;
  CheckScope scope_;
  std::vector<SeqId> touched_;  // by the current command
};

}  // namespace kvp::testing
