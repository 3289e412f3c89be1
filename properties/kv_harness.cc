#include "properties/kv_harness.h"

#include "kernels/kv_index.h"
#include "optimized/checkers/invariants.h"

namespace kvp::testing {
namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

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
    s.tables[id] = seq.table.blocks();
    s.slots[id] = seq.num_slots;
  }
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

Status KvHarness::allocate(SeqId s, int64_t n) {
  const int64_t skip = m_.cached_prefix_tokens(s);
  const AllocStatus predicted = m_.can_allocate(s, n);
  // The whole state is recorded only when the allocation is predicted to fail (then it must
  // change nothing); a wrong prediction is an error either way.
  std::optional<Snapshot> before;
  if (predicted != AllocStatus::kOk) before = snapshot();
  std::vector<int64_t> slots;
  const Status st = m_.allocate_slots(s, n, slots);
  if (st.is_ok() != (predicted == AllocStatus::kOk)) {
    return Status::error("can_allocate said " + std::string(to_string(predicted)) + " but allocate_slots " +
                         (st.is_ok() ? "succeeded" : "failed"));
  }
  if (!st.is_ok()) {
    if (!before || !(snapshot() == *before) || !slots.empty()) {
      return Status::error("failed allocate_slots(seq " + str(s) + ", " + str(n) + ") changed the state");
    }
    return Status::ok();
  }
  ModelSeq& ms = model_.at(s);
  const int64_t start = ms.num_slots + skip;
  if (skip % config_.pool.block_size != 0 || (skip > 0 && ms.num_slots != 0) ||
      (skip > 0 && skip > static_cast<int64_t>(ms.tokens.size()) - 1)) {
    return Status::error("seq " + str(s) + ": bad cached prefix " + str(skip));
  }
  KVP_RETURN_IF_ERROR(check_slot_mapping(m_, s, start, slots));
  KVP_RETURN_IF_ERROR(check_exclusive_write(m_, s, slots));
  ms.num_slots = start + n;
  apply_plan_ops();  // copies before the writes, as a backend would
  for (int64_t k = 0; k < n; ++k) {
    const int64_t p = start + k;
    device_pool_[static_cast<size_t>(slots[static_cast<size_t>(k)])] =
        Cell{scope_of(ms), p, ms.tokens[static_cast<size_t>(p)]};
  }
  return Status::ok();
}

Status KvHarness::apply(const Op& op) {
  ++commands_;
  touched_.clear();
  const int kind = ((op.kind % kNumKinds) + kNumKinds) % kNumKinds;
  const int a = op.a < 0 ? -op.a : op.a, b = op.b < 0 ? -op.b : op.b, c = op.c < 0 ? -op.c : op.c;
  switch (kind) {
    case 0:
    case 1: {  // add a sequence and prefill (all or part of) its prompt
      const SeqId s = next_id_++;
      const std::vector<int32_t> prompt = make_prompt(a, b, c);
      const int64_t tenant = (a / 3) % 2;
      KVP_RETURN_IF_ERROR(m_.add_sequence(s, tenant, prompt));
      model_[s] = ModelSeq{tenant, prompt, 0, false};
      touch(s);
      const int64_t skip = m_.cached_prefix_tokens(s);
      int64_t n = static_cast<int64_t>(prompt.size()) - skip;
      if (kind == 1) n = n * (c % 3) / 2;  // chunked prefill: none, half or all
      KVP_RETURN_IF_ERROR(allocate(s, n));
      const SequenceState* st = m_.sequence(s);
      KVP_RETURN_IF_ERROR(m_.mark_final(s, st->num_slots));
      break;
    }
    case 2: {  // append k tokens (decode or speculative), final or not
      const SeqId s = pick(a);
      if (s < 0) break;
      touch(s);
      ModelSeq& ms = model_.at(s);
      const int k = 1 + b % 3;
      std::vector<int32_t> t;
      for (int i = 0; i < k; ++i) t.push_back(2000 + (c + i) % 4);
      KVP_RETURN_IF_ERROR(m_.append_tokens(s, t));
      ms.tokens.insert(ms.tokens.end(), t.begin(), t.end());
      if (ms.swapped) break;
      const int64_t n = static_cast<int64_t>(ms.tokens.size()) - ms.num_slots;
      KVP_RETURN_IF_ERROR(allocate(s, n));
      const SequenceState* st = m_.sequence(s);
      if (c % 2 == 0) KVP_RETURN_IF_ERROR(m_.mark_final(s, st->num_slots));
      break;
    }
    case 3: {  // fork
      const SeqId s = pick(a);
      if (s < 0) break;
      touch(s);
      const SeqId child = next_id_++;
      const Status st = m_.fork(s, child);
      if (model_.at(s).swapped) {
        if (st.is_ok()) return Status::error("fork of a swapped sequence succeeded");
        break;
      }
      KVP_RETURN_IF_ERROR(st);
      model_[child] = model_.at(s);
      touch(child);
      break;
    }
    case 4: {  // truncate
      const SeqId s = pick(a);
      if (s < 0) break;
      touch(s);
      ModelSeq& ms = model_.at(s);
      const auto len = static_cast<int64_t>(ms.tokens.size());
      const int64_t new_len = len - (b % (len + 1));
      KVP_RETURN_IF_ERROR(m_.truncate(s, new_len));
      ms.tokens.resize(static_cast<size_t>(new_len));
      ms.num_slots = std::min(ms.num_slots, new_len);
      break;
    }
    case 5: {  // free
      const SeqId s = pick(a);
      if (s < 0) break;
      touch(s);
      KVP_RETURN_IF_ERROR(m_.free(s));
      model_.erase(s);
      break;
    }
    case 6: {  // swap out
      const SeqId s = pick(a);
      if (s < 0) break;
      touch(s);
      const Snapshot before = snapshot();
      const Status st = m_.swap_out(s);
      if (!st.is_ok()) {
        if (!(snapshot() == before)) return Status::error("failed swap_out changed the state");
        break;
      }
      model_.at(s).swapped = true;
      break;
    }
    case 7: {  // swap in
      const SeqId s = pick(a);
      if (s < 0) break;
      touch(s);
      const bool can = m_.can_swap_in(s);
      std::optional<Snapshot> before;
      if (!can) before = snapshot();
      const Status st = m_.swap_in(s);
      if (st.is_ok() != can) return Status::error("can_swap_in disagrees with swap_in");
      if (!st.is_ok()) {
        if (!(snapshot() == *before)) return Status::error("failed swap_in changed the state");
        break;
      }
      model_.at(s).swapped = false;
      break;
    }
    case 8:  // evict
      m_.evict_cached(1 + a % 4);
      break;
    case 9:  // flush
      if (b % 4 == 0) m_.flush_prefix_cache();
      break;
    case 10: {  // speculative append of k drafts, verification, rollback of the rejected ones
      const SeqId s = pick(a);
      if (s < 0) break;
      touch(s);
      ModelSeq& ms = model_.at(s);
      if (ms.swapped || ms.num_slots == 0) break;  // speculation starts once a sequence decodes
      const auto accepted_len = static_cast<int64_t>(ms.tokens.size());
      const int64_t final_before = m_.sequence(s)->num_final;
      const int k = 1 + b % 4;
      std::vector<int32_t> drafts;
      for (int i = 0; i < k; ++i) drafts.push_back(3000 + (c + i) % 5);
      KVP_RETURN_IF_ERROR(m_.append_tokens(s, drafts));
      ms.tokens.insert(ms.tokens.end(), drafts.begin(), drafts.end());
      const int64_t slots_before = ms.num_slots;
      KVP_RETURN_IF_ERROR(allocate(s, static_cast<int64_t>(ms.tokens.size()) - ms.num_slots));
      const bool verified = ms.num_slots != slots_before || ms.num_slots == static_cast<int64_t>(ms.tokens.size());
      // Drafts are never final: nothing new may have entered the prefix cache yet.
      if (m_.sequence(s)->num_final != final_before) return Status::error("a speculative append changed num_final");
      const int64_t keep = accepted_len + (verified ? (c >> 3) % (k + 1) : 0);
      KVP_RETURN_IF_ERROR(m_.truncate(s, keep));
      ms.tokens.resize(static_cast<size_t>(keep));
      ms.num_slots = std::min(ms.num_slots, keep);
      if (m_.sequence(s)->num_final != final_before) return Status::error("a rollback of drafts changed num_final");
      KVP_RETURN_IF_ERROR(m_.mark_final(s, ms.num_slots));
      break;
    }
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
  return st.with_context("after command " + str(commands_) + " (kind " + str(kind) + ")");
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
  for (int64_t p = 0; p < ms.num_slots; ++p) {
    const int64_t slot = kernels::slot_of(s->table.data(), p, bs);
    const Cell want{scope_of(ms), p, ms.tokens[static_cast<size_t>(p)]};
    const Cell& got = pool[static_cast<size_t>(slot)];
    if (!(got == want)) {
      return Status::error("sequence " + str(id) + " position " + str(p) + " reads slot " + str(slot) +
                           (ms.swapped ? " (host)" : "") + " holding tenant " + str(got.tenant) + " position " +
                           str(got.position) + " token " + str(got.token) + ", expected token " + str(want.token));
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
