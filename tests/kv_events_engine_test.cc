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

}  // namespace
}  // namespace kvp::kv_events
