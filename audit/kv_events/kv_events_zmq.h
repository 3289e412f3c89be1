// KV-event streams over ZMQ, as vLLM's ZmqEventPublisher serves them (docs/kv-events.md): a
// subscriber that recovers lost batches from the replay endpoint, and a publisher with that
// endpoint (kvproof's own stream, and the loopback tests). Every wait has a timeout.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "audit/kv_events/kv_events.h"
#include "common/status.h"

namespace kvp::kv_events {

struct SubscribeOptions {
  std::string endpoint;          // the PUB endpoint, "tcp://HOST:PORT"
  std::string replay_endpoint;   // the ROUTER endpoint; empty: gaps are not recovered
  double duration_s = 10;        // how long to listen at most
  double idle_s = 0;             // > 0: stop once nothing arrived for this long (after a first batch)
  int replay_timeout_ms = 2000;  // the longest wait for one replay reply
};

struct Subscription {
  std::vector<EventBatch> batches;  // in arrival order; replayed batches where the gap was seen
  int64_t frames = 0, replayed = 0;
};

// Listens for `duration_s` and decodes every batch. With a replay endpoint, a first batch
// numbered above 0 asks for the batches before it (a subscriber that joined late), and a gap
// asks for the lost ones. Errors (bad input): a malformed endpoint,
// a message that is not (topic, 8-byte seq, payload) or does not decode, a replay endpoint that
// does not answer in time, and no batch at all in the whole duration (ZMQ connects in the
// background, so a refused connection shows up as silence).
Result<Subscription> subscribe(const SubscribeOptions& options);

// A PUB socket and an optional ROUTER replay socket, bound; batches are numbered from 0 and the
// last `buffer` kept for replay. Not thread-safe: one thread publishes and serves replays.
class Publisher {
 public:
  static Result<std::unique_ptr<Publisher>> bind(const std::string& endpoint, const std::string& replay_endpoint,
                                                 std::size_t buffer = 10000);
  ~Publisher();
  // Encodes and sends the batch (its seq is set to the next number); returns that number.
  int64_t publish(EventBatch batch, Encoding encoding = Encoding::kArray);
  // Buffers the batch for replay and numbers it, without sending it (a lost batch, for tests).
  int64_t publish_lost(EventBatch batch, Encoding encoding = Encoding::kArray);
  // The endpoints as bound (a "*" port resolved).
  std::string endpoint() const;
  std::string replay_endpoint() const;
  // Answers the replay requests waiting, for up to `wait_ms` for the first.
  void serve_replay(int wait_ms);

 private:
  struct Sockets;
  explicit Publisher(std::unique_ptr<Sockets> s, std::size_t buffer);
  std::unique_ptr<Sockets> s_;
  std::size_t buffer_;
  int64_t next_seq_ = 0;
  std::deque<Frame> sent_;
};

// Binds a publisher and waits `wait_s` for subscribers to connect (a PUB socket drops what it
// sends before they have): what `--kv-events-publish` does before the engine runs.
Result<std::unique_ptr<Publisher>> start_publishing(const std::string& endpoint, const std::string& replay_endpoint,
                                                    double wait_s = 0.5);

}  // namespace kvp::kv_events
