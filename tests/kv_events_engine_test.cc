// kvproof's own engine as a KV-event publisher (verify/kv_events_engine.h), end to end: the
// isolation audit publishes its stream on a real ZMQ socket on the loopback, a subscriber
// thread records it (recovering the start from the replay endpoint), and the stream that
// arrived is audited and checked against the engine's own event log.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <variant>

#include "audit/audit.h"
#include "audit/kv_events/kv_events_audit.h"
#include "audit/kv_events/kv_events_zmq.h"
#include "model/presets.h"
#include "optimized/engine/workload.h"
#include "verify/kv_events_engine.h"

namespace kvp::kv_events {
namespace {

TEST(KvEventEngine, AuditPublishesAStreamThatPassesAndMatchesItsEventLog) {
  const Model model = *make_preset("tiny");
  auto pub = Publisher::bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
  ASSERT_TRUE(pub.is_ok()) << pub.status().message();
  SubscribeOptions so;
  so.endpoint = (*pub)->endpoint();
  so.replay_endpoint = (*pub)->replay_endpoint();
  so.duration_s = 60;
  so.idle_s = 2.5;  // well above a step's time, under ASan too
  std::optional<Result<Subscription>> sub;
  std::thread subscriber([&] { sub.emplace(subscribe(so)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  verify::AuditOptions a;
  a.kv_events_publisher = pub->get();
  auto report = verify::run_audit(model, *builtin_workload("multi-tenant", 512, 0), a);
  // The subscriber may still ask for the start: keep answering until it is done.
  std::atomic<bool> done{false};
  std::thread replays([&] {
    while (!done) (*pub)->serve_replay(20);
  });
  subscriber.join();
  done = true;
  replays.join();
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_TRUE(report->passed()) << report->summary();
  ASSERT_TRUE(sub.has_value() && sub->is_ok()) << (sub ? sub->status().message() : "no subscription");

  const auto audit = audit_kv_events((*sub)->batches, so.endpoint);
  EXPECT_TRUE(audit.passed()) << audit.summary();
  EXPECT_GT(audit.mirror.stored, 0);
  EXPECT_GT(audit.mirror.removed, 0);
  EXPECT_GE(audit.mirror.held_per_namespace.size(), 3u) << audit.summary();  // one salt per tenant
  const verify::CheckResult* stream = nullptr;
  for (const auto& c : report->checks)
    if (c.name == "kv-event-stream") stream = &c;
  ASSERT_NE(stream, nullptr);
  EXPECT_TRUE(stream->passed) << stream->detail;
  EXPECT_EQ(audit.batches, stream->count) << "every batch published arrived";
}

// verify publishes each preemption mode's engine into one stream, an AllBlocksCleared between
// them (the second engine starts empty): the stream that arrives passes the auditor (no block
// of the first mode is referenced after the clear), and each mode's stream matches its log.
TEST(KvEventEngine, VerifyPublishesBothModesWithAClearBetween) {
  const Model model = *make_preset("tiny");
  auto pub = Publisher::bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
  ASSERT_TRUE(pub.is_ok()) << pub.status().message();
  SubscribeOptions so;
  so.endpoint = (*pub)->endpoint();
  so.replay_endpoint = (*pub)->replay_endpoint();
  so.duration_s = 120;
  so.idle_s = 5;  // verify's oracle checks run between steps: well above their time, under ASan too
  std::optional<Result<Subscription>> sub;
  std::thread subscriber([&] { sub.emplace(subscribe(so)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  verify::VerifyOptions v;
  v.kv_events_publisher = pub->get();
  auto report = verify::run_verify(model, *builtin_workload("shared-prefix", model.config.vocab_size, 0), v);
  std::atomic<bool> done{false};
  std::thread replays([&] {
    while (!done) (*pub)->serve_replay(20);
  });
  subscriber.join();
  done = true;
  replays.join();
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_TRUE(report->passed()) << report->table();
  ASSERT_TRUE(sub.has_value() && sub->is_ok()) << (sub ? sub->status().message() : "no subscription");

  int64_t per_mode_batches = 0;
  int modes = 0;
  for (const auto& c : report->checks) {
    if (c.name.rfind("kv-event-stream[", 0) != 0) continue;
    ++modes;
    EXPECT_TRUE(c.passed) << c.name << ": " << c.detail;
    EXPECT_GT(c.count, 0) << c.name;
    per_mode_batches += c.count;
  }
  EXPECT_EQ(modes, 2);
  const auto& batches = (*sub)->batches;
  int clears = 0;
  for (const auto& b : batches)
    for (const auto& e : b.events) clears += std::holds_alternative<AllBlocksCleared>(e) ? 1 : 0;
  EXPECT_EQ(clears, 1);
  EXPECT_EQ(static_cast<int64_t>(batches.size()), per_mode_batches + 1) << "every batch published arrived";
  const auto audit = audit_kv_events(batches, so.endpoint);
  EXPECT_TRUE(audit.passed()) << audit.summary();
  EXPECT_GT(audit.mirror.stored, 0);
}

// The cross-check against the event log catches a stream that lost a removal (TensorRT-LLM
// PR #16335's class) or names the wrong hash.
TEST(KvEventEngine, StreamMissingARemovalDisagreesWithTheEventLog) {
  std::vector<KvEvent> log = {kv_event::Cache{3}, kv_event::Cache{4}, kv_event::Evict{3}};
  BlockStored s3, s4;
  s3.block_hashes = {"0x03"};
  s4.block_hashes = {"0x04"};
  EventBatch b;
  b.seq = 0;
  b.events = {s3, s4};
  EXPECT_TRUE(check_stream_against_event_log({log[0], log[1]}, {b}).is_ok());
  const Status missing = check_stream_against_event_log(log, {b});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.message().find("evict of block 3): not in the stream"), std::string::npos) << missing.message();
  EventBatch wrong = b;
  wrong.events.push_back(BlockRemoved{{"0x04"}, "GPU", std::nullopt});
  const Status named = check_stream_against_event_log(log, {wrong});
  ASSERT_FALSE(named.is_ok());
  EXPECT_NE(named.message().find("the block was stored as 0x03"), std::string::npos) << named.message();
}

// KV-cache groups: each event carries its block's group (vLLM's group_idx) and every group is
// published under the request's one chain of hashes. A full group (the anchor) and one of
// window 8, blocks of 4: 16 positions final cache the full group's 4 blocks, then the windowed
// group's 4 (cached before its window releases the first (16 - 7) / 4 = 2, which stay cached
// and evictable), each under the hash of the same positions and the parent of the positions
// before. A second request of other tokens then evicts all 8, each removal in the group its
// block was stored in.
TEST(KvEventEngine, GroupsPublishGroupIdxUnderOneChainOfHashes) {
  KvCacheConfig c;
  c.pool.block_size = 4;
  c.pool.num_device_blocks = 8;  // 16 positions in both groups' tables before the window's release
  c.pool.num_host_blocks = 0;
  c.enable_prefix_caching = true;
  c.group_windows = {0, 8};
  KvCacheManager kv(c);
  EventLog log;
  kv.set_event_log(&log);
  EngineKvEvents stream(kv, nullptr);
  log.set_listener([&](const KvEvent& e) { stream.on_event(e); });
  const auto run = [&](SeqId id, int32_t first_token) {
    std::vector<int32_t> tokens(16);
    for (int32_t i = 0; i < 16; ++i) tokens[static_cast<size_t>(i)] = first_token + i;
    ASSERT_TRUE(kv.add_sequence(id, 0, tokens).is_ok());
    std::vector<std::vector<int64_t>> slots(2);
    ASSERT_EQ(kv.allocate_slots(id, 16, kv.find_prefix(id), std::span<std::vector<int64_t>>(slots)), AllocStatus::kOk);
    ASSERT_TRUE(kv.mark_final(id, 16).is_ok());
    stream.end_step();
    ASSERT_TRUE(kv.free(id).is_ok());
  };
  run(1, 100);
  ASSERT_EQ(stream.batches().size(), 1u);
  std::vector<const BlockStored*> stored;
  for (const auto& e : stream.batches()[0].events) stored.push_back(std::get_if<BlockStored>(&e));
  ASSERT_EQ(stored.size(), 8u);
  for (const BlockStored* s : stored) ASSERT_NE(s, nullptr);
  // The anchor first: its chain 0..3, then the windowed group's.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(stored[static_cast<size_t>(i)]->group_idx, std::optional<int64_t>(0)) << i;
    if (i > 0) {
      EXPECT_EQ(stored[static_cast<size_t>(i)]->parent_block_hash,
                std::optional<BlockHash>(stored[static_cast<size_t>(i - 1)]->block_hashes.front()));
    }
  }
  EXPECT_FALSE(stored[0]->parent_block_hash.has_value());
  EXPECT_EQ(stored[0]->extra_keys.dump(), R"([["tenant:0"]])");
  for (int k = 0; k < 4; ++k) {
    const BlockStored& w = *stored[static_cast<size_t>(4 + k)];
    EXPECT_EQ(w.group_idx, std::optional<int64_t>(1));
    EXPECT_EQ(w.block_hashes, stored[static_cast<size_t>(k)]->block_hashes) << "the same positions' hash";
    EXPECT_EQ(w.parent_block_hash, stored[static_cast<size_t>(k)]->parent_block_hash) << "the positions before's";
    EXPECT_EQ(w.extra_keys.dump(), stored[static_cast<size_t>(k)]->extra_keys.dump()) << "a root's tenant salt";
  }
  run(2, 500);  // 8 blocks of other tokens: every cached block evicted
  int64_t removed[2] = {0, 0};
  for (const auto& e : stream.batches()[1].events)
    if (const auto* r = std::get_if<BlockRemoved>(&e)) {
      ASSERT_TRUE(r->group_idx.has_value());
      ++removed[*r->group_idx];
    }
  EXPECT_EQ(removed[0], 4);
  EXPECT_EQ(removed[1], 4);
  const auto audit = audit_kv_events(stream.batches(), "groups");
  EXPECT_TRUE(audit.passed()) << audit.summary();
  EXPECT_TRUE(check_stream_against_event_log(log.events(), stream.batches()).is_ok());

  // A removal published in the wrong group: both the auditor (the group does not hold it)
  // and the event-log cross-check (it was stored in group 1) name it.
  std::vector<EventBatch> planted = stream.batches();
  for (auto& e : planted[1].events)
    if (auto* r = std::get_if<BlockRemoved>(&e); r != nullptr && r->group_idx == 1) {
      r->group_idx = 0;
      break;
    }
  const auto wrong = audit_kv_events(planted, "planted");
  ASSERT_FALSE(wrong.passed());
  EXPECT_EQ(wrong.violations.front().reason, "removed-not-stored") << wrong.summary();
  const Status against = check_stream_against_event_log(log.events(), planted);
  ASSERT_FALSE(against.is_ok());
  EXPECT_NE(against.message().find("from group 0"), std::string::npos) << against.message();
  EXPECT_NE(against.message().find("stored in group 1"), std::string::npos) << against.message();
}

}  // namespace
}  // namespace kvp::kv_events
