#include "simulate/memory_accounting.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>

#include "common/text.h"
#include "simulate/simulate.h"

namespace kvp::sim {
namespace {

std::string terms(const MemorySlots& m) {
  return "token_states " + str(m.token_states) + " + reserved " + str(m.reserved) + " + internal " + str(m.internal) +
         " + external " + str(m.external);
}

Status compare(const MemorySlots& reported, const MemorySlots& counted, const std::string& counted_from) {
  const struct {
    const char* name;
    int64_t MemorySlots::*term;
  } all[] = {{"token_states", &MemorySlots::token_states},
             {"reserved", &MemorySlots::reserved},
             {"internal", &MemorySlots::internal},
             {"external", &MemorySlots::external}};
  for (const auto& t : all) {
    if (reported.*t.term != counted.*t.term)
      return Status::error(std::string(t.name) + ": the simulator reports " + str(reported.*t.term) + " slots, " +
                           counted_from + " " + str(counted.*t.term) + " (reported " + terms(reported) + "; counted " +
                           terms(counted) + ")");
  }
  return Status::ok();
}

// Per slot of the device pool, what a recount found in it.
enum SlotUse : uint8_t { kNotNamed, kNamed, kTokenState, kReserved };

Status check_paged(const MemoryAccountingState& st, const MemorySlots& reported) {
  const KvCacheManager& kv = *st.kv;
  const BlockAllocator& device = kv.device_allocator();
  const int64_t bs = kv.block_size();
  std::unordered_map<SeqId, int64_t> final_len;
  for (const HeldRequest& r : st.requests) final_len[r.seq] = r.final_len;

  std::vector<uint8_t> use(static_cast<size_t>(device.num_blocks()) * static_cast<size_t>(bs), kNotNamed);
  const auto slot = [&](const GroupTable& g, int64_t p) {
    return static_cast<size_t>(g.table[p / bs]) * static_cast<size_t>(bs) + static_cast<size_t>(p % bs);
  };
  // KV-cache groups: every group's table is counted alike (its slots are a group block's).
  int64_t named_blocks = 0;
  for (const auto& [id, s] : kv.sequences()) {
    if (s.swapped) continue;  // its tables name host blocks
    if (final_len.count(id) == 0)
      return Status::error("sequence " + str(id) + " holds device blocks but the simulator has no final length for it");
    for (std::size_t gi = 0; gi < s.groups.size(); ++gi) {
      const GroupTable& g = s.groups[gi];
      const std::string table = s.groups.size() > 1 ? "group " + str(static_cast<int64_t>(gi)) + "'s table" : "table";
      if (g.table.size() * bs < s.num_slots)
        return Status::error("sequence " + str(id) + " has " + str(s.num_slots) + " slots in a " + table + " of " +
                             str(g.table.size()) + " blocks of " + str(bs));
      for (int64_t j = 0; j < g.table.size(); ++j) {
        const int32_t b = g.table[j];
        if (b == kNoBlock && j < g.num_window_released) continue;  // released behind the window
        if (b < 0 || b >= device.num_blocks() || device.state(b) != BlockState::kInUse)
          return Status::error("sequence " + str(id) + "'s " + table + " names device block " + str(b) +
                               ", which is not in use");
        uint8_t* first = &use[static_cast<size_t>(b) * static_cast<size_t>(bs)];
        if (*first != kNotNamed) continue;
        std::fill(first, first + bs, kNamed);
        ++named_blocks;
      }
      for (int64_t p = g.num_window_released * bs; p < s.num_slots; ++p) use[slot(g, p)] = kTokenState;
    }
  }
  // Reserved after every token state is marked: a slot one holder will fill and another
  // has filled holds a token.
  for (const auto& [id, s] : kv.sequences()) {
    if (s.swapped) continue;
    for (const GroupTable& g : s.groups) {
      const int64_t end = std::min(final_len.at(id), g.table.size() * bs);
      for (int64_t p = std::max(s.num_slots, g.num_window_released * bs); p < end; ++p) {
        uint8_t& u = use[slot(g, p)];
        if (u == kNamed) u = kReserved;
      }
    }
  }
  MemorySlots counted;
  for (uint8_t u : use) {
    counted.token_states += u == kTokenState;
    counted.reserved += u == kReserved;
    counted.internal += u == kNamed;
  }

  int64_t in_use = 0;
  for (int32_t b = 0; b < device.num_blocks(); ++b) in_use += device.state(b) == BlockState::kInUse;
  if (in_use != named_blocks)
    return Status::error(str(in_use) + " device blocks are in use but device-resident tables name " +
                         str(named_blocks) + " distinct blocks");
  if (reported.total() != in_use * bs)
    return Status::error("the shares split " + str(reported.total()) + " slots (" + terms(reported) +
                         ") but the device pool holds " + str(in_use * bs) + " slots in use (" + str(in_use) +
                         " blocks of " + str(bs) + "), so they do not sum to 1");
  return compare(reported, counted, "the KV manager's blocks hold");
}

Status check_contiguous(const MemoryAccountingState& st, const MemorySlots& reported) {
  MemorySlots counted;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // offset, length
  for (const HeldRequest& r : st.requests) {
    if (r.res_offset < 0 || r.res_len <= 0 || r.res_offset + r.res_len > st.capacity)
      return Status::error("request " + str(r.seq) + " holds reservation [" + str(r.res_offset) + ", +" +
                           str(r.res_len) + ") outside the memory of " + str(st.capacity) + " slots");
    const SequenceState* s = st.kv->sequence(r.seq);
    const int64_t slots = s != nullptr ? s->num_slots : 0;
    const int64_t fillable = std::min(r.res_len, r.final_len);
    if (slots > fillable)
      return Status::error("request " + str(r.seq) + " has " + str(slots) + " token states, more than the " +
                           str(fillable) + " slots of its reservation it may fill");
    counted.token_states += slots;
    counted.reserved += fillable - slots;
    counted.internal += r.res_len - fillable;
    ranges.emplace_back(r.res_offset, r.res_len);
  }
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0, free_slots = 0;
  const auto gap = [&](int64_t end) {
    const int64_t len = end - at;
    free_slots += len;
    if (len > 0 && len < st.head_reservation) counted.external += len;
  };
  for (const auto& [off, len] : ranges) {
    if (off < at)
      return Status::error("reservations overlap at slot " + str(off) + " (the previous one ends at " + str(at) + ")");
    gap(off);
    at = off + len;
  }
  gap(st.capacity);
  if (free_slots != st.free_slots)
    return Status::error("the reservations leave " + str(free_slots) + " slots free but the allocator has " +
                         str(st.free_slots));
  if (reported.total() != counted.total())
    return Status::error("the shares split " + str(reported.total()) + " slots (" + terms(reported) +
                         ") but the reservations hold " + str(counted.held()) + " and the queue's head cannot use " +
                         str(counted.external) + " free, so they do not sum to 1");
  return compare(reported, counted, "the reservations and the KV manager's slots give");
}

}  // namespace

Status check_memory_accounting(const MemoryAccountingState& state, const MemorySlots& reported) {
  return state.contiguous ? check_contiguous(state, reported) : check_paged(state, reported);
}

Status check_memory_shares(const SimReport& r) {
  MemorySlots sum;
  const auto cap = static_cast<double>(r.kv_capacity_slots);
  for (std::size_t i = 0; i < r.timeline.size(); ++i) {
    const TimelinePoint& p = r.timeline[i];
    const MemorySlots& m = p.memory;
    if (m.token_states < 0 || m.reserved < 0 || m.internal < 0 || m.external < 0)
      return Status::error("sample " + str(static_cast<int64_t>(i)) + " at t=" + std::to_string(p.t_s) +
                           " s has a negative term (" + terms(m) + ")");
    if (p.kv_in_use != static_cast<double>(m.held()) / cap || p.kv_tokens != static_cast<double>(m.token_states) / cap)
      return Status::error("sample " + str(static_cast<int64_t>(i)) + " at t=" + std::to_string(p.t_s) +
                           " s: kv_in_use " + std::to_string(p.kv_in_use) + " and kv_tokens " +
                           std::to_string(p.kv_tokens) + " are not its held " + str(m.held()) + " and token " +
                           str(m.token_states) + " slots over the capacity " + str(r.kv_capacity_slots));
    sum += m;
  }
  if (sum != r.memory_slots)
    return Status::error("the run's memory totals (" + terms(r.memory_slots) + ") are not the sums of its " +
                         str(static_cast<int64_t>(r.timeline.size())) + " samples (" + terms(sum) + ")");
  const MemoryShares& s = r.memory;
  if (sum.total() == 0) {
    if (s.token_states != 0 || s.reserved != 0 || s.internal != 0 || s.external != 0)
      return Status::error("no memory was sampled but the shares are not all 0");
    return Status::ok();
  }
  const auto total = static_cast<double>(sum.total());
  const auto off = [&](double share, int64_t slots) { return share != static_cast<double>(slots) / total; };
  if (off(s.token_states, sum.token_states) || off(s.reserved, sum.reserved) || off(s.internal, sum.internal) ||
      off(s.external, sum.external))
    return Status::error("the run's shares are not its totals (" + terms(sum) + ") over their sum");
  // Each share is one correctly rounded division (within half an ulp of its exact value,
  // at most 2^-53 here) and the exact values sum to 1; the three additions round too. Four
  // shares and three sums stay within 8 units of 2^-53, below 4 epsilon.
  const double one = s.token_states + s.reserved + s.internal + s.external;
  if (std::abs(one - 1.0) > 4 * std::numeric_limits<double>::epsilon())
    return Status::error("the run's shares sum to " + std::to_string(one) + ", not 1");
  return Status::ok();
}

}  // namespace kvp::sim
