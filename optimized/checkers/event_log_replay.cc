#include "optimized/checkers/event_log_replay.h"
#include "common/text.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

namespace kvp {
namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxBlocks = int64_t{1} << 20;
constexpr int64_t kMaxBlockSize = int64_t{1} << 16;
constexpr int64_t kMaxLen = int64_t{1} << 40;
// KV-cache groups an init may name (a model has at most a few hundred layers).
constexpr int64_t kMaxGroups = 1024;

struct Failure {
  ReplayResult::Kind kind;
  std::string reason;
};

struct Block {
  int64_t refcount = 0;
  bool cached = false;
  int64_t tenant = 0;  // whose content it holds (meaningful while in use or cached)
};

struct Seq {
  int64_t tenant = 0;
  bool on_host = false;
  std::vector<std::vector<int64_t>> tables;  // one per KV-cache group
  int64_t len = 0;
};

// Leading released (-1) entries of a table.
int64_t released_of(const std::vector<int64_t>& t) {
  return std::find_if(t.begin(), t.end(), [](int64_t b) { return b != -1; }) - t.begin();
}

class Model {
 public:
  static Failure malformed(std::string r) { return {ReplayResult::Kind::kMalformed, std::move(r)}; }
  static Failure violation(std::string r) { return {ReplayResult::Kind::kViolation, std::move(r)}; }

  std::optional<Failure> apply(const KvEvent& e);
  void fill(ReplayResult& r) const;
  std::optional<Failure> check_all() const;
  bool initialized() const { return init_; }

  // One handler per event type (kv_event.h); each re-checks what its event claims.
  std::optional<Failure> on(const kv_event::Init& e);
  std::optional<Failure> on(const kv_event::Add& e);
  std::optional<Failure> on(const kv_event::Fork& e);
  std::optional<Failure> on(const kv_event::Alloc& e);
  std::optional<Failure> on(const kv_event::Share& e);
  std::optional<Failure> on(const kv_event::Cow& e);
  std::optional<Failure> on(const kv_event::Release& e);
  std::optional<Failure> on(const kv_event::WindowRelease& e);
  std::optional<Failure> on(const kv_event::Slots& e);
  std::optional<Failure> on(const kv_event::Cache& e);
  std::optional<Failure> on(const kv_event::Evict& e);
  std::optional<Failure> on(const kv_event::SwapOut& e) { return swap(e.seq, e.pairs, true); }
  std::optional<Failure> on(const kv_event::SwapIn& e) { return swap(e.seq, e.pairs, false); }
  std::optional<Failure> on(const kv_event::Poison& e);
  std::optional<Failure> on(const kv_event::Free& e);

 private:
  std::optional<Failure> block_in_pool(int64_t b, bool host) const;
  std::optional<Failure> find_seq(int64_t id, Seq*& out);
  // Sequence id's table in KV-cache group g (a group the init names).
  std::optional<Failure> find_table(int64_t id, int32_t g, Seq*& s, std::vector<int64_t>*& table);
  int64_t num_groups() const { return static_cast<int64_t>(windows_.size()); }
  std::optional<Failure> swap(int64_t id, const std::vector<BlockCopy>& pairs, bool out);
  // A device block (refcount already taken) appended to sequence id's table, then I5 and I2.
  std::optional<Failure> append_block(int64_t id, Seq& s, std::vector<int64_t>& table, int64_t block);
  std::optional<Failure> check_blocks(const std::vector<int64_t>& device_blocks,
                                      const std::vector<int64_t>& host_blocks) const;
  std::optional<Failure> check_table(int64_t id, const Seq& s) const;
  int64_t owners(int64_t block, bool host) const;

  bool init_ = false;
  bool global_ = false;
  int64_t block_size_ = 0;
  std::vector<int64_t> windows_;  // per KV-cache group: its window (0: none)
  std::vector<Block> device_;
  std::vector<int64_t> host_;  // refcounts
  std::map<int64_t, Seq> seqs_;
};

// ---- decoding: one JSON line into a KvEvent, or a "malformed" failure ----

std::optional<Failure> get_int(const Json& j, const char* key, int64_t& out) {
  auto it = j.find(key);
  if (it == j.end()) return Model::malformed(std::string("missing field \"") + key + "\"");
  if (it->is_number_integer() && !it->is_number_unsigned()) {
    out = it->get<int64_t>();
    return std::nullopt;
  }
  if (it->is_number_unsigned()) {
    const auto u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return Model::malformed(std::string("field \"") + key + "\" out of range");
    }
    out = static_cast<int64_t>(u);
    return std::nullopt;
  }
  return Model::malformed(std::string("field \"") + key + "\" is not an integer");
}

// A block id or pool size: an int32 (no pool holds 2^31 blocks, see kMaxBlocks).
std::optional<Failure> get_i32(const Json& j, const char* key, int32_t& out) {
  int64_t v = 0;
  if (auto f = get_int(j, key, v)) return f;
  if (v < INT32_MIN || v > INT32_MAX) return Model::malformed(std::string("field \"") + key + "\" out of range");
  out = static_cast<int32_t>(v);
  return std::nullopt;
}

std::optional<Failure> get_pairs(const Json& j, std::vector<BlockCopy>& out) {
  auto it = j.find("pairs");
  if (it == j.end()) return Model::malformed("missing field \"pairs\"");
  if (!it->is_array()) return Model::malformed("field \"pairs\" is not an array");
  for (const Json& p : *it) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number_integer()) {
      return Model::malformed("field \"pairs\" holds an element that is not [int, int]");
    }
    const auto a = p[0].get<int64_t>(), b = p[1].get<int64_t>();
    if (a < INT32_MIN || a > INT32_MAX || b < INT32_MIN || b > INT32_MAX) {
      return Model::malformed("field \"pairs\" holds a block id out of range");
    }
    out.push_back(BlockCopy{static_cast<int32_t>(a), static_cast<int32_t>(b)});
  }
  return std::nullopt;
}

std::optional<Failure> decode_init(const Json& j, KvEvent& out) {
  kv_event::Init e;
  if (auto f = get_i32(j, "device_blocks", e.device_blocks)) return f;
  if (auto f = get_i32(j, "host_blocks", e.host_blocks)) return f;
  if (auto f = get_i32(j, "block_size", e.block_size)) return f;
  auto g = j.find("global_prefix");
  if (g != j.end() && !g->is_boolean()) return Model::malformed("field \"global_prefix\" is not a boolean");
  e.global_prefix = g != j.end() && g->get<bool>();
  if (j.contains("window")) {
    if (auto f = get_int(j, "window", e.window)) return f;
  }
  if (auto it = j.find("groups"); it != j.end()) {
    if (!it->is_array()) return Model::malformed("field \"groups\" is not an array");
    for (const Json& w : *it) {
      if (!w.is_number_integer() || w.get<int64_t>() < 0 || w.get<int64_t>() > kMaxLen) {
        return Model::malformed("field \"groups\" holds a window that is not an integer in [0, " + str(kMaxLen) + "]");
      }
      e.group_windows.push_back(w.get<int64_t>());
    }
  }
  out = e;
  return std::nullopt;
}

// The optional "group" field (absent: 0), a KV-cache group index >= 0.
std::optional<Failure> get_group(const Json& j, int32_t& out) {
  out = 0;
  if (!j.contains("group")) return std::nullopt;
  if (auto f = get_i32(j, "group", out)) return f;
  if (out < 0) return Model::malformed("field \"group\" is negative");
  return std::nullopt;
}

std::optional<Failure> decode_share(const Json& j, KvEvent& out) {
  kv_event::Share e;
  if (auto f = get_int(j, "seq", e.seq)) return f;
  if (auto f = get_i32(j, "block", e.block)) return f;
  auto r = j.find("reason");
  if (r == j.end() || !r->is_string()) return Model::malformed("missing string field \"reason\"");
  const std::string reason = r->get<std::string>();
  if (reason == "prefix_hit") {
    e.reason = kv_event::ShareReason::kPrefixHit;
  } else if (reason == "fork") {
    e.reason = kv_event::ShareReason::kFork;
  } else {
    return Model::malformed("unknown share reason \"" + reason + "\"");
  }
  if (auto f = get_group(j, e.group)) return f;
  out = e;
  return std::nullopt;
}

std::optional<Failure> decode_swap(const Json& j, bool swap_out, KvEvent& out) {
  int64_t seq = 0;
  std::vector<BlockCopy> pairs;
  if (auto f = get_int(j, "seq", seq)) return f;
  if (auto f = get_pairs(j, pairs)) return f;
  if (swap_out) {
    out = kv_event::SwapOut{seq, std::move(pairs)};
  } else {
    out = kv_event::SwapIn{seq, std::move(pairs)};
  }
  return std::nullopt;
}

// An event whose fields are all integers: 64-bit ones (`wide`) and block ids (`narrow`).
using WideFields = std::initializer_list<std::pair<const char*, int64_t*>>;
using NarrowFields = std::initializer_list<std::pair<const char*, int32_t*>>;
std::optional<Failure> get_fields(const Json& j, WideFields wide, NarrowFields narrow) {
  for (const auto& [key, field] : wide) {
    if (auto f = get_int(j, key, *field)) return f;
  }
  for (const auto& [key, field] : narrow) {
    if (auto f = get_i32(j, key, *field)) return f;
  }
  return std::nullopt;
}

std::optional<Failure> decode(const Json& j, KvEvent& out) {
  if (!j.is_object()) return Model::malformed("not a JSON object");
  auto ev_it = j.find("ev");
  if (ev_it == j.end() || !ev_it->is_string()) return Model::malformed("missing string field \"ev\"");
  const std::string ev = ev_it->get<std::string>();
  auto simple = [&](auto& e, WideFields wide, NarrowFields narrow) -> std::optional<Failure> {
    if (auto f = get_fields(j, wide, narrow)) return f;
    out = e;
    return std::nullopt;
  };
  if (ev == "init") return decode_init(j, out);
  if (ev == "share") return decode_share(j, out);
  if (ev == "swap_out" || ev == "swap_in") return decode_swap(j, ev == "swap_out", out);
  if (ev == "add") {
    kv_event::Add e;
    return simple(e, {{"seq", &e.seq}, {"tenant", &e.tenant}}, {});
  }
  if (ev == "fork") {
    kv_event::Fork e;
    return simple(e, {{"parent", &e.parent}, {"child", &e.child}}, {});
  }
  if (ev == "alloc") {
    kv_event::Alloc e;
    if (auto f = get_group(j, e.group)) return f;
    return simple(e, {{"seq", &e.seq}}, {{"block", &e.block}});
  }
  if (ev == "cow") {
    kv_event::Cow e;
    if (auto f = get_group(j, e.group)) return f;
    return simple(e, {{"seq", &e.seq}, {"index", &e.index}}, {{"src", &e.src}, {"dst", &e.dst}});
  }
  if (ev == "release") {
    kv_event::Release e;
    if (auto f = get_group(j, e.group)) return f;
    return simple(e, {{"seq", &e.seq}}, {{"block", &e.block}});
  }
  if (ev == "window_release") {
    kv_event::WindowRelease e;
    if (auto f = get_group(j, e.group)) return f;
    return simple(e, {{"seq", &e.seq}, {"index", &e.index}}, {{"block", &e.block}});
  }
  if (ev == "slots") {
    kv_event::Slots e;
    return simple(e, {{"seq", &e.seq}, {"len", &e.len}}, {});
  }
  if (ev == "cache") {
    kv_event::Cache e;
    return simple(e, {}, {{"block", &e.block}});
  }
  if (ev == "evict") {
    kv_event::Evict e;
    return simple(e, {}, {{"block", &e.block}});
  }
  if (ev == "poison") {
    kv_event::Poison e;
    return simple(e, {}, {{"block", &e.block}});
  }
  if (ev == "free") {
    kv_event::Free e;
    return simple(e, {{"seq", &e.seq}}, {});
  }
  return Model::malformed("unknown event \"" + ev + "\"");
}

// ---- the model ----

std::optional<Failure> Model::block_in_pool(int64_t b, bool host) const {
  const int64_t n = host ? static_cast<int64_t>(host_.size()) : static_cast<int64_t>(device_.size());
  if (b < 0 || b >= n) {
    return violation(std::string(host ? "host" : "device") + " block " + str(b) + " outside the pool of " + str(n));
  }
  return std::nullopt;
}

std::optional<Failure> Model::find_seq(int64_t id, Seq*& out) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return violation("unknown sequence " + str(id));
  out = &it->second;
  return std::nullopt;
}

std::optional<Failure> Model::find_table(int64_t id, int32_t g, Seq*& s, std::vector<int64_t>*& table) {
  if (g >= num_groups()) {
    return malformed("field \"group\" names group " + str(g) + " of a log with " + str(num_groups()) +
                     " KV-cache group" + (num_groups() == 1 ? "" : "s"));
  }
  if (auto f = find_seq(id, s)) return f;
  table = &s->tables[static_cast<size_t>(g)];
  return std::nullopt;
}

int64_t Model::owners(int64_t block, bool host) const {
  int64_t n = 0;
  for (const auto& [id, s] : seqs_) {
    if (s.on_host != host) continue;
    for (const std::vector<int64_t>& t : s.tables) n += std::count(t.begin(), t.end(), block);
  }
  return n;
}

std::optional<Failure> Model::check_blocks(const std::vector<int64_t>& device_blocks,
                                           const std::vector<int64_t>& host_blocks) const {
  for (int64_t b : device_blocks) {
    const int64_t o = owners(b, false);
    if (device_[static_cast<size_t>(b)].refcount != o) {
      return violation("I2: device block " + str(b) + " has refcount " + str(device_[static_cast<size_t>(b)].refcount) +
                       " but " + str(o) + " table entries");
    }
  }
  for (int64_t b : host_blocks) {
    const int64_t o = owners(b, true);
    if (host_[static_cast<size_t>(b)] != o) {
      return violation("I2: host block " + str(b) + " has refcount " + str(host_[static_cast<size_t>(b)]) + " but " +
                       str(o) + " table entries");
    }
  }
  return std::nullopt;
}

std::optional<Failure> Model::check_table(int64_t id, const Seq& s) const {
  // Released entries (-1) lead each table; the rest, over every group's table, name distinct
  // blocks (a block is in one group's table).
  std::vector<int64_t> sorted;
  for (const std::vector<int64_t>& t : s.tables) {
    const auto live = t.begin() + released_of(t);
    if (std::find(live, t.end(), int64_t{-1}) != t.end()) {
      return violation("I11: sequence " + str(id) + " has a released entry after a live one");
    }
    sorted.insert(sorted.end(), live, t.end());
  }
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return violation("I5: sequence " + str(id) + " names a block twice");
  }
  return std::nullopt;
}

std::optional<Failure> Model::check_all() const {
  std::vector<int64_t> all_device(device_.size()), all_host(host_.size());
  for (size_t i = 0; i < all_device.size(); ++i) all_device[i] = static_cast<int64_t>(i);
  for (size_t i = 0; i < all_host.size(); ++i) all_host[i] = static_cast<int64_t>(i);
  if (auto f = check_blocks(all_device, all_host)) return f;
  for (const auto& [id, s] : seqs_) {
    const int64_t want = (s.len + block_size_ - 1) / block_size_;
    for (size_t g = 0; g < s.tables.size(); ++g) {
      if (static_cast<int64_t>(s.tables[g].size()) != want) {
        return violation("I5: at the end, sequence " + str(id) + " has " +
                         str(static_cast<int64_t>(s.tables[g].size())) + " blocks" +
                         (s.tables.size() > 1 ? " in group " + str(static_cast<int64_t>(g)) : std::string()) +
                         " for length " + str(s.len) + " (expected " + str(want) + ")");
      }
    }
  }
  return std::nullopt;
}

std::optional<Failure> Model::apply(const KvEvent& e) {
  if (const auto* init = std::get_if<kv_event::Init>(&e)) return on(*init);
  if (!init_) return malformed("the first event must be init");
  return std::visit([this](const auto& ev) { return on(ev); }, e);
}

std::optional<Failure> Model::on(const kv_event::Init& e) {
  if (init_) return malformed("a second init");
  if (e.device_blocks < 0 || e.device_blocks > kMaxBlocks || e.host_blocks < 0 || e.host_blocks > kMaxBlocks) {
    return malformed("pool sizes must be in [0, " + str(kMaxBlocks) + "]");
  }
  if (e.block_size < 1 || e.block_size > kMaxBlockSize) {
    return malformed("block_size must be in [1, " + str(kMaxBlockSize) + "]");
  }
  if (e.window < 0 || e.window > kMaxLen) return malformed("window must be in [0, " + str(kMaxLen) + "]");
  if (!e.group_windows.empty() && e.window != 0) return malformed("an init with groups has no window of its own");
  if (e.group_windows.size() > static_cast<size_t>(kMaxGroups)) {
    return malformed("at most " + str(kMaxGroups) + " KV-cache groups");
  }
  windows_ = e.group_windows.empty() ? std::vector<int64_t>{e.window} : e.group_windows;
  global_ = e.global_prefix;
  device_.assign(static_cast<size_t>(e.device_blocks), Block{});
  host_.assign(static_cast<size_t>(e.host_blocks), 0);
  block_size_ = e.block_size;
  init_ = true;
  return std::nullopt;
}

std::optional<Failure> Model::on(const kv_event::Add& e) {
  if (seqs_.count(e.seq) != 0) return violation("add of sequence " + str(e.seq) + ", which exists");
  seqs_[e.seq].tenant = e.tenant;
  seqs_[e.seq].tables.resize(static_cast<size_t>(num_groups()));
  return std::nullopt;
}

std::optional<Failure> Model::on(const kv_event::Fork& e) {
  Seq* parent = nullptr;
  if (auto f = find_seq(e.parent, parent)) return f;
  if (seqs_.count(e.child) != 0) return violation("fork into sequence " + str(e.child) + ", which exists");
  if (parent->on_host) return violation("fork of a swapped-out sequence");
  const int64_t tenant = parent->tenant;
  // The child starts with the parent's released entries; its shares follow them.
  std::vector<int64_t> released;
  for (const std::vector<int64_t>& t : parent->tables) released.push_back(released_of(t));
  Seq& child = seqs_[e.child];
  child.tenant = tenant;
  child.tables.resize(released.size());
  for (size_t g = 0; g < released.size(); ++g) child.tables[g].assign(static_cast<size_t>(released[g]), -1);
  return std::nullopt;
}

std::optional<Failure> Model::append_block(int64_t id, Seq& s, std::vector<int64_t>& table, int64_t block) {
  table.push_back(block);
  if (auto f = check_table(id, s)) return f;
  return check_blocks({block}, {});
}

std::optional<Failure> Model::on(const kv_event::Alloc& e) {
  Seq* s = nullptr;
  std::vector<int64_t>* table = nullptr;
  if (auto f = find_table(e.seq, e.group, s, table)) return f;
  if (auto f = block_in_pool(e.block, false)) return f;
  Block& blk = device_[static_cast<size_t>(e.block)];
  if (s->on_host) return violation("alloc of a device block to a swapped-out sequence");
  if (blk.refcount != 0) {
    return violation("I1: alloc of device block " + str(e.block) + ", in use (refcount " + str(blk.refcount) + ")");
  }
  if (blk.cached) return violation("I1: alloc of device block " + str(e.block) + ", still cached (no evict first)");
  blk.refcount = 1;
  blk.tenant = s->tenant;
  return append_block(e.seq, *s, *table, e.block);
}

std::optional<Failure> Model::on(const kv_event::Share& e) {
  Seq* s = nullptr;
  std::vector<int64_t>* table = nullptr;
  if (auto f = find_table(e.seq, e.group, s, table)) return f;
  if (e.block == -1) {
    // A prefix hit's entry before a windowed group's window: appended released. Slots bounds
    // it by the hit's length.
    if (e.reason != kv_event::ShareReason::kPrefixHit || windows_[static_cast<size_t>(e.group)] == 0) {
      return violation("share of a released entry (-1) that is not a prefix hit's in a windowed group");
    }
    if (released_of(*table) != static_cast<int64_t>(table->size())) {
      return violation("I11: sequence " + str(e.seq) + " appends a released entry after a live one");
    }
    table->push_back(-1);
    return std::nullopt;
  }
  if (auto f = block_in_pool(e.block, false)) return f;
  Block& blk = device_[static_cast<size_t>(e.block)];
  if (s->on_host) return violation("share into a swapped-out sequence");
  if (e.reason == kv_event::ShareReason::kPrefixHit) {
    if (!blk.cached) return violation("I4: prefix hit on device block " + str(e.block) + ", which is not cached");
    if (!global_ && blk.tenant != s->tenant) {
      return violation("I4: prefix hit shares device block " + str(e.block) + " of tenant " + str(blk.tenant) +
                       " with tenant " + str(s->tenant));
    }
  } else if (blk.refcount == 0) {
    return violation("I4: fork shares device block " + str(e.block) + ", which is not in use");
  }
  ++blk.refcount;
  return append_block(e.seq, *s, *table, e.block);
}

std::optional<Failure> Model::on(const kv_event::Cow& e) {
  Seq* s = nullptr;
  std::vector<int64_t>* table = nullptr;
  if (auto f = find_table(e.seq, e.group, s, table)) return f;
  if (auto f = block_in_pool(e.src, false)) return f;
  if (auto f = block_in_pool(e.dst, false)) return f;
  if (s->on_host) return violation("copy-on-write in a swapped-out sequence");
  if (e.index < 0 || e.index >= static_cast<int64_t>(table->size()) ||
      (*table)[static_cast<size_t>(e.index)] != e.src) {
    return violation("copy-on-write of block " + str(e.src) + " at index " + str(e.index) +
                     ", which the table does not hold there");
  }
  Block& d = device_[static_cast<size_t>(e.dst)];
  Block& sb = device_[static_cast<size_t>(e.src)];
  if (d.refcount != 0 || d.cached) {
    return violation("I1: copy-on-write into device block " + str(e.dst) + ", which is not free");
  }
  if (sb.refcount <= 1 && !sb.cached) {
    return violation("copy-on-write of device block " + str(e.src) + ", which is private (refcount " +
                     str(sb.refcount) + ", not cached)");
  }
  d.refcount = 1;
  d.tenant = s->tenant;
  --sb.refcount;
  (*table)[static_cast<size_t>(e.index)] = e.dst;
  return check_blocks({e.src, e.dst}, {});
}

std::optional<Failure> Model::on(const kv_event::Release& e) {
  Seq* s = nullptr;
  std::vector<int64_t>* table = nullptr;
  if (auto f = find_table(e.seq, e.group, s, table)) return f;
  if (e.block == -1) {  // an entry the window released: no block changes hands
    if (table->empty() || table->back() != -1) {
      return violation("release of a released entry, which is not the tail of sequence " + str(e.seq) + "'s table");
    }
    table->pop_back();
    return std::nullopt;
  }
  if (auto f = block_in_pool(e.block, s->on_host)) return f;
  if (table->empty() || table->back() != e.block) {
    return violation("release of block " + str(e.block) + ", which is not the tail of sequence " + str(e.seq) +
                     "'s table");
  }
  table->pop_back();
  if (s->on_host) {
    if (host_[static_cast<size_t>(e.block)] <= 0) return violation("I2: release of free host block " + str(e.block));
    --host_[static_cast<size_t>(e.block)];
    return check_blocks({}, {e.block});
  }
  if (device_[static_cast<size_t>(e.block)].refcount <= 0) {
    return violation("I2: release of free device block " + str(e.block));
  }
  --device_[static_cast<size_t>(e.block)].refcount;
  return check_blocks({e.block}, {});
}

std::optional<Failure> Model::on(const kv_event::WindowRelease& e) {
  Seq* s = nullptr;
  std::vector<int64_t>* table = nullptr;
  if (auto f = find_table(e.seq, e.group, s, table)) return f;
  if (auto f = block_in_pool(e.block, false)) return f;
  const int64_t window = windows_[static_cast<size_t>(e.group)];
  if (window == 0) {
    return violation(num_groups() == 1 ? "window_release in a log whose init has no window"
                                       : "window_release in group " + str(e.group) + ", which has no window");
  }
  if (s->on_host) return violation("window_release in a swapped-out sequence");
  const int64_t released = released_of(*table);
  if (e.index != released || e.index >= static_cast<int64_t>(table->size()) ||
      (*table)[static_cast<size_t>(e.index)] != e.block) {
    return violation("window_release of block " + str(e.block) + " at index " + str(e.index) + ": sequence " +
                     str(e.seq) + "'s first live entry is " + str(static_cast<int64_t>(released)));
  }
  // Every position of the block lies before the window of the sequence's last slot: no
  // token with a slot attends to it. (The manager's bound, through its final positions, is
  // tighter; check_window_blocks holds it.)
  if ((e.index + 1) * block_size_ > s->len - window + 1) {
    return violation("I11: window_release of sequence " + str(e.seq) + "'s block " + str(e.block) + " (positions " +
                     str(e.index * block_size_) + ".." + str((e.index + 1) * block_size_ - 1) + "), but position " +
                     str(s->len - 1) + " attends from " + str(std::max<int64_t>(0, s->len - window)));
  }
  Block& blk = device_[static_cast<size_t>(e.block)];
  if (blk.refcount <= 0) return violation("I2: window_release of free device block " + str(e.block));
  --blk.refcount;
  (*table)[static_cast<size_t>(e.index)] = -1;
  return check_blocks({e.block}, {});
}

std::optional<Failure> Model::on(const kv_event::Slots& e) {
  Seq* s = nullptr;
  if (auto f = find_seq(e.seq, s)) return f;
  if (e.len < 0 || e.len > kMaxLen) return malformed("field \"len\" out of range");
  s->len = e.len;
  const int64_t want = (e.len + block_size_ - 1) / block_size_;
  for (size_t g = 0; g < s->tables.size(); ++g) {
    const std::vector<int64_t>& t = s->tables[g];
    const std::string in = s->tables.size() > 1 ? " in group " + str(static_cast<int64_t>(g)) : std::string();
    // I12: every group's table covers the sequence's positions.
    if (static_cast<int64_t>(t.size()) != want) {
      return violation("I5: sequence " + str(e.seq) + " has " + str(static_cast<int64_t>(t.size())) + " blocks" + in +
                       " for length " + str(e.len) + " (expected " + str(want) + ")");
    }
    // I11: no released entry holds a position the last slot's window reaches.
    const int64_t released = released_of(t);
    if (released > 0 && released * block_size_ > e.len - windows_[g] + 1) {
      return violation("I11: sequence " + str(e.seq) + " has " + str(released) + " released entries" + in +
                       ", but position " + str(e.len - 1) + " attends from " +
                       str(std::max<int64_t>(0, e.len - windows_[g])));
    }
  }
  return std::nullopt;
}

std::optional<Failure> Model::on(const kv_event::Cache& e) {
  if (auto f = block_in_pool(e.block, false)) return f;
  Block& blk = device_[static_cast<size_t>(e.block)];
  if (blk.refcount == 0) return violation("cache of device block " + str(e.block) + ", which is not in use");
  if (blk.cached) return violation("cache of device block " + str(e.block) + ", which is already cached");
  blk.cached = true;
  return std::nullopt;
}

std::optional<Failure> Model::on(const kv_event::Evict& e) {
  if (auto f = block_in_pool(e.block, false)) return f;
  Block& blk = device_[static_cast<size_t>(e.block)];
  if (!blk.cached) return violation("evict of device block " + str(e.block) + ", which is not cached");
  blk.cached = false;
  return std::nullopt;
}

std::optional<Failure> Model::on(const kv_event::Poison& e) {
  if (auto f = block_in_pool(e.block, false)) return f;
  const Block& blk = device_[static_cast<size_t>(e.block)];
  if (blk.refcount != 0) {
    return violation("I7: poison of device block " + str(e.block) + ", in use (refcount " + str(blk.refcount) + ")");
  }
  if (blk.cached) return violation("I7: poison of device block " + str(e.block) + ", which is cached");
  return std::nullopt;
}

std::optional<Failure> Model::swap(int64_t id, const std::vector<BlockCopy>& pairs, bool out) {
  const std::string ev = out ? "swap_out" : "swap_in";
  Seq* s = nullptr;
  if (auto f = find_seq(id, s)) return f;
  if (s->on_host == out) return violation(ev + " of a sequence " + (out ? "already" : "not") + " swapped out");
  // The live entries move, group by group; released ones (-1, leading) stay.
  std::vector<int64_t*> live;
  for (std::vector<int64_t>& t : s->tables) {
    for (auto i = static_cast<size_t>(released_of(t)); i < t.size(); ++i) live.push_back(&t[i]);
  }
  if (pairs.size() != live.size()) {
    return violation(ev + " lists " + str(static_cast<int64_t>(pairs.size())) + " pairs for " +
                     (s->tables.size() > 1 ? "tables" : "a table") + " of " + str(static_cast<int64_t>(live.size())) +
                     " live entries");
  }
  std::vector<int64_t> touched_device, touched_host;
  const int64_t nd = static_cast<int64_t>(device_.size()), nh = static_cast<int64_t>(host_.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const int64_t src = pairs[i].src, dst = pairs[i].dst;
    const bool src_ok = out ? (src >= 0 && src < nd) : (src >= 0 && src < nh);
    const bool dst_ok = out ? (dst >= 0 && dst < nh) : (dst >= 0 && dst < nd);
    if (!src_ok || !dst_ok) {
      return violation(ev + " pair " + str(static_cast<int64_t>(i)) + " names a block outside its pool");
    }
    if (*live[i] != src) {
      return violation(ev + " pair " + str(static_cast<int64_t>(i)) + " source " + str(src) + " is not table entry " +
                       str(*live[i]));
    }
    if (out) {
      if (host_[static_cast<size_t>(dst)] != 0)
        return violation("I1: swap_out into host block " + str(dst) + ", in use");
      host_[static_cast<size_t>(dst)] = 1;
      --device_[static_cast<size_t>(src)].refcount;
      touched_device.push_back(src);
      touched_host.push_back(dst);
    } else {
      Block& d = device_[static_cast<size_t>(dst)];
      if (d.refcount != 0 || d.cached)
        return violation("I1: swap_in into device block " + str(dst) + ", which is not free");
      d.refcount = 1;
      d.tenant = s->tenant;
      --host_[static_cast<size_t>(src)];
      touched_device.push_back(dst);
      touched_host.push_back(src);
    }
    *live[i] = dst;
  }
  s->on_host = out;
  if (auto f = check_table(id, *s)) return f;
  return check_blocks(touched_device, touched_host);
}

std::optional<Failure> Model::on(const kv_event::Free& e) {
  auto it = seqs_.find(e.seq);
  if (it == seqs_.end()) return violation("free of unknown sequence " + str(e.seq));
  for (const std::vector<int64_t>& t : it->second.tables) {
    if (!t.empty()) {
      return violation("I6: free of sequence " + str(e.seq) + " that still holds " +
                       str(static_cast<int64_t>(t.size())) + " blocks");
    }
  }
  seqs_.erase(it);
  return std::nullopt;
}

void Model::fill(ReplayResult& r) const {
  r.sequences = static_cast<int64_t>(seqs_.size());
  r.device_in_use = std::count_if(device_.begin(), device_.end(), [](const Block& b) { return b.refcount > 0; });
  r.device_cached = std::count_if(device_.begin(), device_.end(), [](const Block& b) { return b.cached; });
  r.host_in_use = std::count_if(host_.begin(), host_.end(), [](int64_t rc) { return rc > 0; });
}

// Ends a replay: the failure at `where`, or the end-of-log checks.
ReplayResult finish(Model& model, ReplayResult r, const std::optional<Failure>& f, const std::string& where) {
  if (f) {
    r.kind = f->kind;
    r.message = where + ": " + f->reason;
  } else if (!model.initialized()) {
    r.kind = ReplayResult::Kind::kMalformed;
    r.message = where + ": the log has no init event";
    return r;
  } else if (auto end = model.check_all()) {
    r.kind = end->kind;
    r.message = "end of log (" + where + "): " + end->reason;
  }
  model.fill(r);
  return r;
}

bool is_init_line(const Json& j) {
  if (!j.is_object()) return false;
  auto it = j.find("ev");
  return it != j.end() && it->is_string() && it->get<std::string>() == "init";
}

}  // namespace

ReplayResult replay_event_log(std::istream& in) {
  ReplayResult r;
  Model model;
  std::string line;
  while (std::getline(in, line)) {
    ++r.lines;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    std::optional<Failure> f;
    KvEvent e;
    if (j.is_discarded()) {
      f = Failure{ReplayResult::Kind::kMalformed, "not valid JSON"};
    } else if (!model.initialized() && !is_init_line(j)) {
      f = Model::malformed("the first event must be init");
    } else if (!(f = decode(j, e))) {
      f = model.apply(e);
    }
    if (f) return finish(model, r, f, "line " + std::to_string(r.lines));
  }
  return finish(model, r, std::nullopt, "line " + std::to_string(r.lines));
}

ReplayResult replay_event_log(std::string_view text) {
  std::istringstream in{std::string(text)};
  return replay_event_log(in);
}

ReplayResult replay_events(std::span<const KvEvent> events) {
  ReplayResult r;
  Model model;
  for (const KvEvent& e : events) {
    ++r.lines;
    if (auto f = model.apply(e)) return finish(model, r, f, "event " + std::to_string(r.lines));
  }
  return finish(model, r, std::nullopt, "event " + std::to_string(r.lines));
}

}  // namespace kvp
