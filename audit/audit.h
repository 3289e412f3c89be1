// `kvproof audit`: evidence for an auditor that one request's cache state never reaches
// another's. One run of the paged engine on a multi-tenant workload with:
//   - poison-on-free: every freed block is filled with NaN, so a stale read (a block read
//     after it was freed, before its new owner wrote it) turns that request's logits NaN;
//     every logit of every request is scanned for NaN (I7);
//   - an ownership check of every block every plan asks attention to read: the block is in
//     use, it is the block the manager's table names at that index for the reading
//     sequence, and every sequence holding it is in the reader's tenant scope (I4);
//   - the same tenant-scope check made again by the backend itself, on the block-table rows
//     its attention kernel is about to read (BatchPlan's audit arrays), before it runs;
//   - every KV-cache invariant checker after every step;
//   - the event log written and re-checked by the independent replayer (I1-I5, and I4
//     across tenants from the log alone);
//   - every request's logits at every position against the reference (a request that read
//     another's state would not match);
//   - both halves of isolation, from the event log and the requests' tokens (the pairing
//     vLLM closed its own trap with, PR #53347: "different salt => no reuse" is vacuous
//     unless "same salt => reuse" is seen too): per tenant, the blocks the prefix cache
//     handed from one request to another of that tenant; per tenant pair, the requests with
//     an identical prefix of whole blocks, and the blocks shared between them (none unless
//     global sharing). No reuse within a tenant, or (with two tenants or more, tenant-scoped)
//     no identical prefix across tenants, means the isolation evidence is vacuous: the
//     check fails unless allow_empty.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "model/weights.h"
#include "optimized/engine/workload.h"
#include "verify/verify.h"

namespace kvp::kv_events {
class Publisher;
}

namespace kvp::verify {

struct AuditOptions {
  VerifyOptions engine;        // pool and schedule (one preemption mode: engine.modes[0])
  std::string event_log_path;  // where the log is written ("" = kept in memory only)
  bool allow_empty = false;    // pass even when the isolation evidence is vacuous
  // Where kvproof's KV-event stream (docs/kv-events.md) is also published (nullptr: it is
  // only checked). Must outlive run_audit.
  kv_events::Publisher* kv_events_publisher = nullptr;
};

// One tenant pair's evidence (tenant_a < tenant_b).
struct TenantPairEvidence {
  int64_t identical_prefix_requests = 0;  // request pairs whose tokens agree on >= 1 whole block
  int64_t longest_identical_blocks = 0;
  int64_t shared_blocks = 0;  // prefix-cache hits across the pair (0 unless global sharing)
};

struct AuditReport {
  std::vector<CheckResult> checks;
  int64_t plans = 0;
  int64_t block_reads = 0;     // (sequence, block) pairs attention read, summed over plans
  int64_t kv_reads = 0;        // K/V slot reads: per token, context positions x layers x KV heads
  int64_t blocks_checked = 0;  // distinct blocks read
  int64_t block_reuses = 0;    // allocations of a block that had held other state before
  int64_t prefix_hit_tokens = 0;
  int64_t poisoned_blocks = 0;
  int64_t tenants = 0;
  int64_t logits_scanned = 0;
  int64_t event_log_lines = 0;
  std::map<int64_t, int64_t> reuses_within_tenant;  // tenant -> prefix-cache hits from its own blocks
  std::map<std::pair<int64_t, int64_t>, TenantPairEvidence> tenant_pairs;

  bool passed() const;
  std::string summary() const;
  nlohmann::json to_json() const;
  // The job summary (--summary): the verdict, the failed checks with `reproducer`, every
  // check, then the coverage and per-tenant lines of summary().
  Summary to_summary(std::vector<std::string> context, std::string reproducer) const;
  // The HTML report's plots: the isolation evidence's two halves, the prefix cache's reuse
  // within each tenant and, per tenant pair, the identical prefixes against the blocks shared.
  std::vector<Plot> plots() const;
};

Result<AuditReport> run_audit(const Model& model, const Workload& workload, const AuditOptions& options);

}  // namespace kvp::verify
