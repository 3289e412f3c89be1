#include "optimized/kv/event_log.h"

#include <nlohmann/json.hpp>

namespace kvp {

namespace {

using Json = nlohmann::json;

Json pairs_json(const std::vector<BlockCopy>& pairs) {
  Json j = Json::array();
  for (const BlockCopy& c : pairs) j.push_back({c.src, c.dst});
  return j;
}

struct ToJson {
  Json operator()(const kv_event::Init& e) const {
    return {{"ev", "init"},
            {"device_blocks", e.device_blocks},
            {"host_blocks", e.host_blocks},
            {"block_size", e.block_size},
            {"global_prefix", e.global_prefix}};
  }
  Json operator()(const kv_event::Add& e) const { return {{"ev", "add"}, {"seq", e.seq}, {"tenant", e.tenant}}; }
  Json operator()(const kv_event::Fork& e) const { return {{"ev", "fork"}, {"parent", e.parent}, {"child", e.child}}; }
  Json operator()(const kv_event::Alloc& e) const { return {{"ev", "alloc"}, {"seq", e.seq}, {"block", e.block}}; }
  Json operator()(const kv_event::Share& e) const {
    return {{"ev", "share"},
            {"seq", e.seq},
            {"block", e.block},
            {"reason", e.reason == kv_event::ShareReason::kFork ? "fork" : "prefix_hit"}};
  }
  Json operator()(const kv_event::Cow& e) const {
    return {{"ev", "cow"}, {"seq", e.seq}, {"index", e.index}, {"src", e.src}, {"dst", e.dst}};
  }
  Json operator()(const kv_event::Release& e) const { return {{"ev", "release"}, {"seq", e.seq}, {"block", e.block}}; }
  Json operator()(const kv_event::Slots& e) const { return {{"ev", "slots"}, {"seq", e.seq}, {"len", e.len}}; }
  Json operator()(const kv_event::Cache& e) const { return {{"ev", "cache"}, {"block", e.block}}; }
  Json operator()(const kv_event::Evict& e) const { return {{"ev", "evict"}, {"block", e.block}}; }
  Json operator()(const kv_event::SwapOut& e) const {
    return {{"ev", "swap_out"}, {"seq", e.seq}, {"pairs", pairs_json(e.pairs)}};
  }
  Json operator()(const kv_event::SwapIn& e) const {
    return {{"ev", "swap_in"}, {"seq", e.seq}, {"pairs", pairs_json(e.pairs)}};
  }
  Json operator()(const kv_event::Poison& e) const { return {{"ev", "poison"}, {"block", e.block}}; }
  Json operator()(const kv_event::Free& e) const { return {{"ev", "free"}, {"seq", e.seq}}; }
};

}  // namespace

std::string to_json_line(const KvEvent& event) { return std::visit(ToJson{}, event).dump(); }

}  // namespace kvp
