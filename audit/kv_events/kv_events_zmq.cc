#include "audit/kv_events/kv_events_zmq.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iterator>
#include <thread>

#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace kvp::kv_events {
namespace {

using Clock = std::chrono::steady_clock;

std::string as_string(const zmq::message_t& m) { return std::string(static_cast<const char*>(m.data()), m.size()); }

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

void bound_socket(zmq::socket_t& s) {
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxPayloadBytes) + 64);
}

// Asks the replay endpoint for every batch from `from` on; appends what it sends back.
Status replay_from(zmq::context_t& ctx, const SubscribeOptions& o, int64_t from, Subscription& out) {
  zmq::socket_t req(ctx, zmq::socket_type::dealer);
  bound_socket(req);
  req.set(zmq::sockopt::rcvtimeo, o.replay_timeout_ms);
  req.set(zmq::sockopt::sndtimeo, o.replay_timeout_ms);
  req.connect(o.replay_endpoint);
  // The buffers point into these strings: they must outlive the send (a temporary's did not,
  // which ASan caught as a stack-use-after-scope).
  const std::string from_bytes = encode_seq(from);
  std::vector<zmq::const_buffer> request = {zmq::const_buffer("", 0), zmq::buffer(from_bytes)};
  if (!zmq::send_multipart(req, request))
    return Status::error(o.replay_endpoint + ": replay request not sent in " + std::to_string(o.replay_timeout_ms) +
                         " ms");
  while (true) {
    std::vector<zmq::message_t> parts;
    auto got = zmq::recv_multipart_n(req, std::back_inserter(parts), 3);
    if (!got)
      return Status::error(o.replay_endpoint + ": no replay reply in " + std::to_string(o.replay_timeout_ms) + " ms");
    // DEALER sees the ROUTER's empty delimiter first: ("", seq, payload).
    if (parts.size() != 3 || parts[0].size() != 0 || parts[1].size() != 8)
      return Status::error(o.replay_endpoint + ": a replay reply that is not (\"\", 8-byte seq, payload)");
    const int64_t seq = decode_seq(as_string(parts[1]));
    if (seq == -1) return Status::ok();
    auto b = decode_event_batch(as_string(parts[2]), seq);
    if (!b) return b.status().with_context(o.replay_endpoint + " (replay)");
    out.batches.push_back(std::move(*b));
    ++out.replayed;
  }
}

}  // namespace

Result<Subscription> subscribe(const SubscribeOptions& o) {
  Subscription out;
  try {
    zmq::context_t ctx;
    zmq::socket_t sub(ctx, zmq::socket_type::sub);
    bound_socket(sub);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(o.endpoint);
    const auto end =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.duration_s));
    int64_t last = -1;
    bool any = false;
    auto last_arrival = Clock::now();
    const auto idle = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.idle_s));
    while (Clock::now() < end) {
      if (any && o.idle_s > 0 && Clock::now() - last_arrival > idle) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(std::max<int64_t>(1, std::min<int64_t>(left, 100))));
      if ((item.revents & ZMQ_POLLIN) == 0) continue;
      std::vector<zmq::message_t> parts;
      auto got = zmq::recv_multipart_n(sub, std::back_inserter(parts), 3);
      if (!got) continue;
      ++out.frames;
      last_arrival = Clock::now();
      if (parts.size() != 3 || parts[1].size() != 8)
        return Status::error(o.endpoint + ": message " + std::to_string(out.frames) +
                             " is not (topic, 8-byte seq, payload): not a KV-event stream");
      const int64_t seq = decode_seq(as_string(parts[1]));
      if (seq > last + 1 && !o.replay_endpoint.empty()) {
        KVP_RETURN_IF_ERROR(replay_from(ctx, o, last + 1, out));
      }
      auto b = decode_event_batch(as_string(parts[2]), seq);
      if (!b) return b.status().with_context(o.endpoint);
      out.batches.push_back(std::move(*b));
      any = true;
      last = std::max(last, seq);
    }
    if (!any)
      return Status::error(o.endpoint + ": no batch received in " + seconds(o.duration_s) +
                           " s (nothing publishing there, or a refused connection)");
  } catch (const std::exception& e) {
    return Status::error(o.endpoint + ": " + e.what());
  }
  return out;
}

struct Publisher::Sockets {
  zmq::context_t ctx;
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  bool has_router = false;
};

Publisher::Publisher(std::unique_ptr<Sockets> s, std::size_t buffer) : s_(std::move(s)), buffer_(buffer) {}
Publisher::~Publisher() = default;

Result<std::unique_ptr<Publisher>> Publisher::bind(const std::string& endpoint, const std::string& replay_endpoint,
                                                   std::size_t buffer) {
  auto s = std::make_unique<Sockets>();
  try {
    bound_socket(s->pub);
    s->pub.bind(endpoint);
    if (!replay_endpoint.empty()) {
      bound_socket(s->router);
      s->router.bind(replay_endpoint);
      s->has_router = true;
    }
  } catch (const std::exception& e) {
    return Status::error("cannot bind " + endpoint + (replay_endpoint.empty() ? "" : " / " + replay_endpoint) + ": " +
                         e.what());
  }
  return std::unique_ptr<Publisher>(new Publisher(std::move(s), buffer));
}

int64_t Publisher::publish_lost(EventBatch batch, Encoding encoding) {
  batch.seq = next_seq_++;
  sent_.push_back(Frame{batch.seq, encode_event_batch(batch, encoding)});
  if (sent_.size() > buffer_) sent_.pop_front();
  return batch.seq;
}

int64_t Publisher::publish(EventBatch batch, Encoding encoding) {
  const int64_t seq = publish_lost(std::move(batch), encoding);
  const std::string seq_bytes = encode_seq(seq);
  std::vector<zmq::const_buffer> parts = {zmq::const_buffer("", 0), zmq::buffer(seq_bytes),
                                          zmq::buffer(sent_.back().payload)};
  (void)zmq::send_multipart(s_->pub, parts);
  return seq;
}

std::string Publisher::endpoint() const { return s_->pub.get(zmq::sockopt::last_endpoint); }
std::string Publisher::replay_endpoint() const {
  return s_->has_router ? s_->router.get(zmq::sockopt::last_endpoint) : "";
}

void Publisher::serve_replay(int wait_ms) {
  if (!s_->has_router) return;
  while (true) {
    zmq::pollitem_t item{s_->router.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(wait_ms));
    if ((item.revents & ZMQ_POLLIN) == 0) return;
    wait_ms = 0;
    std::vector<zmq::message_t> parts;
    try {
      auto got = zmq::recv_multipart_n(s_->router, std::back_inserter(parts), 3);
      if (!got) return;
    } catch (const std::exception&) {
      continue;  // more parts than a request has: ignored, as vLLM does
    }
    if (parts.size() != 3 || parts[2].size() != 8) continue;
    const std::string client = as_string(parts[0]);
    const int64_t from = decode_seq(as_string(parts[2]));
    for (const Frame& f : sent_) {
      if (f.seq < from) continue;
      const std::string seq_bytes = encode_seq(f.seq);
      std::vector<zmq::const_buffer> reply = {zmq::buffer(client), zmq::const_buffer("", 0), zmq::buffer(seq_bytes),
                                              zmq::buffer(f.payload)};
      (void)zmq::send_multipart(s_->router, reply);
    }
    const std::string end = encode_seq(-1);
    std::vector<zmq::const_buffer> done = {zmq::buffer(client), zmq::const_buffer("", 0), zmq::buffer(end),
                                           zmq::const_buffer("", 0)};
    (void)zmq::send_multipart(s_->router, done);
  }
}

Result<std::unique_ptr<Publisher>> start_publishing(const std::string& endpoint, const std::string& replay_endpoint,
                                                    double wait_s) {
  auto p = Publisher::bind(endpoint, replay_endpoint);
  if (p) std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
  return p;
}

}  // namespace kvp::kv_events
