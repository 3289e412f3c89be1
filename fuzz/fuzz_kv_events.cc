// Fuzzer for the KV-event decoder, recorded streams and the auditor (audit/kv_events/kv_events.h,
// audit/kv_events/kv_events_audit.h). An input starting with the recording magic is a recorded stream:
// every frame decoded and the stream audited; any other input is one batch payload. Never a
// crash, hang, sanitizer report or unbounded allocation; an error names the batch; a decoded
// batch survives a round trip (encoded in either layout and decoded again, it encodes to the
// same bytes).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "audit/kv_events/kv_events.h"
#include "audit/kv_events/kv_events_audit.h"

namespace {

void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: %s\n", what, detail.c_str());
  std::abort();
}

void round_trip(const kvp::kv_events::EventBatch& b) {
  using kvp::kv_events::Encoding;
  for (Encoding enc : {Encoding::kArray, Encoding::kMap}) {
    const std::string once = kvp::kv_events::encode_event_batch(b, enc);
    auto again = kvp::kv_events::decode_event_batch(once, b.seq);
    if (!again) fail("an encoded batch does not decode", again.status().message());
    if (kvp::kv_events::encode_event_batch(*again, enc) != once) fail("round trip changed the batch", "");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.substr(0, kvp::kv_events::kRecordingMagic.size()) != kvp::kv_events::kRecordingMagic) {
    auto b = kvp::kv_events::decode_event_batch(bytes, 7);
    if (!b) {
      if (b.status().message().rfind("batch 7: ", 0) != 0) fail("error without the batch", b.status().message());
      return 0;
    }
    round_trip(*b);
    return 0;
  }
  auto frames = kvp::kv_events::parse_recording(bytes, "fuzz");
  if (!frames) {
    if (frames.status().message().rfind("fuzz: ", 0) != 0) fail("error without the source", frames.status().message());
    return 0;
  }
  std::vector<kvp::kv_events::EventBatch> batches;
  for (const auto& f : *frames) {
    auto b = kvp::kv_events::decode_event_batch(f.payload, f.seq);
    if (!b) return 0;
    batches.push_back(std::move(*b));
  }
  const auto audit = kvp::kv_events::audit_kv_events(batches, "fuzz");
  (void)audit.summary();
  (void)audit.to_json().dump();  // throws on a string that is not UTF-8: the decoder refuses those
  return 0;
}
