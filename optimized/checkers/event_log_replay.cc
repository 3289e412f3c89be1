#include "optimized/checkers/event_log_replay.h"

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
  std::vector<int64_t> table;
  int64_t len = 0;
};

class Model {
 public:
  std::optional<Failure> apply(const Json& j);
  void fill(ReplayResult& r) const;
  std::optional<Failure> check_all() const;
  bool initialized() const { return init_; }

 private:
  static Failure malformed(std::string r) { return {ReplayResult::Kind::kMalformed, std::move(r)}; }
  static Failure violation(std::string r) { return {ReplayResult::Kind::kViolation, std::move(r)}; }

  std::optional<Failure> get_int(const Json& j, const char* key, int64_t& out) const;
  std::optional<Failure> get_block(const Json& j, const char* key, bool host, int64_t& out) const;
  std::optional<Failure> get_seq(const Json& j, const char* key, Seq*& out);
  std::optional<Failure> get_pairs(const Json& j, std::vector<std::pair<int64_t, int64_t>>& out) const;
  std::optional<Failure> check_blocks(const std::vector<int64_t>& device_blocks,
                                      const std::vector<int64_t>& host_blocks) const;
  std::optional<Failure> check_table(int64_t id, const Seq& s) const;
  int64_t owners(int64_t block, bool host) const;

  bool init_ = false;
  bool global_ = false;
  int64_t block_size_ = 0;
  std::vector<Block> device_;
  std::vector<int64_t> host_;  // refcounts
  std::map<int64_t, Seq> seqs_;
};

std::string str(int64_t v) { return std::to_string(v); }

std::optional<Failure> Model::get_int(const Json& j, const char* key, int64_t& out) const {
  auto it = j.find(key);
  if (it == j.end()) return malformed(std::string("missing field \"") + key + "\"");
  if (it->is_number_integer() && !it->is_number_unsigned()) {
    out = it->get<int64_t>();
    return std::nullopt;
  }
  if (it->is_number_unsigned()) {
    const auto u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return malformed(std::string("field \"") + key + "\" out of range");
    }
    out = static_cast<int64_t>(u);
    return std::nullopt;
  }
  return malformed(std::string("field \"") + key + "\" is not an integer");
}

std::optional<Failure> Model::get_block(const Json& j, const char* key, bool host, int64_t& out) const {
  if (auto f = get_int(j, key, out)) return f;
  const int64_t n = host ? static_cast<int64_t>(host_.size()) : static_cast<int64_t>(device_.size());
  if (out < 0 || out >= n) {
    return violation(std::string(host ? "host" : "device") + " block " + str(out) + " outside the pool of " + str(n));
  }
  return std::nullopt;
}

std::optional<Failure> Model::get_seq(const Json& j, const char* key, Seq*& out) {
  int64_t id = 0;
  if (auto f = get_int(j, key, id)) return f;
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return violation("unknown sequence " + str(id));
  out = &it->second;
  return std::nullopt;
}

std::optional<Failure> Model::get_pairs(const Json& j, std::vector<std::pair<int64_t, int64_t>>& out) const {
  auto it = j.find("pairs");
  if (it == j.end()) return malformed("missing field \"pairs\"");
  if (!it->is_array()) return malformed("field \"pairs\" is not an array");
  for (const Json& p : *it) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number_integer()) {
      return malformed("field \"pairs\" holds an element that is not [int, int]");
    }
    out.emplace_back(p[0].get<int64_t>(), p[1].get<int64_t>());
  }
  return std::nullopt;
}

int64_t Model::owners(int64_t block, bool host) const {
  int64_t n = 0;
  for (const auto& [id, s] : seqs_) {
    if (s.on_host != host) continue;
    n += std::count(s.table.begin(), s.table.end(), block);
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
  std::vector<int64_t> sorted = s.table;
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
    if (static_cast<int64_t>(s.table.size()) != want) {
      return violation("I5: at the end, sequence " + str(id) + " has " + str(static_cast<int64_t>(s.table.size())) +
                       " blocks for length " + str(s.len) + " (expected " + str(want) + ")");
    }
  }
  return std::nullopt;
}

std::optional<Failure> Model::apply(const Json& j) {
  if (!j.is_object()) return malformed("not a JSON object");
  auto ev_it = j.find("ev");
  if (ev_it == j.end() || !ev_it->is_string()) return malformed("missing string field \"ev\"");
  const std::string ev = ev_it->get<std::string>();

  if (ev == "init") {
    if (init_) return malformed("a second init");
    int64_t nd = 0, nh = 0, bs = 0;
    if (auto f = get_int(j, "device_blocks", nd)) return f;
    if (auto f = get_int(j, "host_blocks", nh)) return f;
    if (auto f = get_int(j, "block_size", bs)) return f;
    if (nd < 0 || nd > kMaxBlocks || nh < 0 || nh > kMaxBlocks) {
      return malformed("pool sizes must be in [0, " + str(kMaxBlocks) + "]");
    }
    if (bs < 1 || bs > kMaxBlockSize) return malformed("block_size must be in [1, " + str(kMaxBlockSize) + "]");
    auto g = j.find("global_prefix");
    if (g != j.end() && !g->is_boolean()) return malformed("field \"global_prefix\" is not a boolean");
    global_ = g != j.end() && g->get<bool>();
    device_.assign(static_cast<size_t>(nd), Block{});
    host_.assign(static_cast<size_t>(nh), 0);
    block_size_ = bs;
    init_ = true;
    return std::nullopt;
  }
  if (!init_) return malformed("the first event must be init");

  if (ev == "add") {
    int64_t id = 0, tenant = 0;
    if (auto f = get_int(j, "seq", id)) return f;
    if (auto f = get_int(j, "tenant", tenant)) return f;
    if (seqs_.count(id) != 0) return violation("add of sequence " + str(id) + ", which exists");
    seqs_[id].tenant = tenant;
    return std::nullopt;
  }
  if (ev == "fork") {
    Seq* parent = nullptr;
    if (auto f = get_seq(j, "parent", parent)) return f;
    int64_t child = 0;
    if (auto f = get_int(j, "child", child)) return f;
    if (seqs_.count(child) != 0) return violation("fork into sequence " + str(child) + ", which exists");
    if (parent->on_host) return violation("fork of a swapped-out sequence");
    const int64_t tenant = parent->tenant;
    seqs_[child].tenant = tenant;
    return std::nullopt;
  }
  if (ev == "alloc") {
    Seq* s = nullptr;
    int64_t b = 0;
    if (auto f = get_seq(j, "seq", s)) return f;
    if (auto f = get_block(j, "block", false, b)) return f;
    Block& blk = device_[static_cast<size_t>(b)];
    if (s->on_host) return violation("alloc of a device block to a swapped-out sequence");
    if (blk.refcount != 0)
      return violation("I1: alloc of device block " + str(b) + ", in use (refcount " + str(blk.refcount) + ")");
    if (blk.cached) return violation("I1: alloc of device block " + str(b) + ", still cached (no evict first)");
    blk.refcount = 1;
    blk.tenant = s->tenant;
    s->table.push_back(b);
    if (auto f = check_table(j["seq"].get<int64_t>(), *s)) return f;
    return check_blocks({b}, {});
  }
  if (ev == "share") {
    Seq* s = nullptr;
    int64_t b = 0;
    if (auto f = get_seq(j, "seq", s)) return f;
    if (auto f = get_block(j, "block", false, b)) return f;
    auto r = j.find("reason");
    if (r == j.end() || !r->is_string()) return malformed("missing string field \"reason\"");
    const std::string reason = r->get<std::string>();
    Block& blk = device_[static_cast<size_t>(b)];
    if (s->on_host) return violation("share into a swapped-out sequence");
    if (reason == "prefix_hit") {
      if (!blk.cached) return violation("I4: prefix hit on device block " + str(b) + ", which is not cached");
      if (!global_ && blk.tenant != s->tenant) {
        return violation("I4: prefix hit shares device block " + str(b) + " of tenant " + str(blk.tenant) +
                         " with tenant " + str(s->tenant));
      }
    } else if (reason == "fork") {
      if (blk.refcount == 0) return violation("I4: fork shares device block " + str(b) + ", which is not in use");
    } else {
      return malformed("unknown share reason \"" + reason + "\"");
    }
    ++blk.refcount;
    s->table.push_back(b);
    if (auto f = check_table(j["seq"].get<int64_t>(), *s)) return f;
    return check_blocks({b}, {});
  }
  if (ev == "cow") {
    Seq* s = nullptr;
    int64_t index = 0, src = 0, dst = 0;
    if (auto f = get_seq(j, "seq", s)) return f;
    if (auto f = get_int(j, "index", index)) return f;
    if (auto f = get_block(j, "src", false, src)) return f;
    if (auto f = get_block(j, "dst", false, dst)) return f;
    if (s->on_host) return violation("copy-on-write in a swapped-out sequence");
    if (index < 0 || index >= static_cast<int64_t>(s->table.size()) || s->table[static_cast<size_t>(index)] != src) {
      return violation("copy-on-write of block " + str(src) + " at index " + str(index) +
                       ", which the table does not hold there");
    }
    Block& d = device_[static_cast<size_t>(dst)];
    Block& sb = device_[static_cast<size_t>(src)];
    if (d.refcount != 0 || d.cached)
      return violation("I1: copy-on-write into device block " + str(dst) + ", which is not free");
    if (sb.refcount <= 1 && !sb.cached) {
      return violation("copy-on-write of device block " + str(src) + ", which is private (refcount " +
                       str(sb.refcount) + ", not cached)");
    }
    d.refcount = 1;
    d.tenant = s->tenant;
    --sb.refcount;
    s->table[static_cast<size_t>(index)] = dst;
    return check_blocks({src, dst}, {});
  }
  if (ev == "release") {
    Seq* s = nullptr;
    int64_t b = 0;
    if (auto f = get_seq(j, "seq", s)) return f;
    if (auto f = get_block(j, "block", s->on_host, b)) return f;
    if (s->table.empty() || s->table.back() != b) {
      return violation("release of block " + str(b) + ", which is not the tail of sequence " +
                       str(j["seq"].get<int64_t>()) + "'s table");
    }
    s->table.pop_back();
    if (s->on_host) {
      if (host_[static_cast<size_t>(b)] <= 0) return violation("I2: release of free host block " + str(b));
      --host_[static_cast<size_t>(b)];
      return check_blocks({}, {b});
    }
    if (device_[static_cast<size_t>(b)].refcount <= 0) return violation("I2: release of free device block " + str(b));
    --device_[static_cast<size_t>(b)].refcount;
    return check_blocks({b}, {});
  }
  if (ev == "slots") {
    Seq* s = nullptr;
    int64_t len = 0;
    if (auto f = get_seq(j, "seq", s)) return f;
    if (auto f = get_int(j, "len", len)) return f;
    if (len < 0 || len > kMaxLen) return malformed("field \"len\" out of range");
    s->len = len;
    const int64_t want = (len + block_size_ - 1) / block_size_;
    if (static_cast<int64_t>(s->table.size()) != want) {
      return violation("I5: sequence " + str(j["seq"].get<int64_t>()) + " has " +
                       str(static_cast<int64_t>(s->table.size())) + " blocks for length " + str(len) + " (expected " +
                       str(want) + ")");
    }
    return std::nullopt;
  }
  if (ev == "cache") {
    int64_t b = 0;
    if (auto f = get_block(j, "block", false, b)) return f;
    Block& blk = device_[static_cast<size_t>(b)];
    if (blk.refcount == 0) return violation("cache of device block " + str(b) + ", which is not in use");
    if (blk.cached) return violation("cache of device block " + str(b) + ", which is already cached");
    blk.cached = true;
    return std::nullopt;
  }
  if (ev == "evict") {
    int64_t b = 0;
    if (auto f = get_block(j, "block", false, b)) return f;
    Block& blk = device_[static_cast<size_t>(b)];
    if (!blk.cached) return violation("evict of device block " + str(b) + ", which is not cached");
    blk.cached = false;
    return std::nullopt;
  }
  if (ev == "poison") {
    int64_t b = 0;
    if (auto f = get_block(j, "block", false, b)) return f;
    const Block& blk = device_[static_cast<size_t>(b)];
    if (blk.refcount != 0)
      return violation("I7: poison of device block " + str(b) + ", in use (refcount " + str(blk.refcount) + ")");
    if (blk.cached) return violation("I7: poison of device block " + str(b) + ", which is cached");
    return std::nullopt;
  }
  if (ev == "swap_out" || ev == "swap_in") {
    const bool out = ev == "swap_out";
    Seq* s = nullptr;
    if (auto f = get_seq(j, "seq", s)) return f;
    std::vector<std::pair<int64_t, int64_t>> pairs;
    if (auto f = get_pairs(j, pairs)) return f;
    if (s->on_host == out) return violation(ev + " of a sequence " + (out ? "already" : "not") + " swapped out");
    if (pairs.size() != s->table.size()) {
      return violation(ev + " lists " + str(static_cast<int64_t>(pairs.size())) + " pairs for a table of " +
                       str(static_cast<int64_t>(s->table.size())));
    }
    std::vector<int64_t> touched_device, touched_host;
    for (size_t i = 0; i < pairs.size(); ++i) {
      const int64_t src = pairs[i].first, dst = pairs[i].second;
      const int64_t nd = static_cast<int64_t>(device_.size()), nh = static_cast<int64_t>(host_.size());
      const bool src_ok = out ? (src >= 0 && src < nd) : (src >= 0 && src < nh);
      const bool dst_ok = out ? (dst >= 0 && dst < nh) : (dst >= 0 && dst < nd);
      if (!src_ok || !dst_ok)
        return violation(ev + " pair " + str(static_cast<int64_t>(i)) + " names a block outside its pool");
      if (s->table[i] != src)
        return violation(ev + " pair " + str(static_cast<int64_t>(i)) + " source " + str(src) + " is not table entry " +
                         str(s->table[i]));
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
      s->table[i] = dst;
    }
    s->on_host = out;
    if (auto f = check_table(j["seq"].get<int64_t>(), *s)) return f;
    return check_blocks(touched_device, touched_host);
  }
  if (ev == "free") {
    int64_t id = 0;
    if (auto f = get_int(j, "seq", id)) return f;
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return violation("free of unknown sequence " + str(id));
    if (!it->second.table.empty()) {
      return violation("I6: free of sequence " + str(id) + " that still holds " +
                       str(static_cast<int64_t>(it->second.table.size())) + " blocks");
    }
    seqs_.erase(it);
    return std::nullopt;
  }
  return malformed("unknown event \"" + ev + "\"");
}

void Model::fill(ReplayResult& r) const {
  r.sequences = static_cast<int64_t>(seqs_.size());
  r.device_in_use = std::count_if(device_.begin(), device_.end(), [](const Block& b) { return b.refcount > 0; });
  r.device_cached = std::count_if(device_.begin(), device_.end(), [](const Block& b) { return b.cached; });
  r.host_in_use = std::count_if(host_.begin(), host_.end(), [](int64_t rc) { return rc > 0; });
}

}  // namespace

ReplayResult replay_event_log(std::istream& in) {
  ReplayResult r;
  Model model;
  std::string line;
  while (std::getline(in, line)) {
    ++r.lines;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    std::optional<Failure> f;
    if (j.is_discarded()) {
      f = Failure{ReplayResult::Kind::kMalformed, "not valid JSON"};
    } else {
      f = model.apply(j);
    }
    if (f) {
      r.kind = f->kind;
      r.message = "line " + std::to_string(r.lines) + ": " + f->reason;
      model.fill(r);
      return r;
    }
  }
  if (!model.initialized()) {
    r.kind = ReplayResult::Kind::kMalformed;
    r.message = "line " + std::to_string(r.lines) + ": the log has no init event";
    return r;
  }
  if (auto f = model.check_all()) {
    r.kind = f->kind;
    r.message = "end of log (line " + std::to_string(r.lines) + "): " + f->reason;
  }
  model.fill(r);
  return r;
}

ReplayResult replay_event_log(std::string_view text) {
  std::istringstream in{std::string(text)};
  return replay_event_log(in);
}

}  // namespace kvp
