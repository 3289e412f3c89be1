// An independent checker for KvCacheManager's event log (format: event_log.h).
//
// It rebuilds the state from the log with its own deliberately simple model (per block a
// refcount, a cached flag and the tenant whose content it holds; per sequence its tenant,
// pool, table and length), sharing no code with the allocator, and re-checks after every
// line what the line claims:
//   I1  a block is allocated only from free/evictable, released only while in use, pools
//       are never exceeded;
//   I2  refcounts equal the table entries naming each block (checked for every touched
//       block after each line and for all blocks at the end);
//   I4  a prefix hit shares only a cached block whose content came from the same tenant
//       (unless the log's init says global), fork shares only the parent's blocks;
//   I5  a table never names a block twice and holds ceil(len / block_size) blocks at each
//       "slots" event; a freed sequence has an empty table;
//   I7  a poisoned block is not in use.
// A malformed log (bad JSON, a missing or ill-typed field, an unknown event, a first line
// that is not init) is rejected with the line number and the reason.
//
// Each line is first decoded into a KvEvent (the typed form of the same format,
// optimized/kv/kv_event.h), then applied by one handler per event type. The handlers are
// also reachable without the JSON (replay_events), for callers that hold the manager's
// typed events (the operation fuzzer replays every input's log that way); the JSON decoding
// itself is what replay_event_log and fuzz_event_log check.
#pragma once

#include <cstdint>
#include <istream>
#include <span>
#include <string>
#include <string_view>

#include "optimized/kv/kv_event.h"

namespace kvp {

struct ReplayResult {
  enum class Kind { kOk, kMalformed, kViolation };
  Kind kind = Kind::kOk;
  std::string message;        // "line N: reason" unless kOk
  int64_t lines = 0;          // lines read
  int64_t sequences = 0;      // sequences alive at the end
  int64_t device_in_use = 0;  // device blocks with refcount > 0 at the end
  int64_t device_cached = 0;  // device blocks cached at the end
  int64_t host_in_use = 0;

  bool ok() const { return kind == Kind::kOk; }
};

// Replays a whole log. Empty lines are skipped; an empty log is malformed (no init).
ReplayResult replay_event_log(std::istream& in);
ReplayResult replay_event_log(std::string_view text);
// Replays typed events (EventLog::events()): the same checks, messages say "event N".
ReplayResult replay_events(std::span<const KvEvent> events);

}  // namespace kvp
