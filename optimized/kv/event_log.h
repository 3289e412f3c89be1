// EventLog: the audit trail of KvCacheManager, one JSON object per line, one line per state
// change. The format (below) is what event_log_replay.h checks, independently of the
// allocator's code. Every line has "ev"; "seq" is a sequence id, "block" a block id; "pool" is
// "device" or "host" where it matters.
//
//   {"ev":"init","device_blocks":N,"host_blocks":M,"block_size":B,"global_prefix":bool[,"window":W]
//    [,"groups":[W0,W1,...]]}                        window: every layer's sliding window, when set;
//                                                    groups: KV-cache groups' windows (0: full), when
//                                                    more than one. Then alloc, share, cow, release
//                                                    and window_release carry "group":g (vLLM's
//                                                    group_idx; absent: 0), naming the table they
//                                                    change, and a swap's pairs list the live entries
//                                                    group by group
//   {"ev":"add","seq":S,"tenant":T}                  a sequence appears, empty table
//   {"ev":"fork","parent":P,"child":C}               C appears with P's tenant, empty table
//   {"ev":"alloc","seq":S,"block":b}                 a free device block appended to S's table
//   {"ev":"share","seq":S,"block":b,"reason":"prefix_hit"|"fork"}
//                                                    an existing device block appended (refcount+1);
//                                                    b = -1 (prefix_hit, a windowed group): an entry
//                                                    before the window, appended released
//   {"ev":"cow","seq":S,"index":i,"src":a,"dst":b}   free block b replaces a at index i; a released
//   {"ev":"release","seq":S,"block":b}               S's last table entry (b) dropped, refcount-1;
//                                                    b = -1: an entry the window already released
//   {"ev":"window_release","seq":S,"index":i,"block":b}
//                                                    the window left S's entry i (b) behind: b is
//                                                    released and the entry becomes -1
//   {"ev":"slots","seq":S,"len":L}                   S now has L positions with slots
//   {"ev":"cache","block":b}                         b's content named in the prefix cache
//   {"ev":"evict","block":b}                         b's cache entry dropped
//   {"ev":"swap_out","seq":S,"pairs":[[d,h],...]}    table moves to host blocks, in order
//   {"ev":"swap_in","seq":S,"pairs":[[h,d],...]}     table moves back to device blocks
//   {"ev":"poison","block":b}                        a freed device block is poisoned
//   {"ev":"free","seq":S}                            S (already with an empty table) ends
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "optimized/kv/kv_event.h"

namespace kvp {

// The JSON line of one event (the format above).
std::string to_json_line(const KvEvent& event);

class EventLog {
 public:
  // Keeps the events in memory; their JSON lines are made when first asked for.
  EventLog() = default;
  // Also writes each event's line (with '\n') to `out` as it happens; `out` must outlive the
  // log.
  explicit EventLog(std::ostream* out) : out_(out) {}

  void record(const KvEvent& event) {
    events_.push_back(event);
    if (out_ != nullptr) *out_ << to_json_line(event) << '\n';
    if (listener_) listener_(event);
  }
  // Also calls `listener` with each later event, right after the state change it records
  // (the manager's state is the new one); empty: none. The KV-event publisher uses it.
  void set_listener(std::function<void(const KvEvent&)> listener) { listener_ = std::move(listener); }
  const std::vector<KvEvent>& events() const { return events_; }
  // One JSON line per event, in order.
  const std::vector<std::string>& lines() const {
    while (lines_.size() < events_.size()) lines_.push_back(to_json_line(events_[lines_.size()]));
    return lines_;
  }
  std::string text() const {
    std::string s;
    for (const auto& l : lines()) s += l + "\n";
    return s;
  }

 private:
  std::ostream* out_ = nullptr;
  std::function<void(const KvEvent&)> listener_;
  std::vector<KvEvent> events_;
  mutable std::vector<std::string> lines_;
};

}  // namespace kvp
