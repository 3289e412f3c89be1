#include "optimized/kv/event_log.h"

#include <string>

namespace kvp {

namespace {

// The lines are written by hand (the format is small and fixed, see event_log.h): the log
// is made for every manager state change in audit runs and fuzzing, and a JSON library's
// object building costs ten times more. The replayer parses them with a JSON library.
class Line {
 public:
  explicit Line(const char* ev) { s_ = std::string("{\"ev\":\"") + ev + "\""; }
  Line& field(const char* key, int64_t v) {
    s_ += ",\"";
    s_ += key;
    s_ += "\":";
    s_ += std::to_string(v);
    return *this;
  }
  Line& field_if(const char* key, int64_t v, bool present) { return present ? field(key, v) : *this; }
  // A KV-cache group other than the first (0, the only one without groups, is left out).
  Line& group(int32_t g) { return field_if("group", g, g > 0); }
  // An array of integers, when not empty.
  Line& ints_if(const char* key, const std::vector<int64_t>& v) {
    if (v.empty()) return *this;
    s_ += ",\"";
    s_ += key;
    s_ += "\":[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i > 0) s_ += ",";
      s_ += std::to_string(v[i]);
    }
    s_ += "]";
    return *this;
  }
  Line& field(const char* key, bool v) {
    s_ += ",\"";
    s_ += key;
    s_ += v ? "\":true" : "\":false";
    return *this;
  }
  Line& field(const char* key, const char* v) {
    s_ += ",\"";
    s_ += key;
    s_ += "\":\"";
    s_ += v;
    s_ += "\"";
    return *this;
  }
  Line& pairs(const std::vector<BlockCopy>& pairs) {
    s_ += ",\"pairs\":[";
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      s_ += i == 0 ? "[" : ",[";
      s_ += std::to_string(pairs[i].src);
      s_ += ",";
      s_ += std::to_string(pairs[i].dst);
      s_ += "]";
    }
    s_ += "]";
    return *this;
  }
  std::string done() { return std::move(s_) + "}"; }

 private:
  std::string s_;
};

struct ToLine {
  std::string operator()(const kv_event::Init& e) const {
    return Line("init")
        .field("device_blocks", int64_t{e.device_blocks})
        .field("host_blocks", int64_t{e.host_blocks})
        .field("block_size", int64_t{e.block_size})
        .field("global_prefix", e.global_prefix)
        .field_if("window", e.window, e.window > 0)
        .ints_if("groups", e.group_windows)
        .done();
  }
  std::string operator()(const kv_event::Add& e) const {
    return Line("add").field("seq", e.seq).field("tenant", e.tenant).done();
  }
  std::string operator()(const kv_event::Fork& e) const {
    return Line("fork").field("parent", e.parent).field("child", e.child).done();
  }
  std::string operator()(const kv_event::Alloc& e) const {
    return Line("alloc").field("seq", e.seq).field("block", int64_t{e.block}).group(e.group).done();
  }
  std::string operator()(const kv_event::Share& e) const {
    return Line("share")
        .field("seq", e.seq)
        .field("block", int64_t{e.block})
        .field("reason", e.reason == kv_event::ShareReason::kFork ? "fork" : "prefix_hit")
        .group(e.group)
        .done();
  }
  std::string operator()(const kv_event::Cow& e) const {
    return Line("cow")
        .field("seq", e.seq)
        .field("index", e.index)
        .field("src", int64_t{e.src})
        .field("dst", int64_t{e.dst})
        .group(e.group)
        .done();
  }
  std::string operator()(const kv_event::Release& e) const {
    return Line("release").field("seq", e.seq).field("block", int64_t{e.block}).group(e.group).done();
  }
  std::string operator()(const kv_event::WindowRelease& e) const {
    return Line("window_release")
        .field("seq", e.seq)
        .field("index", e.index)
        .field("block", int64_t{e.block})
        .group(e.group)
        .done();
  }
  std::string operator()(const kv_event::Slots& e) const {
    return Line("slots").field("seq", e.seq).field("len", e.len).done();
  }
  std::string operator()(const kv_event::Cache& e) const {
    return Line("cache").field("block", int64_t{e.block}).done();
  }
  std::string operator()(const kv_event::Evict& e) const {
    return Line("evict").field("block", int64_t{e.block}).done();
  }
  std::string operator()(const kv_event::SwapOut& e) const {
    return Line("swap_out").field("seq", e.seq).pairs(e.pairs).done();
  }
  std::string operator()(const kv_event::SwapIn& e) const {
    return Line("swap_in").field("seq", e.seq).pairs(e.pairs).done();
  }
  std::string operator()(const kv_event::Poison& e) const {
    return Line("poison").field("block", int64_t{e.block}).done();
  }
  std::string operator()(const kv_event::Free& e) const { return Line("free").field("seq", e.seq).done(); }
};

}  // namespace

std::string to_json_line(const KvEvent& event) { return std::visit(ToLine{}, event); }

}  // namespace kvp
