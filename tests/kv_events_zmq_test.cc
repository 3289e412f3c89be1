// KV-event streams over ZMQ on the loopback (audit/kv_events/kv_events_zmq.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "audit/kv_events/kv_events_audit.h"
#include "audit/kv_events/kv_events_zmq.h"

namespace kvp::kv_events {
namespace {

EventBatch one_store(const std::string& hash, std::optional<BlockHash> parent) {
  BlockStored s;
  s.block_hashes = {hash};
  s.parent_block_hash = std::move(parent);
  s.token_ids = {1, 2};
  s.block_size = 2;
  s.medium = "GPU";
  EventBatch b;
  b.events = {s};
  return b;
}

TEST(KvEventZmq, LostBatchIsRecoveredFromTheReplayEndpoint) {
  auto pub = Publisher::bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
  ASSERT_TRUE(pub.is_ok()) << pub.status().message();
  std::atomic<bool> done{false};
  std::thread publisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscriber connects
    (*pub)->publish(one_store("0x01", std::nullopt));
    (*pub)->publish_lost(one_store("0x02", BlockHash("0x01")), Encoding::kMap);
    (*pub)->publish(one_store("0x03", BlockHash("0x02")));
    (*pub)->publish(one_store("0x04", BlockHash("0x03")));
    while (!done) (*pub)->serve_replay(20);
  });
  SubscribeOptions o;
  o.endpoint = (*pub)->endpoint();
  o.replay_endpoint = (*pub)->replay_endpoint();
  o.duration_s = 1.0;
  auto sub = subscribe(o);
  done = true;
  publisher.join();
  ASSERT_TRUE(sub.is_ok()) << sub.status().message();
  EXPECT_EQ(sub->frames, 3);
  EXPECT_GE(sub->replayed, 1);
  const auto audit = audit_kv_events(sub->batches, o.endpoint);
  EXPECT_TRUE(audit.passed()) << audit.summary();
  EXPECT_EQ(audit.batches, 4);
  EXPECT_EQ(audit.last_seq, 3);
}

TEST(KvEventZmq, WithoutReplayTheLostBatchIsAGap) {
  auto pub = Publisher::bind("tcp://127.0.0.1:*", "");
  ASSERT_TRUE(pub.is_ok()) << pub.status().message();
  std::thread publisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    (*pub)->publish(one_store("0x01", std::nullopt));
    (*pub)->publish_lost(one_store("0x02", BlockHash("0x01")));
    (*pub)->publish(one_store("0x03", BlockHash("0x02")));
  });
  SubscribeOptions o;
  o.endpoint = (*pub)->endpoint();
  o.duration_s = 0.8;
  auto sub = subscribe(o);
  publisher.join();
  ASSERT_TRUE(sub.is_ok()) << sub.status().message();
  const auto v = check_sequence(sub->batches);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].reason, kSequenceGap);
  EXPECT_EQ(v[0].seq, 2);
}

TEST(KvEventZmq, SilenceIsAnErrorNotAHang) {
  SubscribeOptions o;
  o.endpoint = "tcp://127.0.0.1:1";  // nothing listens on port 1
  o.duration_s = 0.2;
  auto sub = subscribe(o);
  ASSERT_FALSE(sub.is_ok());
  EXPECT_NE(sub.status().message().find("no batch received"), std::string::npos) << sub.status().message();
  o.endpoint = "not-an-endpoint";
  EXPECT_FALSE(subscribe(o).is_ok());
}

}  // namespace
}  // namespace kvp::kv_events
