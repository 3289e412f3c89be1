// The auditor of a KV-event stream (docs/kv-events.md): pure functions over decoded batches,
// one checker per invariant. Each checker replays the stream on its own, so a bug in one
// cannot hide a violation from another; each violation names the batch's sequence number and
// the block hash.
//
// The mirror a consumer (a router, a cache manager) keeps is a set of held block hashes per
// medium: BlockStored adds, BlockRemoved takes away, AllBlocksCleared empties every medium.
// A namespace is what may share a block: the LoRA adapter (lora_name, else lora_id) and the
// cache salt. vLLM mixes the salt into the hash of a request's first block only, and publishes
// it in that block's extra_keys; the blocks after it inherit the salt through the chain. A
// salt is recognised (a) in a map entry's "cache_salt" key, where extra_keys (or one block's
// entry) is a map, as SGLang publishes it; (b) for a root block (no parent), as a string in
// its extra_keys entry that is not the event's lora_name (vLLM: LoRA name, multimodal keys as
// [identifier, offset] arrays, the salt, prompt-embedding hashes as bytes).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "audit/kv_events/kv_events.h"
#include "common/html_report.h"

namespace kvp::kv_events {

// Violation reasons, one per checker (a checker may report more than one).
inline constexpr const char* kSequenceGap = "sequence-gap";
inline constexpr const char* kRemovedNotStored = "removed-not-stored";
inline constexpr const char* kStoredTwice = "stored-twice";
inline constexpr const char* kTokenCount = "token-count";
inline constexpr const char* kBlockSizeChanged = "block-size-changed";
inline constexpr const char* kNamespaceCrossing = "namespace-crossing";
inline constexpr const char* kNamespaceMerge = "namespace-merge";
inline constexpr const char* kStaleAfterClear = "stale-after-clear";

struct Violation {
  std::string reason;      // one of the constants above
  int64_t seq = 0;         // the batch's sequence number
  std::string block_hash;  // empty where no block is concerned (a gap)
  std::string detail;
};

// The batches in sequence order, each sequence number once (a duplicate delivery, such as a
// batch seen live and again in a replay, keeps the first copy). Every checker below takes
// its input through this.
std::vector<EventBatch> in_sequence(const std::vector<EventBatch>& batches);

// Gaps between the lowest and the highest sequence number (lost batches), one per gap,
// reported at the batch after it.
std::vector<Violation> check_sequence(const std::vector<EventBatch>& batches);
// A removal names a block its medium does not hold (a block removed before an
// AllBlocksCleared is left to check_no_reference_after_clear).
std::vector<Violation> check_removed_were_stored(const std::vector<EventBatch>& batches);
// A block stored in a medium that already holds it (no removal between).
std::vector<Violation> check_stored_once(const std::vector<EventBatch>& batches);
// token_ids.size() == block_size * block_hashes.size() (every published block is full), and
// one block size per stream (per KV-cache group where group_idx is given).
std::vector<Violation> check_block_sizes(const std::vector<EventBatch>& batches);
// A block's namespace equals its parent's (crossing); one hash never names blocks of two
// namespaces (merge: a hash that ignores the salt or the adapter).
std::vector<Violation> check_namespaces(const std::vector<EventBatch>& batches);
// After AllBlocksCleared, a block stored before it (and not stored again since) is never
// named again: as a parent, or in a removal.
std::vector<Violation> check_no_reference_after_clear(const std::vector<EventBatch>& batches);

// The namespace of each block of a store event, in block order ("lora=NAME salt=SALT"; the
// base model without a salt is "base"). `parent_ns` is the parent's, when known.
std::vector<std::string> block_namespaces(const BlockStored& e, const std::string* parent_ns);

// The mirror at the end of the stream.
struct Mirror {
  std::map<std::string, int64_t> held_per_medium;
  std::map<std::string, int64_t> held_per_namespace;
  int64_t stored = 0, removed = 0, clears = 0;
  std::vector<std::string> never_removed;  // "MEDIUM HASH", in store order
};
Mirror mirror_at_end(const std::vector<EventBatch>& batches);

struct KvEventAudit {
  std::string source;
  int64_t frames = 0, batches = 0, duplicates = 0, events = 0;
  int64_t first_seq = -1, last_seq = -1;
  std::vector<Violation> violations;  // by checker, then by stream order
  Mirror mirror;

  bool passed() const { return violations.empty(); }
  std::string summary() const;
  nlohmann::json to_json() const;
  // The job summary (--summary): the verdict, a row per checker (its violations, the first
  // named in full; the first 20 violations after the table), then the mirror at the end.
  verify::Summary to_summary(std::string reproducer) const;
  // The HTML report's plots: violations per checker, and the blocks held at the end per
  // namespace (cache salt, adapter).
  std::vector<verify::Plot> plots() const;
};

// Every checker and the mirror over the stream. `frames` counts what arrived, duplicates too.
KvEventAudit audit_kv_events(const std::vector<EventBatch>& batches, const std::string& source);

// Reads a recorded stream (kv_events.h), decodes every frame and audits it. A file that cannot
// be read, is not a recording or holds a frame that does not decode is an error (bad input),
// never a partial audit.
Result<KvEventAudit> audit_recording(const std::filesystem::path& path);

}  // namespace kvp::kv_events
