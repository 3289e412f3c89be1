// kvproof's own engine as a KV-event publisher (docs/kv-events.md): the manager's prefix-cache
// registrations and drops, as vLLM's BlockStored / BlockRemoved, one batch per engine step.
//
// A registration (kv_event::Cache) becomes a BlockStored of the block's chain hash (bytes),
// its parent's hash, its tokens and the block size; a root block (a sequence's first) carries
// the tenant salt in its extra_keys as "tenant:N" unless prefix sharing is global, as vLLM
// publishes a cache salt. A drop (kv_event::Evict) becomes a BlockRemoved of that hash. The
// medium is "GPU": kvproof's prefix cache names device blocks only.
//
// With KV-cache groups (KvCacheConfig::group_windows), each event carries its block's group
// as group_idx, and every group's chain is published under the request's one chain of hashes,
// as vLLM does: a group's block i is stored under the hash of the first i + 1 blocks and the
// parent hash of block i - 1, whichever group's table named that one. (The manager registers a
// windowed group's block under the anchor's block of the same positions; its published parent
// is that block's parent.)
#pragma once

#include <optional>
#include <unordered_map>
#include <vector>

#include "audit/kv_events/kv_events.h"
#include "audit/kv_events/kv_events_zmq.h"
#include "common/status.h"
#include "optimized/kv/kv_cache_manager.h"
#include "verify/verify.h"

namespace kvp::kv_events {

class EngineKvEvents {
 public:
  // `kv` must outlive this; `publisher` may be nullptr (the stream is only kept).
  EngineKvEvents(const KvCacheManager& kv, Publisher* publisher) : kv_(kv), publisher_(publisher) {}
  // Called with every event the manager records, right after the change (EventLog::set_listener).
  void on_event(const KvEvent& event);
  // Sends the events since the last call as one batch (none: nothing sent).
  void end_step();
  // Every batch, in order, with its sequence number.
  const std::vector<EventBatch>& batches() const { return batches_; }

 private:
  const KvCacheManager& kv_;
  Publisher* publisher_;
  struct Published {
    BlockHash hash;
    std::optional<BlockHash> parent;
    std::optional<int64_t> group;
  };
  std::unordered_map<int32_t, Published> published_;  // cached blocks, as stored
  std::vector<KvCacheEvent> pending_;
  std::vector<EventBatch> batches_;
};

// kvproof's stream against kvproof's own event log: the log's registrations and drops and the
// stream's stores and removals pair one to one, in order, a drop naming the hash its block was
// stored under, in the group it was stored in (group_idx), and nothing else is in the stream.
// The error names the first mismatch.
Status check_stream_against_event_log(const std::vector<KvEvent>& log, const std::vector<EventBatch>& stream);

// The check `audit` and `verify` report for kvproof's own stream: it passes the KV-event
// auditor (audit_kv_events) and matches the event log it came from; the detail names the
// first violation or mismatch, else the stores and removals seen.
verify::CheckResult check_engine_stream(std::string name, const std::vector<KvEvent>& log,
                                        const std::vector<EventBatch>& stream, bool published);

}  // namespace kvp::kv_events
