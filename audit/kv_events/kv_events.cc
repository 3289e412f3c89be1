#include "audit/kv_events/kv_events.h"

#include <cstring>
#include <exception>
#include <iterator>

#include <msgpack.hpp>

namespace kvp::kv_events {
namespace {

constexpr std::size_t kMaxDepth = 32;
constexpr std::size_t kMaxFields = 32;  // fields of one struct, known and future

// A first pass over the bytes that allocates nothing: the payload must be one complete msgpack
// value, no deeper than kMaxDepth, with no trailing bytes. Once it is complete, every element
// an array or map announces is really there (at least a byte each), so the allocating unpack
// that follows is bounded by the payload's size.
// Whether bytes are UTF-8 (msgpack strings must be; JSON reports need them to be).
bool valid_utf8(const char* p, std::size_t n) {
  std::size_t i = 0;
  while (i < n) {
    const auto c = static_cast<unsigned char>(p[i]);
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (std::size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(p[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    const bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

class Precheck : public msgpack::null_visitor {
 public:
  bool visit_str(const char* v, uint32_t size) {
    if (valid_utf8(v, size)) return true;
    error_ = "a string that is not UTF-8";
    return false;
  }
  bool start_array(uint32_t n) { return open(n); }
  bool end_array() { return close(); }
  bool start_map(uint32_t n) { return open(n); }
  bool end_map() { return close(); }
  void parse_error(size_t /*parsed*/, size_t error_offset) {
    error_ = "bad msgpack at offset " + std::to_string(error_offset);
  }
  void insufficient_bytes(size_t /*parsed*/, size_t error_offset) {
    error_ = "truncated at offset " + std::to_string(error_offset);
  }
  const std::string& error() const { return error_; }

 private:
  bool open(uint32_t n) {
    if (++depth_ > kMaxDepth) {
      error_ = "nested deeper than " + std::to_string(kMaxDepth);
      return false;
    }
    if (n > kMaxArrayElements) {
      error_ = "an array or map of " + std::to_string(n) + " elements, over the limit of " +
               std::to_string(kMaxArrayElements);
      return false;
    }
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  std::size_t depth_ = 0;
  std::string error_;
};

std::string hex(const char* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(p[i]);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

// Field readers: each returns an error naming the field; the caller adds the event's place.
using Obj = msgpack::object;

Status want(bool ok, const std::string& field, const char* what) {
  return ok ? Status::ok() : Status::error(field + ": not " + what);
}

Result<int64_t> read_int(const Obj& o, const std::string& field) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<uint64_t>(INT64_MAX)) return Status::error(field + ": integer out of range");
    return static_cast<int64_t>(o.via.u64);
  }
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  return Status::error(field + ": not an integer");
}

Result<std::optional<int64_t>> read_opt_int(const Obj& o, const std::string& field) {
  if (o.type == msgpack::type::NIL) return std::optional<int64_t>();
  auto v = read_int(o, field);
  if (!v) return v.status();
  return std::optional<int64_t>(*v);
}

Result<std::optional<std::string>> read_opt_str(const Obj& o, const std::string& field) {
  if (o.type == msgpack::type::NIL) return std::optional<std::string>();
  if (o.type != msgpack::type::STR) return Status::error(field + ": not a string or nil");
  return std::optional<std::string>(std::string(o.via.str.ptr, o.via.str.size));
}

Result<BlockHash> read_hash(const Obj& o, const std::string& field) {
  switch (o.type) {
    case msgpack::type::POSITIVE_INTEGER: return std::to_string(o.via.u64);
    case msgpack::type::NEGATIVE_INTEGER: return std::to_string(o.via.i64);
    case msgpack::type::BIN: return hex(o.via.bin.ptr, o.via.bin.size);
    default: return Status::error(field + ": not a block hash (an integer or bytes)");
  }
}

Result<std::vector<BlockHash>> read_hashes(const Obj& o, const std::string& field) {
  if (o.type != msgpack::type::ARRAY) return Status::error(field + ": not an array");
  std::vector<BlockHash> out;
  out.reserve(o.via.array.size);
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    auto h = read_hash(o.via.array.ptr[i], field + "[" + std::to_string(i) + "]");
    if (!h) return h.status();
    out.push_back(std::move(*h));
  }
  return out;
}

Result<std::vector<int64_t>> read_ints(const Obj& o, const std::string& field) {
  if (o.type != msgpack::type::ARRAY) return Status::error(field + ": not an array");
  std::vector<int64_t> out;
  out.reserve(o.via.array.size);
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    auto v = read_int(o.via.array.ptr[i], field + "[" + std::to_string(i) + "]");
    if (!v) return v.status();
    out.push_back(*v);
  }
  return out;
}

// Any msgpack value as JSON (bytes as binary); depth is bounded by the precheck.
nlohmann::json to_json(const Obj& o) {
  switch (o.type) {
    case msgpack::type::NIL: return nullptr;
    case msgpack::type::BOOLEAN: return o.via.boolean;
    case msgpack::type::POSITIVE_INTEGER: return o.via.u64;
    case msgpack::type::NEGATIVE_INTEGER: return o.via.i64;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return o.via.f64;
    case msgpack::type::STR: return std::string(o.via.str.ptr, o.via.str.size);
    case msgpack::type::BIN: {
      const auto* p = reinterpret_cast<const uint8_t*>(o.via.bin.ptr);
      return nlohmann::json::binary(std::vector<uint8_t>(p, p + o.via.bin.size));
    }
    case msgpack::type::ARRAY: {
      nlohmann::json a = nlohmann::json::array();
      for (uint32_t i = 0; i < o.via.array.size; ++i) a.push_back(to_json(o.via.array.ptr[i]));
      return a;
    }
    case msgpack::type::MAP: {
      // Keys that are not strings are written as their JSON text.
      nlohmann::json m = nlohmann::json::object();
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        const Obj& k = o.via.map.ptr[i].key;
        const std::string key =
            k.type == msgpack::type::STR ? std::string(k.via.str.ptr, k.via.str.size) : to_json(k).dump();
        m[key] = to_json(o.via.map.ptr[i].val);
      }
      return m;
    }
    default: return nullptr;  // ext: not part of the format; kept as null
  }
}

// A struct's fields by name, from either layout: `names` in declaration order; the array
// layout gives them by position after the tag, the map layout by key ("type" is the tag).
struct Fields {
  std::vector<const Obj*> by_index;  // parallel to names; nullptr when absent
};

Result<Fields> fields_of(const Obj& o, const std::vector<const char*>& names, std::size_t min_fields,
                         std::size_t first) {
  Fields f;
  f.by_index.assign(names.size(), nullptr);
  if (o.type == msgpack::type::ARRAY) {
    const std::size_t n = o.via.array.size - first;
    if (n < min_fields || n > kMaxFields)
      return Status::error(std::to_string(n) + " fields, expected " + std::to_string(min_fields) + " to " +
                           std::to_string(kMaxFields));
    for (std::size_t i = 0; i < names.size() && i < n; ++i) f.by_index[i] = &o.via.array.ptr[first + i];
    return f;
  }
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const Obj& k = o.via.map.ptr[i].key;
    if (k.type != msgpack::type::STR) return Status::error("a field name that is not a string");
    const std::string_view key(k.via.str.ptr, k.via.str.size);
    for (std::size_t j = 0; j < names.size(); ++j)
      if (key == names[j]) f.by_index[j] = &o.via.map.ptr[i].val;
  }
  for (std::size_t j = 0; j < min_fields; ++j)
    if (f.by_index[j] == nullptr) return Status::error(std::string("missing field ") + names[j]);
  return f;
}

const Obj kNil;  // a default msgpack object is nil

const Obj& field_or_nil(const Fields& f, std::size_t i) { return f.by_index[i] != nullptr ? *f.by_index[i] : kNil; }

#define KVP_KV_CONCAT_(a, b) a##b
#define KVP_KV_CONCAT(a, b) KVP_KV_CONCAT_(a, b)
#define KVP_ASSIGN_OR_RETURN(lhs, expr)                                                  \
  auto KVP_KV_CONCAT(field_, __LINE__) = (expr);                                         \
  if (!KVP_KV_CONCAT(field_, __LINE__)) return KVP_KV_CONCAT(field_, __LINE__).status(); \
  lhs = std::move(*KVP_KV_CONCAT(field_, __LINE__))

Result<KvCacheEvent> decode_stored(const Obj& o, std::size_t first) {
  static const std::vector<const char*> names = {"block_hashes", "parent_block_hash", "token_ids",
                                                 "block_size",   "lora_id",           "medium",
                                                 "lora_name",    "extra_keys",        "group_idx"};
  auto f = fields_of(o, names, o.type == msgpack::type::ARRAY ? 5 : 4, first);
  if (!f) return f.status();
  BlockStored e;
  KVP_ASSIGN_OR_RETURN(e.block_hashes, read_hashes(field_or_nil(*f, 0), "block_hashes"));
  const Obj& parent = field_or_nil(*f, 1);
  if (parent.type != msgpack::type::NIL) {
    KVP_ASSIGN_OR_RETURN(e.parent_block_hash, read_hash(parent, "parent_block_hash"));
  }
  KVP_ASSIGN_OR_RETURN(e.token_ids, read_ints(field_or_nil(*f, 2), "token_ids"));
  KVP_ASSIGN_OR_RETURN(e.block_size, read_int(field_or_nil(*f, 3), "block_size"));
  KVP_ASSIGN_OR_RETURN(e.lora_id, read_opt_int(field_or_nil(*f, 4), "lora_id"));
  KVP_ASSIGN_OR_RETURN(e.medium, read_opt_str(field_or_nil(*f, 5), "medium"));
  KVP_ASSIGN_OR_RETURN(e.lora_name, read_opt_str(field_or_nil(*f, 6), "lora_name"));
  const Obj& extra = field_or_nil(*f, 7);
  if (Status s = want(
          extra.type == msgpack::type::NIL || extra.type == msgpack::type::ARRAY || extra.type == msgpack::type::MAP,
          "extra_keys", "an array, a map or nil");
      !s)
    return s;
  e.extra_keys = to_json(extra);
  KVP_ASSIGN_OR_RETURN(e.group_idx, read_opt_int(field_or_nil(*f, 8), "group_idx"));
  return KvCacheEvent(std::move(e));
}

Result<KvCacheEvent> decode_removed(const Obj& o, std::size_t first) {
  static const std::vector<const char*> names = {"block_hashes", "medium", "group_idx"};
  auto f = fields_of(o, names, 1, first);
  if (!f) return f.status();
  BlockRemoved e;
  KVP_ASSIGN_OR_RETURN(e.block_hashes, read_hashes(field_or_nil(*f, 0), "block_hashes"));
  KVP_ASSIGN_OR_RETURN(e.medium, read_opt_str(field_or_nil(*f, 1), "medium"));
  KVP_ASSIGN_OR_RETURN(e.group_idx, read_opt_int(field_or_nil(*f, 2), "group_idx"));
  return KvCacheEvent(std::move(e));
}

Result<KvCacheEvent> decode_event(const Obj& o, std::string& tag) {
  const Obj* tag_obj = nullptr;
  std::size_t first = 0;
  if (o.type == msgpack::type::ARRAY) {
    if (o.via.array.size == 0) return Status::error("an empty array, not a tagged event");
    tag_obj = &o.via.array.ptr[0];
    first = 1;
  } else if (o.type == msgpack::type::MAP) {
    for (uint32_t i = 0; i < o.via.map.size; ++i) {
      const Obj& k = o.via.map.ptr[i].key;
      if (k.type == msgpack::type::STR && std::string_view(k.via.str.ptr, k.via.str.size) == "type")
        tag_obj = &o.via.map.ptr[i].val;
    }
    if (tag_obj == nullptr) return Status::error("a map without a \"type\" tag");
  } else {
    return Status::error("not an event (an array or a map)");
  }
  if (tag_obj->type != msgpack::type::STR) return Status::error("the tag is not a string");
  tag.assign(tag_obj->via.str.ptr, tag_obj->via.str.size);
  if (tag == "BlockStored") return decode_stored(o, first);
  if (tag == "BlockRemoved") return decode_removed(o, first);
  if (tag == "AllBlocksCleared") {
    auto f = fields_of(o, {}, 0, first);
    if (!f) return f.status();
    return KvCacheEvent(AllBlocksCleared{});
  }
  std::string shown = tag.substr(0, 40);
  for (char& c : shown)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  tag.clear();
  return Status::error("unknown tag \"" + shown + "\"");
}

Result<EventBatch> decode_batch_object(const Obj& o, int64_t seq) {
  static const std::vector<const char*> names = {"ts", "events", "data_parallel_rank"};
  if (o.type != msgpack::type::ARRAY && o.type != msgpack::type::MAP)
    return Status::error("not an EventBatch (an array or a map)");
  auto f = fields_of(o, names, 2, 0);
  if (!f) return f.status().with_context("EventBatch");
  EventBatch b;
  b.seq = seq;
  const Obj& ts = *f->by_index[0];
  if (ts.type == msgpack::type::FLOAT32 || ts.type == msgpack::type::FLOAT64) {
    b.ts = ts.via.f64;
  } else if (ts.type == msgpack::type::POSITIVE_INTEGER) {
    b.ts = static_cast<double>(ts.via.u64);
  } else if (ts.type == msgpack::type::NEGATIVE_INTEGER) {
    b.ts = static_cast<double>(ts.via.i64);
  } else {
    return Status::error("ts: not a number");
  }
  auto rank = read_opt_int(field_or_nil(*f, 2), "data_parallel_rank");
  if (!rank) return rank.status();
  b.data_parallel_rank = *rank;
  const Obj& events = *f->by_index[1];
  if (events.type != msgpack::type::ARRAY) return Status::error("events: not an array");
  b.events.reserve(events.via.array.size);
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    std::string tag;
    auto e = decode_event(events.via.array.ptr[i], tag);
    const std::string where = "events[" + std::to_string(i) + "]" + (tag.empty() ? "" : " (" + tag + ")");
    if (!e) return e.status().with_context(where);
    b.events.push_back(std::move(*e));
  }
  return b;
}

}  // namespace

Result<EventBatch> decode_event_batch(std::string_view payload, int64_t seq) {
  const std::string where = "batch " + std::to_string(seq);
  if (payload.size() > kMaxPayloadBytes)
    return Status::error(where + ": payload of " + std::to_string(payload.size()) + " bytes, over the 16 MiB limit");
  if (payload.empty()) return Status::error(where + ": empty payload");
  Precheck check;
  std::size_t off = 0;
  bool complete = false;
  try {
    complete = msgpack::parse(payload.data(), payload.size(), off, check);
  } catch (const std::exception& e) {
    return Status::error(where + ": not msgpack: " + e.what());
  }
  if (!complete) {
    return Status::error(where + ": not msgpack: " + (check.error().empty() ? "bad value" : check.error()));
  }
  if (off != payload.size())
    return Status::error(where + ": " + std::to_string(payload.size() - off) + " trailing bytes at offset " +
                         std::to_string(off));
  msgpack::object_handle handle;
  try {
    const msgpack::unpack_limit limit(kMaxArrayElements, kMaxArrayElements, kMaxPayloadBytes, kMaxPayloadBytes, 0,
                                      kMaxDepth);
    handle = msgpack::unpack(payload.data(), payload.size(), nullptr, nullptr, limit);
  } catch (const std::exception& e) {
    return Status::error(where + ": not msgpack: " + e.what());
  }
  auto b = decode_batch_object(handle.get(), seq);
  if (!b) return b.status().with_context(where);
  return b;
}

// ---- encoding ----
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_hash(Packer& pk, msgpack::sbuffer& buf, const BlockHash& h) {
  (void)buf;
  if (h.rfind("0x", 0) == 0) {
    std::string bytes;
    for (std::size_t i = 2; i + 1 < h.size(); i += 2)
      bytes += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
    pk.pack_bin(static_cast<uint32_t>(bytes.size()));
    pk.pack_bin_body(bytes.data(), static_cast<uint32_t>(bytes.size()));
  } else if (!h.empty() && h[0] == '-') {
    pk.pack_int64(std::stoll(h));
  } else {
    pk.pack_uint64(std::stoull(h));
  }
}

void pack_hashes(Packer& pk, msgpack::sbuffer& buf, const std::vector<BlockHash>& hs) {
  pk.pack_array(static_cast<uint32_t>(hs.size()));
  for (const auto& h : hs) pack_hash(pk, buf, h);
}

template <typename T>
void pack_opt(Packer& pk, const std::optional<T>& v) {
  if (v) {
    pk.pack(*v);
  } else {
    pk.pack_nil();
  }
}

void pack_json(msgpack::sbuffer& buf, const nlohmann::json& j) {
  const std::vector<uint8_t> bytes = nlohmann::json::to_msgpack(j);
  buf.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void pack_key(Packer& pk, Encoding enc, const char* name) {
  if (enc == Encoding::kMap) pk.pack(std::string(name));
}

void pack_event(Packer& pk, msgpack::sbuffer& buf, const KvCacheEvent& ev, Encoding enc) {
  auto head = [&](const char* tag, uint32_t fields) {
    if (enc == Encoding::kArray) {
      pk.pack_array(fields + 1);
    } else {
      pk.pack_map(fields + 1);
      pk.pack(std::string("type"));
    }
    pk.pack(std::string(tag));
  };
  if (const auto* s = std::get_if<BlockStored>(&ev)) {
    const bool extra = !s->extra_keys.is_null(), group = s->group_idx.has_value();
    head("BlockStored", 7 + (extra || group ? 1 : 0) + (group ? 1 : 0));
    pack_key(pk, enc, "block_hashes");
    pack_hashes(pk, buf, s->block_hashes);
    pack_key(pk, enc, "parent_block_hash");
    if (s->parent_block_hash) {
      pack_hash(pk, buf, *s->parent_block_hash);
    } else {
      pk.pack_nil();
    }
    pack_key(pk, enc, "token_ids");
    pk.pack_array(static_cast<uint32_t>(s->token_ids.size()));
    for (int64_t t : s->token_ids) pk.pack_int64(t);
    pack_key(pk, enc, "block_size");
    pk.pack_int64(s->block_size);
    pack_key(pk, enc, "lora_id");
    pack_opt(pk, s->lora_id);
    pack_key(pk, enc, "medium");
    pack_opt(pk, s->medium);
    pack_key(pk, enc, "lora_name");
    pack_opt(pk, s->lora_name);
    if (extra || group) {
      pack_key(pk, enc, "extra_keys");
      pack_json(buf, s->extra_keys);
    }
    if (group) {
      pack_key(pk, enc, "group_idx");
      pk.pack_int64(*s->group_idx);
    }
  } else if (const auto* r = std::get_if<BlockRemoved>(&ev)) {
    head("BlockRemoved", 2 + (r->group_idx ? 1 : 0));
    pack_key(pk, enc, "block_hashes");
    pack_hashes(pk, buf, r->block_hashes);
    pack_key(pk, enc, "medium");
    pack_opt(pk, r->medium);
    if (r->group_idx) {
      pack_key(pk, enc, "group_idx");
      pk.pack_int64(*r->group_idx);
    }
  } else {
    head("AllBlocksCleared", 0);
  }
}

// ts as a msgpack float64 (0xcb and the IEEE-754 bits, big-endian) whatever its value: what
// vLLM's encoder (msgspec) writes for a Python float. msgpack-cxx 4.1's pack_double writes an
// integral double as an integer instead, and its range check lets 2^64 through to a
// double -> uint64_t conversion that is undefined (UBSan: "outside the range of representable
// values"; found by fuzz_kv_events on a ts of 0xffffffffffffff4c, which rounds to 2^64).
void pack_float64(msgpack::sbuffer& buf, double d) {
  uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof bits);
  char out[9];
  out[0] = static_cast<char>(0xcb);
  for (int i = 8; i >= 1; --i, bits >>= 8) out[i] = static_cast<char>(bits & 0xff);
  buf.write(out, sizeof out);
}

}  // namespace

std::string encode_event_batch(const EventBatch& batch, Encoding encoding) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  const uint32_t n = batch.data_parallel_rank ? 3 : 2;
  if (encoding == Encoding::kArray) {
    pk.pack_array(n);
  } else {
    pk.pack_map(n);
  }
  pack_key(pk, encoding, "ts");
  pack_float64(buf, batch.ts);
  pack_key(pk, encoding, "events");
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const auto& e : batch.events) pack_event(pk, buf, e, encoding);
  if (batch.data_parallel_rank) {
    pack_key(pk, encoding, "data_parallel_rank");
    pk.pack_int64(*batch.data_parallel_rank);
  }
  return std::string(buf.data(), buf.size());
}

// ---- frames and recordings ----

int64_t decode_seq(std::string_view bytes) {
  KVP_CHECK(bytes.size() == 8);
  uint64_t v = 0;
  for (char c : bytes) v = (v << 8) | static_cast<unsigned char>(c);
  return static_cast<int64_t>(v);
}

std::string encode_seq(int64_t seq) {
  std::string s(8, '\0');
  auto v = static_cast<uint64_t>(seq);
  for (int i = 7; i >= 0; --i, v >>= 8) s[static_cast<std::size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

void write_recording_header(std::ostream& out) { out.write(kRecordingMagic.data(), kRecordingMagic.size()); }

void write_recording_frame(std::ostream& out, const Frame& frame) {
  KVP_CHECK(frame.payload.size() <= kMaxPayloadBytes);
  const std::string seq = encode_seq(frame.seq);
  const auto n = static_cast<uint32_t>(frame.payload.size());
  const char len[4] = {static_cast<char>(n >> 24), static_cast<char>((n >> 16) & 0xff),
                       static_cast<char>((n >> 8) & 0xff), static_cast<char>(n & 0xff)};
  out.write(seq.data(), 8);
  out.write(len, 4);
  out.write(frame.payload.data(), static_cast<std::streamsize>(frame.payload.size()));
}

Result<std::vector<Frame>> parse_recording(std::string_view bytes, const std::string& source) {
  if (bytes.substr(0, kRecordingMagic.size()) != kRecordingMagic)
    return Status::error(source + ": not a recorded KV-event stream (no \"KVEVREC1\" magic)");
  std::vector<Frame> frames;
  std::size_t off = kRecordingMagic.size();
  while (off < bytes.size()) {
    const std::string where = source + ": frame " + std::to_string(frames.size()) + " at offset " + std::to_string(off);
    if (bytes.size() - off < 12) return Status::error(where + ": truncated record header");
    const int64_t seq = decode_seq(bytes.substr(off, 8));
    uint32_t n = 0;
    for (std::size_t i = 0; i < 4; ++i) n = (n << 8) | static_cast<unsigned char>(bytes[off + 8 + i]);
    if (n > kMaxPayloadBytes)
      return Status::error(where + ": payload length " + std::to_string(n) + " over the 16 MiB limit");
    if (bytes.size() - off - 12 < n)
      return Status::error(where + ": truncated payload (" + std::to_string(n) + " bytes announced, " +
                           std::to_string(bytes.size() - off - 12) + " left)");
    frames.push_back(Frame{seq, std::string(bytes.substr(off + 12, n))});
    off += 12 + n;
  }
  return frames;
}

Result<std::vector<Frame>> read_recording(std::istream& in, const std::string& source) {
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::error(source + ": read error");
  return parse_recording(bytes, source);
}

}  // namespace kvp::kv_events
