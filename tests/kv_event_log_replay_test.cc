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

// KV-cache groups: a manager with a full group and two windowed ones logs every table change
// with its group (and a prefix hit's entries before a window as released shares); the log
// replays cleanly, through hits, forks, copy-on-write, swaps, truncation and the windows.
TEST(EventLogReplay, AManagerLogWithKvCacheGroupsReplaysCleanly) {
  KvCacheConfig c;
  c.pool.num_device_blocks = 48;
  c.pool.num_host_blocks = 24;
  c.pool.block_size = 4;
  c.poison_on_free = true;
  c.group_windows = {6, 0, 6};
  KvCacheManager m(c);
  EventLog log;
  m.set_event_log(&log);
  V prompt(21);
  std::iota(prompt.begin(), prompt.end(), 1);
  std::vector<std::vector<int64_t>> slots(3);
  const auto allocate = [&](SeqId s, int64_t n) {
    return m.allocate_slots(s, n, m.find_prefix(s), std::span<std::vector<int64_t>>(slots));
  };
  ASSERT_TRUE(m.add_sequence(1, 0, prompt).is_ok());
  ASSERT_EQ(allocate(1, 21), AllocStatus::kOk);
  ASSERT_TRUE(m.mark_final(1, 21).is_ok());
  ASSERT_TRUE(m.add_sequence(2, 0, prompt).is_ok());
  ASSERT_EQ(m.find_prefix(2).num_tokens, 20);
  ASSERT_EQ(allocate(2, 1), AllocStatus::kOk);  // a hit: groups 0 and 2 take entries 0..2 released
  ASSERT_TRUE(m.mark_final(2, 21).is_ok());
  ASSERT_TRUE(m.fork(2, 3).is_ok());
  ASSERT_TRUE(m.append_tokens(3, V{5}).is_ok());
  ASSERT_EQ(allocate(3, 1), AllocStatus::kOk);  // copy-on-write in every group
  ASSERT_TRUE(m.swap_out(3).is_ok());
  ASSERT_TRUE(m.truncate(1, 21).is_ok());
  ASSERT_TRUE(m.swap_in(3).is_ok());
  for (SeqId s : {1, 2, 3}) ASSERT_TRUE(m.free(s).is_ok());
  m.flush_prefix_cache();
  const std::string text = log.text();
  EXPECT_NE(text.find("\"groups\":[6,0,6]"), std::string::npos) << text;
  EXPECT_NE(text.find("\"block\":-1,\"reason\":\"prefix_hit\",\"group\":2"), std::string::npos) << text;
  const ReplayResult r = replay_event_log(text);
  EXPECT_TRUE(r.ok()) << r.message << "\n" << text;
  EXPECT_EQ(r.sequences, 0);
  EXPECT_EQ(r.device_in_use, 0);
}

constexpr const char* kGroupsInit =
    R"({"ev":"init","device_blocks":8,"host_blocks":2,"block_size":4,"global_prefix":false,"groups":[0,4]})";

TEST(EventLogReplay, CatchesKvCacheGroupViolations) {
  const std::string add = R"({"ev":"add","seq":1,"tenant":0})";
  // A group the init does not name.
  expect_failure(replay_lines({kGroupsInit, add, R"({"ev":"alloc","seq":1,"block":0,"group":2})"}), Kind::kMalformed,
                 "names group 2 of a log with 2 KV-cache groups");
  // One group's table left one block long.
  expect_failure(replay_lines({kGroupsInit, add, R"({"ev":"alloc","seq":1,"block":0})",
                               R"({"ev":"alloc","seq":1,"block":1,"group":1})",
                               R"({"ev":"alloc","seq":1,"block":2,"group":1})", R"({"ev":"slots","seq":1,"len":4})"}),
                 Kind::kViolation, "has 2 blocks in group 1 for length 4");
  // One block in two groups' tables.
  expect_failure(replay_lines({kGroupsInit, add, R"({"ev":"alloc","seq":1,"block":0})",
                               R"({"ev":"share","seq":1,"block":0,"reason":"fork","group":1})"}),
                 Kind::kViolation, "names a block twice");
  // A window release in the full group (0).
  const std::vector<std::string> eight = {kGroupsInit,
                                          add,
                                          R"({"ev":"alloc","seq":1,"block":0})",
                                          R"({"ev":"alloc","seq":1,"block":1})",
                                          R"({"ev":"alloc","seq":1,"block":2,"group":1})",
                                          R"({"ev":"alloc","seq":1,"block":3,"group":1})",
                                          R"({"ev":"slots","seq":1,"len":8})"};
  std::vector<std::string> full = eight;
  full.push_back(R"({"ev":"window_release","seq":1,"index":0,"block":0})");
  expect_failure(replay_lines(full), Kind::kViolation, "window_release in group 0, which has no window");
  // The windowed group's block 0 (positions 0..3) released while position 7 attends from 4:
  // allowed; block 1 (4..7): not.
  std::vector<std::string> ok = eight;
  ok.push_back(R"({"ev":"window_release","seq":1,"index":0,"block":2,"group":1})");
  EXPECT_EQ(replay_lines(ok).kind, Kind::kOk) << replay_lines(ok).message;
  std::vector<std::string> early = ok;
  early.push_back(R"({"ev":"window_release","seq":1,"index":1,"block":3,"group":1})");
  expect_failure(replay_lines(early), Kind::kViolation, "I11: window_release");
  // A prefix hit's released entry: only in a windowed group, and the hit's length must leave
  // it behind the window (a 4-token hit: position 3 attends from 0).
  expect_failure(replay_lines({kGroupsInit, add, R"({"ev":"share","seq":1,"block":-1,"reason":"prefix_hit"})"}),
                 Kind::kViolation, "not a prefix hit's in a windowed group");
  expect_failure(
      replay_lines({kGroupsInit, R"({"ev":"add","seq":2,"tenant":0})", add, R"({"ev":"alloc","seq":2,"block":0})",
                    R"({"ev":"alloc","seq":2,"block":1,"group":1})", R"({"ev":"slots","seq":2,"len":4})",
                    R"({"ev":"cache","block":0})", R"({"ev":"share","seq":1,"block":0,"reason":"prefix_hit"})",
                    R"({"ev":"share","seq":1,"block":-1,"reason":"prefix_hit","group":1})",
                    R"({"ev":"slots","seq":1,"len":4})"}),
      Kind::kViolation, "I11: sequence 1 has 1 released entries in group 1");
}

}  // namespace
}  // namespace kvp
