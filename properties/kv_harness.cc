#include "properties/kv_harness.h"

#include <algorithm>

#include "common/text.h"
#include "kernels/kv_index.h"
#include "optimized/checkers/invariants.h"

namespace kvp::testing {
KvHarness::KvHarness(const KvCacheConfig& config, CheckScope scope)
    : config_(config),
      m_(config),
      device_pool_(static_cast<size_t>(config.pool.num_device_blocks) * config.pool.block_size),
      host_pool_(static_cast<size_t>(config.pool.num_host_blocks) * config.pool.block_size),
      scope_(scope) {}

KvHarness::Snapshot KvHarness::snapshot() const {
  Snapshot s;
  s.free_list = m_.device_allocator().free_list();
  s.evictable_list = m_.device_allocator().evictable_list();
  s.host_free_list = m_.host_allocator().free_list();
  for (int32_t b = 0; b < m_.device_allocator().num_blocks(); ++b) {
    s.refcounts.push_back(m_.device_allocator().refcount(b));
  }
  for (int32_t b = 0; b < m_.host_allocator().num_blocks(); ++b) {
    s.refcounts.push_back(m_.host_allocator().refcount(b));
  }
  for (const auto& [id, seq] : m_.sequences()) {
    for (const GroupTable& gt : seq.groups) s.tables[id].push_back(gt.table.blocks());
    s.slots[id] = seq.num_slots;
    s.tokens[id] = seq.tokens;
  }
  s.version = m_.version();
  s.cache_size = m_.prefix_cache().size();
  const KvPlanOps& ops = m_.pending_plan_ops();
  s.ops = ops.swap_out.size() + ops.block_copies.size() + ops.poison.size() + ops.swap_in.size();
  return s;
}

// Prompts share prefixes often: one of three base prompts, cut, plus a short random tail.
std::vector<int32_t> KvHarness::make_prompt(int a, int b, int c) const {
  const int base = a % 3;
  const int cut = b % 13;
  std::vector<int32_t> p;
  for (int i = 0; i < cut; ++i) p.push_back(base * 100 + i);
  const int tail = c % 4;
  for (int i = 0; i < tail; ++i) p.push_back(1000 + (c >> (2 + i)) % 3);
  if (p.empty()) p.push_back(7);
  return p;
}

SeqId KvHarness::pick(int a) const {
  if (model_.empty()) return -1;
  auto it = model_.begin();
  std::advance(it, static_cast<long>(static_cast<size_t>(a) % model_.size()));
  return it->first;
}

void KvHarness::apply_plan_ops() {
  const KvPlanOps ops = m_.take_plan_ops();
  const int64_t bs = config_.pool.block_size;
  auto copy = [&](std::vector<Cell>& from, int32_t src, std::vector<Cell>& to, int32_t dst) {
    for (int64_t o = 0; o < bs; ++o) {
      to[static_cast<size_t>(dst * bs + o)] = from[static_cast<size_t>(src * bs + o)];
    }
  };
  for (const BlockCopy& c : ops.swap_out) copy(device_pool_, c.src, host_pool_, c.dst);
  for (const BlockCopy& c : ops.block_copies) copy(device_pool_, c.src, device_pool_, c.dst);
  for (int32_t b : ops.poison) {
    for (int64_t o = 0; o < bs; ++o) device_pool_[static_cast<size_t>(b * bs + o)] = Cell{-2, 0, 0};
  }
  for (const BlockCopy& c : ops.swap_in) copy(host_pool_, c.src, device_pool_, c.dst);
}

Status KvHarness::allocate(SeqId s, int64_t n, std::span<const int32_t> lookahead) {
  const PrefixHit hit = m_.find_prefix(s);
  KVP_RETURN_IF_ERROR(check_prefix_hit(m_, hit));  // I13, before it is acted on
  const int64_t skip = hit.num_tokens;
  const auto k = static_cast<int64_t>(lookahead.size());
  const AllocStatus predicted = m_.can_allocate(s, n, hit, k);
  // The whole state is recorded only when the allocation is predicted to fail (then it must
  // change nothing); a wrong prediction is an error either way.
  std::optional<Snapshot> before;
  if (predicted != AllocStatus::kOk) before = snapshot();
  // One slot mapping per KV-cache group: each group's table is written as its layers would.
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(config_.num_groups()));
  const AllocStatus st = m_.allocate_slots(s, n, hit, std::span<std::vector<int64_t>>(slots), lookahead);
  if (st != predicted) {
    return Status::error("can_allocate said " + std::string(to_string(predicted)) + " but allocate_slots returned " +
                         to_string(st));
  }
  if (st != AllocStatus::kOk) {
    if (!before || !(snapshot() == *before) ||
        std::any_of(slots.begin(), slots.end(), [](const std::vector<int64_t>& g) { return !g.empty(); })) {
      return Status::error("failed allocate_slots(seq " + str(s) + ", " + str(n) + ", " + str(k) +
                           " lookahead) changed the state");
    }
    return Status::ok();
  }
  ModelSeq& ms = model_.at(s);
  const int64_t start = ms.num_slots + skip;
  if (skip % config_.pool.block_size != 0 || (skip > 0 && ms.num_slots != 0) ||
      (skip > 0 && skip > static_cast<int64_t>(ms.tokens.size()) - 1)) {
    return Status::error("seq " + str(s) + ": bad cached prefix " + str(skip));
  }
  ms.tokens.insert(ms.tokens.end(), lookahead.begin(), lookahead.end());
  for (int64_t g = 0; g < config_.num_groups(); ++g) {
    const std::vector<int64_t>& group_slots = slots[static_cast<size_t>(g)];
    KVP_RETURN_IF_ERROR(check_slot_mapping(m_, s, start, group_slots, g));
    KVP_RETURN_IF_ERROR(check_exclusive_write(m_, s, group_slots, g));
  }
  ms.num_slots = start + n + k;
  apply_plan_ops();  // copies before the writes, as a backend would
  for (const std::vector<int64_t>& group_slots : slots) {
    for (int64_t i = 0; i < n + k; ++i) {
      const int64_t p = start + i;
      device_pool_[static_cast<size_t>(group_slots[static_cast<size_t>(i)])] =
          Cell{scope_of(ms), p, ms.tokens[static_cast<size_t>(p)]};
    }
  }
  return Status::ok();
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kPrefill: return "prefill";
    case OpKind::kPrefillChunk: return "prefill-chunk";
    case OpKind::kAppend: return "append";
    case OpKind::kFork: return "fork";
    case OpKind::kTruncate: return "truncate";
    case OpKind::kFree: return "free";
    case OpKind::kSwapOut: return "swap-out";
    case OpKind::kSwapIn: return "swap-in";
    case OpKind::kEvict: return "evict";
    case OpKind::kFlush: return "flush";
    case OpKind::kSpeculate: return "speculate";
    case OpKind::kCount: break;
  }
  return "unknown";
}

Op Op::drawn(int kind, int a, int b, int c) {
  const int n = static_cast<int>(OpKind::kCount);
  return Op{static_cast<OpKind>(((kind % n) + n) % n), a, b, c};
}

Status KvHarness::apply(const Op& op) {
  ++commands_;
  touched_.clear();
  const int a = op.a < 0 ? -op.a : op.a, b = op.b < 0 ? -op.b : op.b, c = op.c < 0 ? -op.c : op.c;
  switch (op.kind) {
    case OpKind::kPrefill: KVP_RETURN_IF_ERROR(add_and_prefill(a, b, c, /*chunked=*/false)); break;
    case OpKind::kPrefillChunk: KVP_RETURN_IF_ERROR(add_and_prefill(a, b, c, /*chunked=*/true)); break;
    case OpKind::kAppend: KVP_RETURN_IF_ERROR(append(a, b, c)); break;
    case OpKind::kFork: KVP_RETURN_IF_ERROR(fork(a)); break;
    case OpKind::kTruncate: KVP_RETURN_IF_ERROR(truncate(a, b)); break;
    case OpKind::kFree: KVP_RETURN_IF_ERROR(free_sequence(a)); break;
    case OpKind::kSwapOut: KVP_RETURN_IF_ERROR(swap_out(a)); break;
    case OpKind::kSwapIn: KVP_RETURN_IF_ERROR(swap_in(a)); break;
    case OpKind::kEvict: m_.evict_cached(1 + a % 4); break;
    case OpKind::kFlush:
      if (b % 4 == 0) m_.flush_prefix_cache();
      break;
    case OpKind::kSpeculate: KVP_RETURN_IF_ERROR(speculate(a, b, c)); break;
    case OpKind::kCount: return Status::error("OpKind::kCount is not a command (use Op::drawn)");
  }
  apply_plan_ops();
  Status st = Status::ok();
  if (scope_ == CheckScope::kEverything || commands_ % kFullCheckEvery == 0) {
    st = check();
  } else {
    for (SeqId s : touched_) {
      if (model_.count(s) == 0) continue;  // freed by the command
      st = check_sequence(s);
      if (!st.is_ok()) break;
    }
  }
  return st.with_context("after command " + str(commands_) + " (" + op_kind_name(op.kind) + ")");
}

// Adds a sequence and prefills its prompt past the cached prefix: all of it, or (chunked)
// none, half or all of it.
Status KvHarness::add_and_prefill(int a, int b, int c, bool chunked) {
  const SeqId s = next_id_++;
  const std::vector<int32_t> prompt = make_prompt(a, b, c);
  const int64_t tenant = (a / 3) % 2;
  KVP_RETURN_IF_ERROR(m_.add_sequence(s, tenant, prompt));
  model_[s] = ModelSeq{tenant, prompt, 0, false};
  touch(s);
  const int64_t skip = m_.cached_prefix_tokens(s);
  int64_t n = static_cast<int64_t>(prompt.size()) - skip;
  if (chunked) n = n * (c % 3) / 2;
  KVP_RETURN_IF_ERROR(allocate(s, n));
  return m_.mark_final(s, m_.sequence(s)->num_slots);
}

// Appends 1 to 3 tokens (a decode step, or a speculative one), final or not.
Status KvHarness::append(int a, int b, int c) {
  const SeqId s = pick(a);
  if (s < 0) return Status::ok();
  touch(s);
  ModelSeq& ms = model_.at(s);
  const int k = 1 + b % 3;
  std::vector<int32_t> t;
  for (int i = 0; i < k; ++i) t.push_back(2000 + (c + i) % 4);
  KVP_RETURN_IF_ERROR(m_.append_tokens(s, t));
  ms.tokens.insert(ms.tokens.end(), t.begin(), t.end());
  if (ms.swapped) return Status::ok();
  const int64_t n = static_cast<int64_t>(ms.tokens.size()) - ms.num_slots;
  KVP_RETURN_IF_ERROR(allocate(s, n));
  if (c % 2 == 0) KVP_RETURN_IF_ERROR(m_.mark_final(s, m_.sequence(s)->num_slots));
  return Status::ok();
}

// Forks a sequence; a swapped one must refuse.
Status KvHarness::fork(int a) {
  const SeqId s = pick(a);
  if (s < 0) return Status::ok();
  touch(s);
  const SeqId child = next_id_++;
  const Status st = m_.fork(s, child);
  if (model_.at(s).swapped) {
    if (st.is_ok()) return Status::error("fork of a swapped sequence succeeded");
    return Status::ok();
  }
  KVP_RETURN_IF_ERROR(st);
  model_[child] = model_.at(s);
  touch(child);
  return Status::ok();
}

Status KvHarness::truncate(int a, int b) {
  const SeqId s = pick(a);
  if (s < 0) return Status::ok();
  touch(s);
  ModelSeq& ms = model_.at(s);
  const auto len = static_cast<int64_t>(ms.tokens.size());
  const int64_t new_len = len - (b % (len + 1));
  const SequenceState* st = m_.sequence(s);
  bool into_window = false;
  for (int64_t g = 0; g < st->num_groups(); ++g) {
    into_window |= m_.window_dead_blocks(std::min(st->num_final, new_len), g) < st->group(g).num_window_released;
  }
  if (into_window) {
    // The positions the window released cannot come back: refused, nothing changed.
    const Snapshot before = snapshot();
    if (m_.truncate(s, new_len).is_ok()) return Status::error("a truncate into the released window succeeded");
    if (!(snapshot() == before)) return Status::error("a refused truncate changed the state");
    return Status::ok();
  }
  KVP_RETURN_IF_ERROR(m_.truncate(s, new_len));
  ms.tokens.resize(static_cast<size_t>(new_len));
  ms.num_slots = std::min(ms.num_slots, new_len);
  return Status::ok();
}

Status KvHarness::free_sequence(int a) {
  const SeqId s = pick(a);
  if (s < 0) return Status::ok();
  touch(s);
  KVP_RETURN_IF_ERROR(m_.free(s));
  model_.erase(s);
  return Status::ok();
}

// A failed swap-out must leave the whole state as it was.
Status KvHarness::swap_out(int a) {
  const SeqId s = pick(a);
  if (s < 0) return Status::ok();
  touch(s);
  const Snapshot before = snapshot();
  const Status st = m_.swap_out(s);
  if (!st.is_ok()) {
    if (!(snapshot() == before)) return Status::error("failed swap_out changed the state");
    return Status::ok();
  }
  model_.at(s).swapped = true;
  return Status::ok();
}

// swap_in succeeds exactly when can_swap_in said so, and a failure changes nothing.
Status KvHarness::swap_in(int a) {
  const SeqId s = pick(a);
  if (s < 0) return Status::ok();
  touch(s);
  const bool can = m_.can_swap_in(s);
  std::optional<Snapshot> before;
  if (!can) before = snapshot();
  const Status st = m_.swap_in(s);
  if (st.is_ok() != can) return Status::error("can_swap_in disagrees with swap_in");
  if (!st.is_ok()) {
    if (!(snapshot() == *before)) return Status::error("failed swap_in changed the state");
    return Status::ok();
  }
  model_.at(s).swapped = false;
  return Status::ok();
}

// A speculative step: k drafts appended and given slots, never final; then all but the
// accepted ones rolled back and the accepted ones marked final.
Status KvHarness::speculate(int a, int b, int c) {
  const SeqId s = pick(a);
  if (s < 0) return Status::ok();
  touch(s);
  ModelSeq& ms = model_.at(s);
  if (ms.swapped || ms.num_slots == 0) return Status::ok();  // speculation starts once a sequence decodes
  const auto accepted_len = static_cast<int64_t>(ms.tokens.size());
  const int64_t final_before = m_.sequence(s)->num_final;
  const int k = 1 + b % 4;
  std::vector<int32_t> drafts;
  for (int i = 0; i < k; ++i) drafts.push_back(3000 + (c + i) % 5);
  // As the scheduler does: the drafts go in as lookahead, with their slots, or not at all.
  const int64_t slots_before = ms.num_slots;
  KVP_RETURN_IF_ERROR(allocate(s, static_cast<int64_t>(ms.tokens.size()) - ms.num_slots, drafts));
  const bool verified = ms.num_slots != slots_before;
  // Drafts are never final: nothing new may have entered the prefix cache yet.
  if (m_.sequence(s)->num_final != final_before) return Status::error("a speculative append changed num_final");
  const int64_t keep = accepted_len + (verified ? (c >> 3) % (k + 1) : 0);
  KVP_RETURN_IF_ERROR(m_.truncate(s, keep));
  ms.tokens.resize(static_cast<size_t>(keep));
  ms.num_slots = std::min(ms.num_slots, keep);
  if (m_.sequence(s)->num_final != final_before) return Status::error("a rollback of drafts changed num_final");
  return m_.mark_final(s, ms.num_slots);
}

Status KvHarness::check() {
  KVP_RETURN_IF_ERROR(check_all(m_, &hash_memo_));
  if (m_.num_sequences() != static_cast<int64_t>(model_.size())) {
    return Status::error("manager has " + str(m_.num_sequences()) + " sequences, model " +
                         str(static_cast<int64_t>(model_.size())));
  }
  for (const auto& entry : model_) KVP_RETURN_IF_ERROR(check_sequence(entry.first));
  return Status::ok();
}

Status KvHarness::check_sequence(SeqId id) {
  const ModelSeq& ms = model_.at(id);
  const int64_t bs = config_.pool.block_size;
  const SequenceState* s = m_.sequence(id);
  if (s == nullptr) return Status::error("sequence " + str(id) + " is missing");
  if (s->tokens != ms.tokens || s->num_slots != ms.num_slots || s->swapped != ms.swapped) {
    return Status::error("sequence " + str(id) + " differs from the model (slots " + str(s->num_slots) + " vs " +
                         str(ms.num_slots) + ")");
  }
  const std::vector<Cell>& pool = ms.swapped ? host_pool_ : device_pool_;
  // Through every group's table, every position from the first block its window kept (all
  // of them without one).
  for (int64_t g = 0; g < s->num_groups(); ++g) {
    const GroupTable& gt = s->group(g);
    for (int64_t p = gt.num_window_released * bs; p < ms.num_slots; ++p) {
      const int64_t slot = kernels::slot_of(gt.table.data(), p, bs);
      const Cell want{scope_of(ms), p, ms.tokens[static_cast<size_t>(p)]};
      const Cell& got = pool[static_cast<size_t>(slot)];
      if (!(got == want)) {
        return Status::error("sequence " + str(id) + (s->num_groups() > 1 ? " group " + str(g) : std::string()) +
                             " position " + str(p) + " reads slot " + str(slot) + (ms.swapped ? " (host)" : "") +
                             " holding tenant " + str(got.tenant) + " position " + str(got.position) + " token " +
                             str(got.token) + ", expected token " + str(want.token));
      }
    }
  }
  return Status::ok();
}

Status KvHarness::drain() {
  KVP_RETURN_IF_ERROR(check().with_context("before the drain"));
  while (!model_.empty()) {
    const SeqId s = model_.begin()->first;
    KVP_RETURN_IF_ERROR(m_.free(s));
    model_.erase(s);
    if (scope_ == CheckScope::kEverything) KVP_RETURN_IF_ERROR(check_all(m_));
  }
  m_.flush_prefix_cache();
  apply_plan_ops();
  return check_all_free(m_);
}

}  // namespace kvp::testing
