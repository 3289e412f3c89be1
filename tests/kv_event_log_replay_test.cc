#include "optimized/checkers/event_log_replay.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "optimized/kv/kv_cache_manager.h"

namespace kvp {
namespace {

using Kind = ReplayResult::Kind;
using V = std::vector<int32_t>;

constexpr const char* kInit = R"({"ev":"init","device_blocks":4,"host_blocks":2,"block_size":4,"global_prefix":false})";

ReplayResult replay_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  return replay_event_log(text);
}

void expect_failure(const ReplayResult& r, Kind kind, const std::string& fragment) {
  EXPECT_EQ(r.kind, kind) << r.message;
  EXPECT_NE(r.message.find(fragment), std::string::npos) << r.message;
}

TEST(EventLogReplay, AManagerLogReplaysCleanly) {
  KvCacheConfig c;
  c.pool.num_device_blocks = 6;
  c.pool.num_host_blocks = 4;
  c.pool.block_size = 4;
  c.poison_on_free = true;
  KvCacheManager m(c);
  EventLog log;
  m.set_event_log(&log);
  V prompt(9);
  std::iota(prompt.begin(), prompt.end(), 1);
  std::vector<int64_t> slots;
  ASSERT_TRUE(m.add_sequence(1, 3, prompt).is_ok());
  ASSERT_TRUE(m.allocate_slots(1, 9, slots).is_ok());
  ASSERT_TRUE(m.mark_final(1, 9).is_ok());
  ASSERT_TRUE(m.add_sequence(2, 3, prompt).is_ok());
  ASSERT_TRUE(m.allocate_slots(2, 9 - m.cached_prefix_tokens(2), slots).is_ok());
  ASSERT_TRUE(m.fork(2, 3).is_ok());
  ASSERT_TRUE(m.append_tokens(3, V{5}).is_ok());
  ASSERT_TRUE(m.allocate_slots(3, 1, slots).is_ok());  // copy-on-write
  ASSERT_TRUE(m.swap_out(3).is_ok());
  ASSERT_TRUE(m.truncate(1, 5).is_ok());
  ASSERT_TRUE(m.swap_in(3).is_ok());
  ASSERT_TRUE(m.free(1).is_ok());
  ASSERT_TRUE(m.free(2).is_ok());
  ASSERT_TRUE(m.free(3).is_ok());
  m.flush_prefix_cache();
  const ReplayResult r = replay_event_log(log.text());
  EXPECT_TRUE(r.ok()) << r.message << "\n" << log.text();
  EXPECT_EQ(r.sequences, 0);
  EXPECT_EQ(r.device_in_use, 0);
  EXPECT_EQ(r.device_cached, 0);
  EXPECT_GT(r.lines, 20);
  // The typed events (no JSON) replay to the same end state.
  const ReplayResult typed = replay_events(log.events());
  EXPECT_TRUE(typed.ok()) << typed.message;
  EXPECT_EQ(typed.lines, r.lines);
  EXPECT_EQ(typed.device_in_use, r.device_in_use);
}

// The typed path runs the same handlers: a violation is found and named by event number.
TEST(EventLogReplay, TypedEventsGetTheSameChecks) {
  const std::vector<KvEvent> events = {kv_event::Init{4, 2, 4, false}, kv_event::Add{1, 0}, kv_event::Add{2, 0},
                                       kv_event::Alloc{1, 3}, kv_event::Alloc{2, 3}};
  expect_failure(replay_events(events), Kind::kViolation, "event 5: I1: alloc of device block 3, in use");
  expect_failure(replay_events(std::vector<KvEvent>{kv_event::Add{1, 0}}), Kind::kMalformed,
                 "event 1: the first event must be init");
  expect_failure(replay_events(std::vector<KvEvent>{kv_event::Init{4, 2, 0, false}}), Kind::kMalformed,
                 "block_size must be in [1,");
}

TEST(EventLogReplay, RejectsBlockIdsBeyondInt32) {
  expect_failure(
      replay_lines({kInit, R"({"ev":"add","seq":1,"tenant":0})", R"({"ev":"alloc","seq":1,"block":4294967296})"}),
      Kind::kMalformed, "line 3: field \"block\" out of range");
}

TEST(EventLogReplay, EmptyLogIsMalformed) {
  expect_failure(replay_event_log(std::string_view("")), Kind::kMalformed, "no init");
}

TEST(EventLogReplay, NamesTheLineOfBadJson) {
  expect_failure(replay_lines({kInit, "{not json"}), Kind::kMalformed, "line 2: not valid JSON");
}

TEST(EventLogReplay, RequiresInitFirst) {
  expect_failure(replay_lines({R"({"ev":"add","seq":1,"tenant":0})"}), Kind::kMalformed,
                 "line 1: the first event must be init");
}

TEST(EventLogReplay, RejectsMissingAndIllTypedFields) {
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":1})"}), Kind::kMalformed,
                 "line 2: missing field \"tenant\"");
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":"x","tenant":0})"}), Kind::kMalformed,
                 "field \"seq\" is not an integer");
  expect_failure(replay_lines({kInit, R"({"ev":"nope"})"}), Kind::kMalformed, "unknown event \"nope\"");
  expect_failure(replay_lines({kInit, "[1,2]"}), Kind::kMalformed, "not a JSON object");
}

TEST(EventLogReplay, CatchesAllocationOfABlockInUse) {
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":1,"tenant":0})", R"({"ev":"alloc","seq":1,"block":0})",
                               R"({"ev":"add","seq":2,"tenant":0})", R"({"ev":"alloc","seq":2,"block":0})"}),
                 Kind::kViolation, "line 5: I1: alloc of device block 0, in use");
}

TEST(EventLogReplay, CatchesAPrefixHitAcrossTenants) {
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":1,"tenant":1})", R"({"ev":"alloc","seq":1,"block":2})",
                               R"({"ev":"cache","block":2})", R"({"ev":"add","seq":2,"tenant":9})",
                               R"({"ev":"share","seq":2,"block":2,"reason":"prefix_hit"})"}),
                 Kind::kViolation, "line 6: I4: prefix hit shares device block 2 of tenant 1");
}

TEST(EventLogReplay, CatchesAReleaseOutOfTailOrder) {
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":1,"tenant":0})", R"({"ev":"alloc","seq":1,"block":0})",
                               R"({"ev":"alloc","seq":1,"block":1})", R"({"ev":"release","seq":1,"block":0})"}),
                 Kind::kViolation, "line 5: release of block 0, which is not the tail");
}

TEST(EventLogReplay, CatchesATableThatDisagreesWithTheLength) {
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":1,"tenant":0})", R"({"ev":"alloc","seq":1,"block":0})",
                               R"({"ev":"slots","seq":1,"len":5})"}),
                 Kind::kViolation, "line 4: I5: sequence 1 has 1 blocks for length 5");
}

TEST(EventLogReplay, CatchesAFreeThatLeaksBlocks) {
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":1,"tenant":0})", R"({"ev":"alloc","seq":1,"block":3})",
                               R"({"ev":"free","seq":1})"}),
                 Kind::kViolation, "line 4: I6: free of sequence 1 that still holds 1 blocks");
}

TEST(EventLogReplay, CatchesPoisonOfABlockInUse) {
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":1,"tenant":0})", R"({"ev":"alloc","seq":1,"block":3})",
                               R"({"ev":"poison","block":3})"}),
                 Kind::kViolation, "line 4: I7: poison of device block 3, in use");
}

TEST(EventLogReplay, CatchesBlocksOutsideThePool) {
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":1,"tenant":0})", R"({"ev":"alloc","seq":1,"block":4})"}),
                 Kind::kViolation, "device block 4 outside the pool of 4");
}

TEST(EventLogReplay, CatchesAMismatchLeftAtTheEnd) {
  expect_failure(replay_lines({kInit, R"({"ev":"add","seq":1,"tenant":0})", R"({"ev":"alloc","seq":1,"block":0})"}),
                 Kind::kViolation, "end of log");
}

}  // namespace
}  // namespace kvp
