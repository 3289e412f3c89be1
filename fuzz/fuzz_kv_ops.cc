// Operation-stream fuzzer over KvCacheManager: the first bytes choose a configuration, then
// each 7 bytes are one command (at most kMaxCommands) (add, append, fork, truncate, free, swap out/in, evict,
// flush) run by the same harness as the property tests (properties/kv_harness.h), in its
// kTouched scope: after every command the sequences it touched against the model and the
// simulated KV pool, each allocation's slots, atomicity of every failure; every 16 commands
// and at the end every invariant checker and every sequence; then a full drain (I6) and a
// replay of the manager's typed event log by the independent replayer (KV-cache groups
// included: the events name their group). Any violation aborts.
// Only the KV core is instrumented for coverage (fuzz/kv_core.allowlist), not the harness,
// the checkers or the replayer.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fuzz/byte_reader.h"
#include "optimized/checkers/event_log_replay.h"
#include "properties/kv_harness.h"

namespace {

// Commands per input. 64 commands on pools of at most 32 device and 8 host blocks still
// fill the pools, evict, copy on write and swap, and keep the fuzzer at thousands of inputs
// per second under ASan (the log replay runs once per input, at the end).
constexpr int kMaxCommands = 64;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_kv_ops: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvp::fuzz::ByteReader in(data, size);
  kvp::KvCacheConfig c;
  const uint8_t flags = in.u8();
  c.pool.block_size = 1 + in.below(5);
  c.pool.num_device_blocks = in.below(33);
  c.pool.num_host_blocks = in.below(9);
  c.watermark_blocks = c.pool.num_device_blocks == 0 ? 0 : in.below(c.pool.num_device_blocks / 4 + 1);
  c.enable_prefix_caching = (flags & 1) == 0;
  c.global_prefix_sharing = (flags & 2) != 0;
  c.poison_on_free = (flags & 4) != 0;
  c.hash_bits = (flags & 8) != 0 ? 1 + (flags >> 4) % 4 : 256;
  c.sliding_window = 3 * (flags >> 6);  // 0, 3, 6 or 9: blocks released behind the window
  // KV-cache groups, from bits 4 and 5 when the hash is whole (they size a short hash
  // otherwise): 1: a full group and a windowed one; 2: windowed, full, windowed (the anchor
  // in the middle); 3: two windowed groups (no anchor: every chain from its root). The log
  // names each event's group and the replayer keeps a table per group.
  const int groups = (flags & 8) == 0 ? (flags >> 4) & 3 : 0;
  if (groups != 0) {
    const int64_t w = c.sliding_window;
    c.sliding_window = 0;
    c.group_windows = groups == 1   ? std::vector<int64_t>{0, w}
                      : groups == 2 ? std::vector<int64_t>{w, 0, w + 1}
                                    : std::vector<int64_t>{w + 1, w + 2};
  }

  kvp::testing::KvHarness h(c, kvp::testing::CheckScope::kTouched);
  kvp::EventLog log;
  h.manager().set_event_log(&log);
  int commands = 0;
  while (!in.empty() && commands++ < kMaxCommands) {
    const int kind = in.u8();  // one statement each: the bytes are read in this order
    const int arg_a = in.u16();
    const int arg_b = in.u16();
    const int arg_c = in.u16();
    const kvp::testing::Op op = kvp::testing::Op::drawn(kind, arg_a, arg_b, arg_c);
    const kvp::Status st = h.apply(op);
    if (!st.is_ok()) fail(st.message());
  }
  const kvp::Status drained = h.drain();
  if (!drained.is_ok()) fail("drain: " + drained.message());
  const kvp::ReplayResult r = kvp::replay_events(log.events());
  if (!r.ok()) fail("replay of the manager's own log: " + r.message);
  if (r.sequences != 0 || r.device_in_use != 0 || r.host_in_use != 0 || r.device_cached != 0) {
    fail("replay ends with state left over");
  }
  return 0;
}
