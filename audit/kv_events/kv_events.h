// KV-cache event streams as vLLM publishes them (docs/kv-events.md): the msgpack decoder, the
// recorded-stream file, and the auditor `kvproof audit --kv-events` runs.
//
// A stream is a sequence of batches, each sent as ZMQ frames (topic, 8-byte big-endian
// sequence number, msgpack payload). A payload is an EventBatch; its events are BlockStored,
// BlockRemoved or AllBlocksCleared, each a msgspec tagged struct: either an array whose first
// element is the tag (the class name) followed by the fields in declaration order (vLLM
// before its switch to maps, trailing defaulted fields omitted), or a map with the tag under
// "type" (vLLM after it). Both are decoded; unknown trailing fields and unknown map keys are
// ignored, so a newer producer's additions do not break the audit.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kvp::kv_events {

// A block hash as published, in one canonical text: an integer hash (older vLLM, SGLang) as
// its decimal digits ("-12", "18446744073709551615"), a bytes hash (vLLM's sha256 hashes) as
// "0x" and lowercase hex. The two forms never collide.
using BlockHash = std::string;

// vLLM's default medium; an event without one is counted under it.
inline constexpr const char* kDefaultMedium = "GPU";

struct BlockStored {
  std::vector<BlockHash> block_hashes;         // in chain order: each the parent of the next
  std::optional<BlockHash> parent_block_hash;  // the parent of block_hashes[0]; none for a root
  std::vector<int64_t> token_ids;              // every block's tokens, concatenated
  int64_t block_size = 0;
  std::optional<int64_t> lora_id;
  std::optional<std::string> medium;
  std::optional<std::string> lora_name;
  // One entry per block (null or an array of keys), as published; null when absent. Kept as
  // JSON (bytes as binary): the namespace rule (kv_events_audit) reads a cache salt from it.
  nlohmann::json extra_keys;
  std::optional<int64_t> group_idx;
};

struct BlockRemoved {
  std::vector<BlockHash> block_hashes;
  std::optional<std::string> medium;
  std::optional<int64_t> group_idx;
};

struct AllBlocksCleared {};

using KvCacheEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

struct EventBatch {
  int64_t seq = 0;  // from the frame, not the payload
  double ts = 0;
  std::vector<KvCacheEvent> events;
  std::optional<int64_t> data_parallel_rank;
};

// The largest payload decoded (16 MiB), and the most elements one array may hold. A larger
// one is refused as bad input, never allocated.
inline constexpr std::size_t kMaxPayloadBytes = std::size_t{16} << 20;
inline constexpr std::size_t kMaxArrayElements = std::size_t{1} << 22;

// Decodes one batch payload. Never crashes or allocates beyond a small multiple of the
// payload's size, whatever the bytes: every array and map count is checked against the bytes
// that follow before anything is allocated. Errors name the batch and where:
// "batch 12: events[3] (BlockStored): block_size: not an integer",
// "batch 12: not msgpack: truncated at offset 40".
Result<EventBatch> decode_event_batch(std::string_view payload, int64_t seq);

// Encoding of a batch, for kvproof's own publisher and for tests: kArray is vLLM's array-like
// layout (the tag first, every field in order), kMap the tagged-map layout.
enum class Encoding { kArray, kMap };
std::string encode_event_batch(const EventBatch& batch, Encoding encoding = Encoding::kArray);

// ---- frames and recorded streams ----

// One published message: the sequence number and the payload (the topic is not kept).
struct Frame {
  int64_t seq = 0;
  std::string payload;
};

// The 8-byte big-endian sequence number of a frame. REQUIRES: bytes.size() == 8.
int64_t decode_seq(std::string_view bytes);
std::string encode_seq(int64_t seq);

// A recorded stream: the 8-byte magic "KVEVREC1", then per frame the sequence number (8 bytes,
// big-endian, signed), the payload length (4 bytes, big-endian) and the payload.
inline constexpr std::string_view kRecordingMagic = "KVEVREC1";
void write_recording_header(std::ostream& out);
void write_recording_frame(std::ostream& out, const Frame& frame);
// Reads a whole recording. Errors name the source and the byte offset of the bad record:
// "s.kvev: frame 3 at offset 120: payload length 2147483647 over the 16 MiB limit".
Result<std::vector<Frame>> read_recording(std::istream& in, const std::string& source);
// The same from bytes in memory (the fuzzer's entry).
Result<std::vector<Frame>> parse_recording(std::string_view bytes, const std::string& source);

}  // namespace kvp::kv_events
