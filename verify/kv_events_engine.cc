#include "verify/kv_events_engine.h"

#include <chrono>
#include <set>
#include <string>
#include <utility>

#include "audit/kv_events/kv_events_audit.h"

namespace kvp::kv_events {
namespace {

BlockHash hash_text(const kvp::BlockHash& h) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (uint8_t b : h) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

}  // namespace

void EngineKvEvents::on_event(const KvEvent& event) {
  if (const auto* c = std::get_if<kv_event::Cache>(&event)) {
    const PrefixCacheEntry& entry = kv_.prefix_cache().entry(c->block);
    const KvCacheConfig& config = kv_.config();
    BlockStored s;
    s.block_hashes = {hash_text(entry.hash)};
    bool root = entry.parent.block < 0;
    if (!root) {
      auto it = published_.find(entry.parent.block);
      if (it != published_.end()) {
        // Anchored: the parent entry is the anchor's block of the same positions, whose
        // parent is this block's too (an anchor's root makes this one a root).
        const bool anchored = config.num_groups() > 1 && entry.group != config.anchor_group() &&
                              config.anchor_group() >= 0 && it->second.group == config.anchor_group();
        if (anchored) {
          s.parent_block_hash = it->second.parent;
          root = !it->second.parent;
        } else {
          s.parent_block_hash = it->second.hash;
        }
      }
    }
    if (root && !config.global_prefix_sharing)
      s.extra_keys = nlohmann::json::array({nlohmann::json::array({"tenant:" + std::to_string(entry.salt)})});
    s.token_ids.assign(entry.tokens.begin(), entry.tokens.end());
    s.block_size = kv_.block_size();
    s.medium = kDefaultMedium;
    if (config.num_groups() > 1) s.group_idx = entry.group;
    published_[c->block] = {s.block_hashes.front(), s.parent_block_hash, s.group_idx};
    pending_.push_back(std::move(s));
  } else if (const auto* e = std::get_if<kv_event::Evict>(&event)) {
    auto it = published_.find(e->block);
    BlockRemoved r;
    r.block_hashes = {it != published_.end() ? it->second.hash : BlockHash("-1")};
    r.medium = kDefaultMedium;
    if (it != published_.end()) {
      r.group_idx = it->second.group;
      published_.erase(it);
    }
    pending_.push_back(std::move(r));
  }
}

void EngineKvEvents::end_step() {
  if (pending_.empty()) return;
  EventBatch b;
  b.ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  b.events = std::move(pending_);
  b.data_parallel_rank = 0;
  pending_.clear();
  b.seq = static_cast<int64_t>(batches_.size());
  if (publisher_ != nullptr) {
    publisher_->publish(b);
    publisher_->serve_replay(0);
  }
  batches_.push_back(std::move(b));
}

Status check_stream_against_event_log(const std::vector<KvEvent>& log, const std::vector<EventBatch>& stream) {
  // The stream's stores and removals, flattened in order: (stored?, hash, batch seq).
  struct Item {
    bool stored;
    BlockHash hash;
    int64_t seq;
    std::optional<int64_t> group;
  };
  std::vector<Item> items;
  for (const auto& b : stream)
    for (const auto& ev : b.events) {
      if (const auto* s = std::get_if<BlockStored>(&ev)) {
        for (const auto& h : s->block_hashes) items.push_back({true, h, b.seq, s->group_idx});
      } else if (const auto* r = std::get_if<BlockRemoved>(&ev)) {
        for (const auto& h : r->block_hashes) items.push_back({false, h, b.seq, r->group_idx});
      } else {
        return Status::error("batch " + std::to_string(b.seq) + ": AllBlocksCleared, which the event log never has");
      }
    }
  const auto group_text = [](const std::optional<int64_t>& g) {
    return g ? "group " + std::to_string(*g) : std::string("no group");
  };
  std::unordered_map<int32_t, Item> stored_as;
  std::size_t next = 0;
  for (std::size_t i = 0; i < log.size(); ++i) {
    const auto* c = std::get_if<kv_event::Cache>(&log[i]);
    const auto* e = std::get_if<kv_event::Evict>(&log[i]);
    if (c == nullptr && e == nullptr) continue;
    const int32_t block = c != nullptr ? c->block : e->block;
    const std::string what = "event log entry " + std::to_string(i) + " (" + (c != nullptr ? "cache" : "evict") +
                             " of block " + std::to_string(block) + ")";
    if (next == items.size()) return Status::error(what + ": not in the stream");
    const Item& it = items[next++];
    if (it.stored != (c != nullptr))
      return Status::error(what + ": the stream has a " + (it.stored ? "store" : "removal") + " of " + it.hash +
                           " in batch " + std::to_string(it.seq));
    if (c != nullptr) {
      if (!stored_as.emplace(block, it).second) return Status::error(what + ": block registered twice without a drop");
    } else {
      auto s = stored_as.find(block);
      if (s == stored_as.end()) return Status::error(what + ": block never registered");
      if (s->second.hash != it.hash)
        return Status::error(what + ": the stream removes " + it.hash + " in batch " + std::to_string(it.seq) +
                             ", the block was stored as " + s->second.hash);
      if (s->second.group != it.group)
        return Status::error(what + ": the stream removes " + it.hash + " from " + group_text(it.group) + " in batch " +
                             std::to_string(it.seq) + ", the block was stored in " + group_text(s->second.group) +
                             " (batch " + std::to_string(s->second.seq) + ")");
      stored_as.erase(s);
    }
  }
  if (next != items.size())
    return Status::error("batch " + std::to_string(items[next].seq) + ": " +
                         (items[next].stored ? "store" : "removal") + " of " + items[next].hash +
                         " that the event log does not have");
  return Status::ok();
}

verify::CheckResult check_engine_stream(std::string name, const std::vector<KvEvent>& log,
                                        const std::vector<EventBatch>& stream, bool published) {
  verify::CheckResult check(std::move(name));
  const auto stream_audit = audit_kv_events(stream, "kvproof");
  check.count = stream_audit.batches;
  if (!stream_audit.passed()) {
    check.passed = false;
    const auto& v = stream_audit.violations.front();
    check.detail = v.reason + " at batch " + std::to_string(v.seq) + ", block " + v.block_hash + ": " + v.detail;
  } else if (Status s = check_stream_against_event_log(log, stream); !s) {
    check.passed = false;
    check.detail = "against the event log: " + s.message();
  } else {
    std::set<int64_t> groups;
    for (const auto& b : stream)
      for (const auto& ev : b.events)
        if (const auto* st = std::get_if<BlockStored>(&ev); st != nullptr && st->group_idx)
          groups.insert(*st->group_idx);
    check.detail = std::to_string(stream_audit.mirror.stored) + " stores, " +
                   std::to_string(stream_audit.mirror.removed) + " removals, as in the event log" +
                   (groups.empty() ? "" : ", in " + std::to_string(groups.size()) + " KV-cache groups") +
                   (published ? "; published" : "");
  }
  return check;
}

}  // namespace kvp::kv_events
