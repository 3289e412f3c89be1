// `--kv-events-publish ENDPOINT [--kv-events-replay ENDPOINT]`, as `verify`, `audit` and
// `generate` take it: where the engine publishes kvproof's KV-event stream (docs/kv-events.md).
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "audit/kv_events/kv_events_zmq.h"
#include "common/status.h"

namespace kvp::tools {

struct KvEventsPublishOptions {
  std::string endpoint, replay;

  void add_options(CLI::App& cmd) {
    cmd.add_option("--kv-events-publish", endpoint,
                   "publish the engine's KV-event stream on this ZMQ endpoint (tcp://127.0.0.1:PORT), as vLLM does "
                   "(docs/kv-events.md)");
    cmd.add_option("--kv-events-replay", replay,
                   "with --kv-events-publish: serve replays of the stream on this ZMQ endpoint");
  }
  bool enabled() const { return !endpoint.empty(); }
  // Binds the publisher and waits briefly for subscribers (nullptr when --kv-events-publish
  // was not given); an error names the endpoint.
  Result<std::unique_ptr<kv_events::Publisher>> start() const {
    if (!enabled()) return std::unique_ptr<kv_events::Publisher>();
    return kv_events::start_publishing(endpoint, replay);
  }
};

}  // namespace kvp::tools
