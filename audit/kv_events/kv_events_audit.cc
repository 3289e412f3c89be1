#include "audit/kv_events/kv_events_audit.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace kvp::kv_events {
namespace {

// Where a block lives in the mirror: its medium, and its KV-cache group where one is given
// (a hybrid model's groups hash the same tokens to the same hash).
std::string medium_key(const std::optional<std::string>& medium, const std::optional<int64_t>& group) {
  std::string k = medium.value_or(kDefaultMedium);
  if (group) k += "/group" + std::to_string(*group);
  return k;
}

// Calls on_stored / on_removed / on_cleared for every event, in sequence order.
template <typename Stored, typename Removed, typename Cleared>
void replay(const std::vector<EventBatch>& batches, Stored on_stored, Removed on_removed, Cleared on_cleared) {
  for (const EventBatch& b : in_sequence(batches)) {
    for (const KvCacheEvent& ev : b.events) {
      if (const auto* s = std::get_if<BlockStored>(&ev)) {
        on_stored(b.seq, *s);
      } else if (const auto* r = std::get_if<BlockRemoved>(&ev)) {
        on_removed(b.seq, *r);
      } else {
        on_cleared(b.seq);
      }
    }
  }
}

// Held hashes per medium key.
using Held = std::unordered_map<std::string, std::unordered_set<BlockHash>>;

std::string salt_in(const nlohmann::json& entry) {
  if (entry.is_object() && entry.contains("cache_salt") && entry["cache_salt"].is_string())
    return entry["cache_salt"].get<std::string>();
  return "";
}

}  // namespace

std::vector<EventBatch> in_sequence(const std::vector<EventBatch>& batches) {
  std::vector<EventBatch> out;
  std::set<int64_t> seen;
  for (const auto& b : batches)
    if (seen.insert(b.seq).second) out.push_back(b);
  std::stable_sort(out.begin(), out.end(), [](const EventBatch& a, const EventBatch& b) { return a.seq < b.seq; });
  return out;
}

std::vector<Violation> check_sequence(const std::vector<EventBatch>& batches) {
  std::vector<Violation> out;
  const auto ordered = in_sequence(batches);
  for (std::size_t i = 1; i < ordered.size(); ++i) {
    const int64_t prev = ordered[i - 1].seq, seq = ordered[i].seq;
    if (seq != prev + 1) {
      // In unsigned arithmetic: seq > prev, and their difference can exceed int64's range (a
      // fuzzed stream numbered from near INT64_MIN; UBSan caught the signed overflow).
      const uint64_t lost = static_cast<uint64_t>(seq) - static_cast<uint64_t>(prev) - 1;
      out.push_back({kSequenceGap, seq, "",
                     std::to_string(lost) + " batch" + (lost == 1 ? "" : "es") + " lost: " + std::to_string(prev + 1) +
                         (lost == 1 ? "" : ".." + std::to_string(seq - 1))});
    }
  }
  return out;
}

std::vector<Violation> check_removed_were_stored(const std::vector<EventBatch>& batches) {
  std::vector<Violation> out;
  Held held;
  std::unordered_set<BlockHash> cleared;  // held when some AllBlocksCleared came
  replay(
      batches,
      [&](int64_t, const BlockStored& e) {
        for (const auto& h : e.block_hashes) held[medium_key(e.medium, e.group_idx)].insert(h);
      },
      [&](int64_t seq, const BlockRemoved& e) {
        const std::string m = medium_key(e.medium, e.group_idx);
        for (const auto& h : e.block_hashes) {
          if (held[m].erase(h) == 0 && cleared.count(h) == 0)
            out.push_back({kRemovedNotStored, seq, h, "medium " + m + " does not hold it"});
        }
      },
      [&](int64_t) {
        for (auto& [m, hs] : held) cleared.insert(hs.begin(), hs.end());
        held.clear();
      });
  return out;
}

std::vector<Violation> check_stored_once(const std::vector<EventBatch>& batches) {
  std::vector<Violation> out;
  Held held;
  replay(
      batches,
      [&](int64_t seq, const BlockStored& e) {
        const std::string m = medium_key(e.medium, e.group_idx);
        for (const auto& h : e.block_hashes)
          if (!held[m].insert(h).second)
            out.push_back({kStoredTwice, seq, h, "medium " + m + " already holds it (no removal between)"});
      },
      [&](int64_t, const BlockRemoved& e) {
        for (const auto& h : e.block_hashes) held[medium_key(e.medium, e.group_idx)].erase(h);
      },
      [&](int64_t) { held.clear(); });
  return out;
}

std::vector<Violation> check_block_sizes(const std::vector<EventBatch>& batches) {
  std::vector<Violation> out;
  std::map<int64_t, std::pair<int64_t, int64_t>> size_of_group;  // group (-1: none) -> (size, seq first seen)
  replay(
      batches,
      [&](int64_t seq, const BlockStored& e) {
        const std::string first = e.block_hashes.empty() ? "" : e.block_hashes.front();
        const auto want = static_cast<uint64_t>(e.block_size) * e.block_hashes.size();
        if (e.block_size <= 0 || e.token_ids.size() != want) {
          out.push_back({kTokenCount, seq, first,
                         std::to_string(e.token_ids.size()) + " token ids for " +
                             std::to_string(e.block_hashes.size()) + " full blocks of " +
                             std::to_string(e.block_size)});
        }
        const int64_t group = e.group_idx.value_or(-1);
        auto [it, fresh] = size_of_group.try_emplace(group, e.block_size, seq);
        if (!fresh && it->second.first != e.block_size)
          out.push_back({kBlockSizeChanged, seq, first,
                         "block size " + std::to_string(e.block_size) + ", the stream's is " +
                             std::to_string(it->second.first) + " (since batch " + std::to_string(it->second.second) +
                             ")"});
      },
      [](int64_t, const BlockRemoved&) {}, [](int64_t) {});
  return out;
}

std::vector<std::string> block_namespaces(const BlockStored& e, const std::string* parent_ns) {
  std::string lora = "base";
  if (e.lora_name) {
    lora = "lora=" + *e.lora_name;
  } else if (e.lora_id) {
    lora = "lora_id=" + std::to_string(*e.lora_id);
  }
  // The salt the chain carries in: the parent's, when known.
  std::string salt;
  if (parent_ns != nullptr) {
    const auto at = parent_ns->find(" salt=");
    if (at != std::string::npos) salt = parent_ns->substr(at + 6);
  }
  const std::string event_salt = salt_in(e.extra_keys);  // SGLang: one map for the event
  std::vector<std::string> out;
  for (std::size_t i = 0; i < e.block_hashes.size(); ++i) {
    std::string explicit_salt = event_salt;
    if (e.extra_keys.is_array() && i < e.extra_keys.size()) {
      const nlohmann::json& entry = e.extra_keys[i];
      if (!salt_in(entry).empty()) explicit_salt = salt_in(entry);
      const bool root = i == 0 && !e.parent_block_hash;
      if (root && entry.is_array()) {
        for (const auto& k : entry)
          if (k.is_string() && (!e.lora_name || k.get<std::string>() != *e.lora_name))
            explicit_salt += (explicit_salt.empty() ? "" : ",") + k.get<std::string>();
      }
    }
    if (!explicit_salt.empty()) salt = explicit_salt;
    out.push_back(salt.empty() ? lora : lora + " salt=" + salt);
  }
  return out;
}

std::vector<Violation> check_namespaces(const std::vector<EventBatch>& batches) {
  std::vector<Violation> out;
  std::unordered_map<BlockHash, std::string> ns_of;  // every hash ever stored -> its namespace
  replay(
      batches,
      [&](int64_t seq, const BlockStored& e) {
        const std::string* parent_ns = nullptr;
        if (e.parent_block_hash) {
          auto it = ns_of.find(*e.parent_block_hash);
          if (it != ns_of.end()) parent_ns = &it->second;
        }
        const std::string parent_copy = parent_ns != nullptr ? *parent_ns : "";
        const auto ns = block_namespaces(e, parent_ns);
        for (std::size_t i = 0; i < e.block_hashes.size(); ++i) {
          const BlockHash& h = e.block_hashes[i];
          const std::string* before = i > 0 ? &ns[i - 1] : (parent_ns != nullptr ? &parent_copy : nullptr);
          if (before != nullptr && *before != ns[i]) {
            const BlockHash& parent = i > 0 ? e.block_hashes[i - 1] : *e.parent_block_hash;
            out.push_back(
                {kNamespaceCrossing, seq, h, "namespace " + ns[i] + ", its parent " + parent + " " + *before});
          }
          auto [it, fresh] = ns_of.try_emplace(h, ns[i]);
          if (!fresh && it->second != ns[i])
            out.push_back({kNamespaceMerge, seq, h, "stored under " + ns[i] + ", earlier under " + it->second});
        }
      },
      [](int64_t, const BlockRemoved&) {}, [](int64_t) {});
  return out;
}

std::vector<Violation> check_no_reference_after_clear(const std::vector<EventBatch>& batches) {
  std::vector<Violation> out;
  std::unordered_set<BlockHash> held, stale;  // stale: held at a clear, not stored since
  replay(
      batches,
      [&](int64_t seq, const BlockStored& e) {
        if (e.parent_block_hash && stale.count(*e.parent_block_hash) != 0 && held.count(*e.parent_block_hash) == 0)
          out.push_back({kStaleAfterClear, seq, *e.parent_block_hash,
                         "named as the parent of " + (e.block_hashes.empty() ? "nothing" : e.block_hashes.front()) +
                             " after AllBlocksCleared"});
        for (const auto& h : e.block_hashes) {
          held.insert(h);
          stale.erase(h);
        }
      },
      [&](int64_t seq, const BlockRemoved& e) {
        for (const auto& h : e.block_hashes) {
          if (stale.count(h) != 0 && held.count(h) == 0)
            out.push_back({kStaleAfterClear, seq, h, "removed after AllBlocksCleared"});
          held.erase(h);
        }
      },
      [&](int64_t) {
        stale.insert(held.begin(), held.end());
        held.clear();
      });
  return out;
}

Mirror mirror_at_end(const std::vector<EventBatch>& batches) {
  Mirror m;
  // medium key -> hash -> (namespace, store order)
  std::map<std::string, std::unordered_map<BlockHash, std::pair<std::string, int64_t>>> held;
  std::unordered_map<BlockHash, std::string> ns_of;
  int64_t order = 0;
  replay(
      batches,
      [&](int64_t, const BlockStored& e) {
        const std::string* parent_ns = nullptr;
        if (e.parent_block_hash) {
          auto it = ns_of.find(*e.parent_block_hash);
          if (it != ns_of.end()) parent_ns = &it->second;
        }
        const auto ns = block_namespaces(e, parent_ns);
        for (std::size_t i = 0; i < e.block_hashes.size(); ++i) {
          ns_of[e.block_hashes[i]] = ns[i];
          held[medium_key(e.medium, e.group_idx)][e.block_hashes[i]] = {ns[i], order++};
          ++m.stored;
        }
      },
      [&](int64_t, const BlockRemoved& e) {
        for (const auto& h : e.block_hashes) m.removed += held[medium_key(e.medium, e.group_idx)].erase(h) != 0 ? 1 : 0;
      },
      [&](int64_t) {
        ++m.clears;
        held.clear();
      });
  std::vector<std::pair<int64_t, std::string>> left;
  for (const auto& [medium, hs] : held) {
    if (hs.empty()) continue;
    m.held_per_medium[medium] = static_cast<int64_t>(hs.size());
    for (const auto& [h, v] : hs) {
      ++m.held_per_namespace[v.first];
      left.emplace_back(v.second, medium + " " + h);
    }
  }
  std::sort(left.begin(), left.end());
  for (auto& [o, s] : left) m.never_removed.push_back(std::move(s));
  return m;
}

KvEventAudit audit_kv_events(const std::vector<EventBatch>& batches, const std::string& source) {
  KvEventAudit a;
  a.source = source;
  a.frames = static_cast<int64_t>(batches.size());
  const auto ordered = in_sequence(batches);
  a.batches = static_cast<int64_t>(ordered.size());
  a.duplicates = a.frames - a.batches;
  for (const auto& b : ordered) a.events += static_cast<int64_t>(b.events.size());
  if (!ordered.empty()) {
    a.first_seq = ordered.front().seq;
    a.last_seq = ordered.back().seq;
  }
  for (auto* check : {check_sequence, check_removed_were_stored, check_stored_once, check_block_sizes, check_namespaces,
                      check_no_reference_after_clear}) {
    auto v = check(ordered);
    a.violations.insert(a.violations.end(), v.begin(), v.end());
  }
  a.mirror = mirror_at_end(ordered);
  return a;
}

Result<KvEventAudit> audit_recording(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(path.string() + ": cannot open");
  auto frames = read_recording(in, path.string());
  if (!frames) return frames.status();
  std::vector<EventBatch> batches;
  batches.reserve(frames->size());
  for (std::size_t i = 0; i < frames->size(); ++i) {
    auto b = decode_event_batch((*frames)[i].payload, (*frames)[i].seq);
    if (!b) return b.status().with_context(path.string() + ": frame " + std::to_string(i));
    batches.push_back(std::move(*b));
  }
  return audit_kv_events(batches, path.string());
}

std::string KvEventAudit::summary() const {
  std::ostringstream o;
  o << "kv-events " << source << ": " << batches << " batches";
  if (batches > 0) o << " (seq " << first_seq << ".." << last_seq << ")";
  o << ", " << duplicates << " duplicates, " << events << " events; " << mirror.stored << " blocks stored, "
    << mirror.removed << " removed, " << mirror.clears << " clears\n";
  o << "  mirror at the end:";
  if (mirror.held_per_medium.empty()) o << " empty";
  for (const auto& [m, n] : mirror.held_per_medium) o << " " << m << "=" << n;
  o << "; per namespace:";
  for (const auto& [ns, n] : mirror.held_per_namespace) o << " [" << ns << "]=" << n;
  o << "\n";
  std::map<std::string, int64_t> by_reason;
  for (const auto& v : violations) ++by_reason[v.reason];
  constexpr std::size_t kShown = 20;
  for (std::size_t i = 0; i < violations.size() && i < kShown; ++i) {
    const auto& v = violations[i];
    o << "  VIOLATION " << v.reason << " at batch " << v.seq;
    if (!v.block_hash.empty()) o << ", block " << v.block_hash;
    o << ": " << v.detail << "\n";
  }
  if (violations.size() > kShown) o << "  ... " << violations.size() - kShown << " more (see --json)\n";
  o << (violations.empty() ? "PASS" : "FAIL") << ": " << violations.size() << " violations";
  for (const auto& [r, n] : by_reason) o << (r == by_reason.begin()->first ? " (" : ", ") << r << " " << n;
  o << (by_reason.empty() ? "" : ")") << "\n";
  return o.str();
}

nlohmann::json KvEventAudit::to_json() const {
  nlohmann::json v = nlohmann::json::array();
  for (const auto& x : violations)
    v.push_back({{"reason", x.reason}, {"seq", x.seq}, {"block_hash", x.block_hash}, {"detail", x.detail}});
  return {{"source", source},
          {"passed", passed()},
          {"frames", frames},
          {"batches", batches},
          {"duplicates", duplicates},
          {"events", events},
          {"first_seq", first_seq},
          {"last_seq", last_seq},
          {"violations", v},
          {"mirror",
           {{"stored", mirror.stored},
            {"removed", mirror.removed},
            {"clears", mirror.clears},
            {"held_per_medium", mirror.held_per_medium},
            {"held_per_namespace", mirror.held_per_namespace},
            {"never_removed", mirror.never_removed}}}};
}

verify::Summary KvEventAudit::to_summary(std::string reproducer) const {
  verify::Summary s;
  s.title = "kvproof audit --kv-events";
  s.passed = passed();
  s.reproducer = std::move(reproducer);
  s.verdict_detail = std::to_string(violations.size()) + " violations";
  std::istringstream head(summary());
  std::string line;
  for (int i = 0; i < 2 && std::getline(head, line); ++i) s.context.push_back(line);  // the stream, the mirror
  s.rows_title = "Checks";
  s.columns = {"violations"};
  for (const char* reason : {kSequenceGap, kRemovedNotStored, kStoredTwice, kTokenCount, kBlockSizeChanged,
                             kNamespaceCrossing, kNamespaceMerge, kStaleAfterClear}) {
    int64_t n = 0;
    std::string first;
    for (const Violation& v : violations) {
      if (v.reason != reason) continue;
      if (n++ == 0)
        first = "batch " + std::to_string(v.seq) + (v.block_hash.empty() ? "" : ", block " + v.block_hash) + ": " +
                v.detail;
    }
    s.rows.push_back({reason, n > 0 ? "FAIL" : "PASS", {std::to_string(n)}, first, ""});
  }
  constexpr std::size_t kShown = 20;
  for (std::size_t i = 0; i < violations.size() && i < kShown; ++i) {
    const Violation& v = violations[i];
    s.notes.push_back("VIOLATION " + v.reason + " at batch " + std::to_string(v.seq) +
                      (v.block_hash.empty() ? "" : ", block " + v.block_hash) + ": " + v.detail);
  }
  if (violations.size() > kShown)
    s.notes.push_back(std::to_string(violations.size() - kShown) + " more: see the JSON report");
  return s;
}

std::vector<verify::Plot> KvEventAudit::plots() const {
  verify::Plot by_checker("bar", "Violations per checker", "checker", "violations");
  verify::PlotSeries counts("violations");
  for (const char* reason : {kSequenceGap, kRemovedNotStored, kStoredTwice, kTokenCount, kBlockSizeChanged,
                             kNamespaceCrossing, kNamespaceMerge, kStaleAfterClear}) {
    by_checker.categories.push_back(reason);
    counts.y.push_back(static_cast<double>(
        std::count_if(violations.begin(), violations.end(), [&](const Violation& v) { return v.reason == reason; })));
  }
  by_checker.series.push_back(std::move(counts));
  by_checker.caption = "Every bar should be 0: each is one checker's violations over the whole stream.";
  std::vector<verify::Plot> plots{std::move(by_checker)};
  if (!mirror.held_per_namespace.empty()) {
    verify::Plot held("bar", "Blocks held at the end of the stream, per namespace", "namespace (adapter, cache salt)",
                      "blocks");
    verify::PlotSeries blocks("blocks held");
    for (const auto& [ns, n] : mirror.held_per_namespace) {
      held.categories.push_back(ns);
      blocks.y.push_back(static_cast<double>(n));
    }
    held.series.push_back(std::move(blocks));
    held.caption =
        "The mirror of the engine's cache rebuilt from the events alone: what each tenant (salt) or adapter holds. A "
        "namespace a deployment does not have is a hash that leaked across.";
    plots.push_back(std::move(held));
  }
  return plots;
}

}  // namespace kvp::kv_events
