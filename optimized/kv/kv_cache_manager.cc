#include "optimized/kv/kv_cache_manager.h"

#include <algorithm>

#include "kernels/kv_index.h"

namespace kvp {

using kernels::blocks_for_tokens;

Status validate(const KvCacheConfig& c) {
  KVP_RETURN_IF_ERROR(c.pool.validate());
  if (c.watermark_blocks < 0 || c.watermark_blocks > c.pool.num_device_blocks) {
    return Status::error("watermark_blocks must be in [0, num_device_blocks]");
  }
  if (c.hash_bits < 1 || c.hash_bits > 256) return Status::error("hash_bits must be in [1, 256]");
  if (c.sliding_window < 0) return Status::error("sliding_window must be >= 0 (0: none)");
  return Status::ok();
}

const char* to_string(AllocStatus s) {
  switch (s) {
    case AllocStatus::kOk: return "OK";
    case AllocStatus::kLater: return "LATER";
    case AllocStatus::kNever: return "NEVER";
  }
  return "?";
}

namespace {
std::string seq_error(const char* op, SeqId seq, const std::string& why) {
  return std::string(op) + "(seq " + std::to_string(seq) + "): " + why;
}
}  // namespace

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config),
      device_(config.pool.num_device_blocks),
      host_(config.pool.num_host_blocks),
      cache_(config.pool.num_device_blocks),
      rolled_back_generation_(static_cast<size_t>(std::max(0, config.pool.num_device_blocks)), -1) {
  KVP_CHECK(validate(config).is_ok());
}

void KvCacheManager::set_event_log(EventLog* event_log) {
  log_ = event_log;
  if (log_ == nullptr) return;
  // The replayer starts from an empty state, so a log must start from one.
  KVP_CHECK(seqs_.empty() && device_.num_free() == device_.num_blocks() && host_.num_free() == host_.num_blocks());
  log(kv_event::Init{config_.pool.num_device_blocks, config_.pool.num_host_blocks, config_.pool.block_size,
                     config_.global_prefix_sharing, config_.sliding_window});
}

void KvCacheManager::log(const KvEvent& event) { log_->record(event); }

SequenceState* KvCacheManager::find(SeqId seq) { return const_cast<SequenceState*>(sequence(seq)); }

const SequenceState* KvCacheManager::sequence(SeqId seq) const {
  // A decode step looks the same sequence up several times in a row (append_tokens,
  // can_allocate, allocate_slots, mark_final): remember the last hit. Map nodes are stable,
  // so the pointer stays valid until that sequence is erased (free), which clears it.
  if (last_found_ != nullptr && last_found_->id == seq) return last_found_;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return nullptr;
  last_found_ = &it->second;
  return last_found_;
}

const BlockHash& KvCacheManager::block_hash(const SequenceState& s, int64_t i) const {
  const int64_t bs = config_.pool.block_size;
  KVP_CHECK(i >= 0 && (i + 1) * bs <= static_cast<int64_t>(s.tokens.size()));
  while (static_cast<int64_t>(s.block_hashes.size()) <= i) {
    const int64_t j = static_cast<int64_t>(s.block_hashes.size());
    const BlockHash* parent = j == 0 ? nullptr : &s.block_hashes.back();
    s.block_hashes.push_back(
        chain_hash(parent, salt_of(s), std::span<const int32_t>(s.tokens).subspan(j * bs, bs), config_.hash_bits));
  }
  return s.block_hashes[static_cast<size_t>(i)];
}

// ---------------------------------------------------------------- sequences and tokens

Status KvCacheManager::add_sequence(SeqId seq, int64_t tenant, std::span<const int32_t> tokens) {
  return add_sequence(seq, tenant, std::vector<int32_t>(tokens.begin(), tokens.end()));
}

Status KvCacheManager::add_sequence(SeqId seq, int64_t tenant, std::vector<int32_t>&& tokens) {
  if (seqs_.count(seq) != 0) return Status::error(seq_error("add_sequence", seq, "id in use"));
  SequenceState s;
  s.id = seq;
  s.tenant = tenant;
  s.tokens = std::move(tokens);
  seqs_.emplace(seq, std::move(s));
  if (logging()) log(kv_event::Add{seq, tenant});
  changed();
  return Status::ok();
}

Status KvCacheManager::append_tokens(SeqId seq, std::span<const int32_t> tokens) {
  SequenceState* s = find(seq);
  if (s == nullptr) return Status::error(seq_error("append_tokens", seq, "unknown sequence"));
  if (tokens.size() == 1) {
    s->tokens.push_back(tokens[0]);  // a decode step's token: the common case, kept cheap
  } else {
    s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
  }
  changed();
  return Status::ok();
}

Status KvCacheManager::mark_final(SeqId seq, int64_t num_final) {
  SequenceState* s = find(seq);
  if (s == nullptr) return Status::error(seq_error("mark_final", seq, "unknown sequence"));
  if (s->swapped) return Status::error(seq_error("mark_final", seq, "sequence is swapped out"));
  if (num_final < s->num_final || num_final > s->num_slots) {
    return Status::error(seq_error("mark_final", seq,
                                   "num_final " + std::to_string(num_final) + " outside [" +
                                       std::to_string(s->num_final) + ", " + std::to_string(s->num_slots) + "]"));
  }
  s->num_final = num_final;
  register_final_blocks(*s);  // first: a block the window releases may be cached on its way
  release_window_blocks(*s);
  changed();
  return Status::ok();
}

int64_t KvCacheManager::window_dead_blocks(int64_t num_final) const {
  const int64_t w = config_.sliding_window;
  if (w <= 0) return 0;
  return std::max<int64_t>(0, (num_final - w + 1) / config_.pool.block_size);
}

void KvCacheManager::release_window_blocks(SequenceState& s) {
  const int64_t dead = std::min(window_dead_blocks(s.num_final), s.table.size());
  for (int64_t j = s.num_window_released; j < dead; ++j) {
    const int32_t b = s.table[j];
    s.window_parent = device_.handle(b);
    s.table.set(j, kNoBlock);
    if (logging()) log(kv_event::WindowRelease{s.id, j, b});
    release_device_block(b);
  }
  s.num_window_released = std::max(s.num_window_released, dead);
}

void KvCacheManager::register_final_blocks(SequenceState& s) {
  if (!config_.enable_prefix_caching || s.swapped) return;
  const int64_t bs = config_.pool.block_size;
  const int64_t full = s.num_final / bs;
  for (int64_t i = std::max(s.num_registered_blocks, s.num_window_released); i < full; ++i) {
    const int32_t b = s.table[i];
    if (device_.is_cached(b)) continue;
    BlockHandle parent;
    if (i > 0) {
      // The parent's handle; the window may have released the entry (then it is the handle
      // it had, current only while that block was not evicted since).
      parent = s.table[i - 1] == kNoBlock ? s.window_parent : device_.handle(s.table[i - 1]);
      // A chain is only as good as its parent: an uncached parent cannot be matched.
      if (!device_.is_current(parent) || !device_.is_cached(parent.block)) continue;
      // A released block keeps its generation while another sequence holds it, and that
      // sequence may rewrite it in place: it truncated into the block while both held it
      // and writes once this one's window let go (no copy on write for a sole holder). It
      // may then cache the block with other tokens. Chain onto the block only while its entry
      // still holds this sequence's block i - 1 (found by the kv_ops fuzzer: a next block
      // registered under a parent whose tokens had changed).
      if (s.table[i - 1] == kNoBlock && !same_block_content(cache_.entry(parent.block), s, i - 1)) continue;
    }
    const BlockHash& h = block_hash(s, i);
    auto block_tokens = std::span<const int32_t>(s.tokens).subspan(i * bs, bs);
    if (cache_.find(h, salt_of(s), block_tokens, parent) >= 0) continue;  // a duplicate
    device_.mark_cached(b);
    rolled_back_generation_[static_cast<size_t>(b)] = -1;  // registered again, with final tokens
    cache_.insert(
        b, PrefixCacheEntry{h, salt_of(s), std::vector<int32_t>(block_tokens.begin(), block_tokens.end()), parent});
    if (logging()) log(kv_event::Cache{b});
  }
  s.num_registered_blocks = std::max(s.num_registered_blocks, full);
}

bool KvCacheManager::same_block_content(const PrefixCacheEntry& e, const SequenceState& s, int64_t i) const {
  const int64_t bs = config_.pool.block_size;
  const auto tokens = std::span<const int32_t>(s.tokens).subspan(i * bs, bs);
  return e.salt == salt_of(s) && std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end()) &&
         e.hash == block_hash(s, i);
}

// ---------------------------------------------------------------- slots

PrefixHit KvCacheManager::find_prefix(const SequenceState& s) const {
  PrefixHit hit;
  hit.seq = s.id;
  hit.version = version_;
  if (!config_.enable_prefix_caching || s.swapped || !s.table.empty() || s.num_slots != 0 || s.tokens.empty()) {
    return hit;
  }
  const int64_t bs = config_.pool.block_size;
  // At least the last token is recomputed, so that its logits exist.
  const int64_t max_blocks = (static_cast<int64_t>(s.tokens.size()) - 1) / bs;
  BlockHandle parent;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const int32_t b =
        cache_.find(block_hash(s, i), salt_of(s), std::span<const int32_t>(s.tokens).subspan(i * bs, bs), parent);
    if (b < 0) break;
    hit.blocks.push_back(b);
    parent = device_.handle(b);
  }
  hit.num_looked_up = max_blocks;
  hit.num_tokens = static_cast<int64_t>(hit.blocks.size()) * bs;
  // The blocks the sequence keeps leave the available pool: not those the window releases
  // as soon as it takes them (take_prefix_hit), which stay cached.
  for (auto j = static_cast<size_t>(window_dead_blocks(hit.num_tokens)); j < hit.blocks.size(); ++j) {
    if (device_.refcount(hit.blocks[j]) == 0) ++hit.num_evictable;
  }
  return hit;
}

PrefixHit KvCacheManager::find_prefix(SeqId seq) const {
  const SequenceState* s = sequence(seq);
  if (s != nullptr) return find_prefix(*s);
  PrefixHit none;
  none.seq = seq;
  none.version = version_;
  return none;
}

bool KvCacheManager::needs_copy_on_write(const SequenceState& s, int64_t n_new_tokens) const {
  if (n_new_tokens <= 0 || s.num_slots % config_.pool.block_size == 0) return false;
  const int32_t last = s.table.back();
  return device_.refcount(last) > 1 || device_.is_cached(last);
}

AllocStatus KvCacheManager::can_allocate(const SequenceState& s, int64_t n_new_tokens, const PrefixHit& hit,
                                         int64_t num_lookahead) const {
  if (s.swapped || n_new_tokens < 0 || num_lookahead < 0) return AllocStatus::kNever;
  const int64_t bs = config_.pool.block_size;
  const auto num_hit = static_cast<int64_t>(hit.blocks.size());
  const int64_t start = s.num_slots + hit.num_tokens;
  const int64_t end = start + n_new_tokens + num_lookahead;
  if (end > static_cast<int64_t>(s.tokens.size()) + num_lookahead) return AllocStatus::kNever;
  const bool admitting = s.table.empty();
  const int64_t watermark = admitting ? config_.watermark_blocks : 0;
  const int64_t total = blocks_for_tokens(end, bs);
  // The entries the window has released by then hold no block (admitting: those of the hit).
  const int64_t released = admitting ? window_dead_blocks(hit.num_tokens) : s.num_window_released;
  if (total - released > config_.pool.num_device_blocks - watermark) return AllocStatus::kNever;
  const int64_t need =
      total - (s.table.size() + num_hit) + (needs_copy_on_write(s, n_new_tokens + num_lookahead) ? 1 : 0);
  if (need <= 0) return AllocStatus::kOk;
  const int64_t available = device_.num_available() - hit.num_evictable;
  return available - need >= watermark ? AllocStatus::kOk : AllocStatus::kLater;
}

AllocStatus KvCacheManager::can_allocate(SeqId seq, int64_t n_new_tokens, const PrefixHit& hit,
                                         int64_t num_lookahead) const {
  KVP_CHECK(is_current(hit, seq));  // a hit is used before the state changes
  const SequenceState* s = sequence(seq);
  if (s == nullptr) return AllocStatus::kNever;
  return can_allocate(*s, n_new_tokens, hit, num_lookahead);
}

AllocStatus KvCacheManager::can_allocate(SeqId seq, int64_t n_new_tokens) const {
  return can_allocate(seq, n_new_tokens, find_prefix(seq));
}

void KvCacheManager::take_prefix_hit(SequenceState& s, const PrefixHit& hit) {
  for (int32_t b : hit.blocks) {
    device_.retain(b);
    s.table.push_back(b);
    if (logging()) log(kv_event::Share{s.id, b, kv_event::ShareReason::kPrefixHit});
  }
  s.num_slots = s.num_final = hit.num_tokens;
  s.num_registered_blocks = static_cast<int64_t>(hit.blocks.size());
  cache_.stats().hits += static_cast<int64_t>(hit.blocks.size());
  cache_.stats().misses += hit.num_looked_up - static_cast<int64_t>(hit.blocks.size());
  // The hit's blocks wholly before the window of its first new position go straight back
  // (still cached): the sequence keeps what the window needs. The log states the hit's
  // length first, which the replayer bounds a window release by.
  if (window_dead_blocks(hit.num_tokens) > 0 && logging()) log(kv_event::Slots{s.id, hit.num_tokens});
  release_window_blocks(s);
}

AllocStatus KvCacheManager::allocate_slots(SeqId seq, int64_t n_new_tokens, const PrefixHit& hit,
                                           std::vector<int64_t>& slot_mapping, std::span<const int32_t> lookahead) {
  KVP_CHECK(is_current(hit, seq));  // a hit is used before the state changes
  SequenceState* s = find(seq);
  if (s == nullptr) return AllocStatus::kNever;
  return allocate_slots(s, n_new_tokens, hit, slot_mapping, lookahead);
}

AllocStatus KvCacheManager::allocate_slots(SequenceState* s, int64_t n_new_tokens, const PrefixHit& hit,
                                           std::vector<int64_t>& slot_mapping, std::span<const int32_t> lookahead) {
  const SeqId seq = s->id;
  const auto num_lookahead = static_cast<int64_t>(lookahead.size());
  if (const AllocStatus st = can_allocate(*s, n_new_tokens, hit, num_lookahead); st != AllocStatus::kOk) return st;
  const int64_t bs = config_.pool.block_size;
  if (config_.enable_prefix_caching && s->table.empty() && s->num_slots == 0) take_prefix_hit(*s, hit);
  if (num_lookahead > 0) s->tokens.insert(s->tokens.end(), lookahead.begin(), lookahead.end());
  const int64_t n = n_new_tokens + num_lookahead;

  if (needs_copy_on_write(*s, n)) {
    const int64_t i = s->table.size() - 1;
    const int32_t src = s->table[i];
    const int32_t dst = take_device_block(/*is_copy_dst=*/true);
    ops_.block_copies.push_back({src, dst});
    s->table.set(i, dst);
    if (logging()) {
      log(kv_event::Cow{seq, i, src, dst});
    }
    release_device_block(src);
  }

  const int64_t start = s->num_slots;
  const int64_t end = start + n;
  const int64_t blocks_needed = blocks_for_tokens(end, bs);
  while (s->table.size() < blocks_needed) {
    const int32_t b = take_device_block(/*is_copy_dst=*/false);
    s->table.push_back(b);
    if (logging()) log(kv_event::Alloc{seq, b});
  }
  for (int64_t p = start; p < end; ++p) {
    slot_mapping.push_back(kernels::slot_of(s->table.data(), p, bs));
  }
  s->num_slots = end;
  if (logging()) log(kv_event::Slots{seq, end});
  changed();
  return AllocStatus::kOk;
}

Status KvCacheManager::allocate_slots(SeqId seq, int64_t n_new_tokens, std::vector<int64_t>& slot_mapping) {
  SequenceState* s = find(seq);
  if (s == nullptr) return Status::error(seq_error("allocate_slots", seq, "unknown sequence"));
  const AllocStatus st = allocate_slots(s, n_new_tokens, find_prefix(*s), slot_mapping, {});
  if (st == AllocStatus::kOk) return Status::ok();
  return Status::error(
      seq_error("allocate_slots", seq, std::to_string(n_new_tokens) + " new tokens: " + to_string(st)));
}

int32_t KvCacheManager::take_device_block(bool is_copy_dst) {
  const BlockAllocator::Allocation a = device_.allocate();
  if (a.evicted) {
    cache_.erase(a.block);
    if (logging()) log(kv_event::Evict{a.block});
    drop_orphans(a.block);
  }
  if (config_.poison_on_free) {
    if (is_copy_dst) {
      // The copy writes the whole block before the poison step would run: drop the poison.
      std::erase(ops_.poison, a.block);
    } else if (a.evicted) {
      ops_.poison.push_back(a.block);
      if (logging()) log(kv_event::Poison{a.block});
    }
  }
  return a.block;
}

void KvCacheManager::release_device_block(int32_t block) {
  if (device_.release(block) && !device_.is_cached(block) && config_.poison_on_free) {
    ops_.poison.push_back(block);
    if (logging()) log(kv_event::Poison{block});
  }
}

void KvCacheManager::release_tail_to(SequenceState& s, int64_t num_blocks) {
  while (s.table.size() > num_blocks) {
    const int32_t b = s.table.back();
    s.table.pop_back();
    if (logging()) log(kv_event::Release{s.id, b});
    if (b == kNoBlock) {
      s.num_window_released = std::min(s.num_window_released, s.table.size());
      continue;  // the window released its block already
    }
    if (s.swapped) {
      host_.release(b);
    } else {
      release_device_block(b);
    }
  }
}

Status KvCacheManager::free(SeqId seq, std::vector<int32_t>* token_history) {
  SequenceState* s = find(seq);
  if (s == nullptr) return Status::error(seq_error("free", seq, "unknown sequence"));
  if (token_history != nullptr) *token_history = std::move(s->tokens);
  release_tail_to(*s, 0);
  if (logging()) log(kv_event::Free{seq});
  if (last_found_ != nullptr && last_found_->id == seq) last_found_ = nullptr;
  seqs_.erase(seq);
  changed();
  return Status::ok();
}

Status KvCacheManager::fork(SeqId parent, SeqId child) {
  const SequenceState* p = find(parent);
  if (p == nullptr) return Status::error(seq_error("fork", parent, "unknown sequence"));
  if (p->swapped) return Status::error(seq_error("fork", parent, "sequence is swapped out"));
  if (seqs_.count(child) != 0) {
    return Status::error(seq_error("fork", parent, "child id " + std::to_string(child) + " in use"));
  }
  SequenceState c = *p;
  c.id = child;
  c.table.clear();
  if (logging()) log(kv_event::Fork{parent, child});
  for (int32_t b : p->table.blocks()) {
    c.table.push_back(b);
    if (b == kNoBlock) continue;  // the child starts with the parent's released entries
    device_.retain(b);
    if (logging()) {
      log(kv_event::Share{child, b, kv_event::ShareReason::kFork});
    }
  }
  if (logging()) log(kv_event::Slots{child, c.num_slots});
  seqs_.emplace(child, std::move(c));
  changed();
  return Status::ok();
}

Status KvCacheManager::truncate(SeqId seq, int64_t new_len) {
  SequenceState* s = find(seq);
  if (s == nullptr) return Status::error(seq_error("truncate", seq, "unknown sequence"));
  if (new_len < 0 || new_len > static_cast<int64_t>(s->tokens.size())) {
    return Status::error(
        seq_error("truncate", seq,
                  "new_len " + std::to_string(new_len) + " outside [0, " + std::to_string(s->tokens.size()) + "]"));
  }
  const int64_t bs = config_.pool.block_size;
  if (window_dead_blocks(std::min(s->num_final, new_len)) < s->num_window_released) {
    return Status::error(seq_error("truncate", seq,
                                   "new_len " + std::to_string(new_len) +
                                       " would need positions the sliding window already released (" +
                                       std::to_string(s->num_window_released) + " blocks)"));
  }
  if (!s->swapped && new_len < static_cast<int64_t>(s->tokens.size())) {
    // I9: cached blocks holding a dropped position leave the prefix cache.
    std::vector<BlockHandle> dropped;
    for (int64_t i = new_len / bs; i < s->table.size(); ++i) {
      const int32_t b = s->table[i];
      if (b == kNoBlock || !device_.is_cached(b)) continue;
      rolled_back_generation_[static_cast<size_t>(b)] = device_.generation(b);
      dropped.push_back(device_.handle(b));
      drop_cache_entry(b);
    }
    // Entries chained onto a dropped block go too: the block may now be rewritten in place
    // (same generation), and a chain must never vouch for a parent whose tokens changed.
    for (size_t d = 0; d < dropped.size(); ++d) {
      for (int32_t c : cache_.blocks()) {
        if (!(cache_.entry(c).parent == dropped[d])) continue;
        dropped.push_back(device_.handle(c));
        drop_cache_entry(c);
      }
    }
  }
  s->tokens.resize(static_cast<size_t>(new_len));
  s->num_slots = std::min(s->num_slots, new_len);
  s->num_final = std::min(s->num_final, new_len);
  if (static_cast<int64_t>(s->block_hashes.size()) > new_len / bs) {
    s->block_hashes.resize(static_cast<size_t>(new_len / bs));
  }
  s->num_registered_blocks = std::min(s->num_registered_blocks, s->num_final / bs);
  release_tail_to(*s, blocks_for_tokens(s->num_slots, bs));
  if (logging()) log(kv_event::Slots{seq, s->num_slots});
  changed();
  return Status::ok();
}

Status KvCacheManager::swap_out(SeqId seq) {
  SequenceState* s = find(seq);
  if (s == nullptr) return Status::error(seq_error("swap_out", seq, "unknown sequence"));
  if (s->swapped) return Status::error(seq_error("swap_out", seq, "already swapped out"));
  // The live entries move; the ones the window released stay kNoBlock.
  const int64_t first = s->num_window_released;
  const int64_t k = s->table.size() - first;
  if (host_.num_available() < k) {
    return Status::error(
        seq_error("swap_out", seq,
                  "needs " + std::to_string(k) + " host blocks, " + std::to_string(host_.num_available()) + " free"));
  }
  std::vector<BlockCopy> pairs;
  pairs.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) pairs.push_back({s->table[first + i], host_.allocate().block});
  if (logging()) log(kv_event::SwapOut{seq, pairs});
  for (int64_t i = k - 1; i >= 0; --i) {
    release_device_block(pairs[static_cast<size_t>(i)].src);
    s->table.set(first + i, pairs[static_cast<size_t>(i)].dst);
  }
  ops_.swap_out.insert(ops_.swap_out.end(), pairs.begin(), pairs.end());
  s->swapped = true;
  changed();
  return Status::ok();
}

bool KvCacheManager::can_swap_in(SeqId seq) const {
  const SequenceState* s = sequence(seq);
  return s != nullptr && s->swapped && device_.num_available() >= s->table.size() - s->num_window_released;
}

Status KvCacheManager::swap_in(SeqId seq) {
  SequenceState* s = find(seq);
  if (s == nullptr) return Status::error(seq_error("swap_in", seq, "unknown sequence"));
  if (!s->swapped) return Status::error(seq_error("swap_in", seq, "not swapped out"));
  const int64_t first = s->num_window_released;
  const int64_t k = s->table.size() - first;
  if (device_.num_available() < k) {
    return Status::error(seq_error(
        "swap_in", seq,
        "needs " + std::to_string(k) + " device blocks, " + std::to_string(device_.num_available()) + " available"));
  }
  std::vector<BlockCopy> pairs;
  pairs.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    pairs.push_back({s->table[first + i], take_device_block(/*is_copy_dst=*/false)});
  }
  if (logging()) log(kv_event::SwapIn{seq, pairs});
  for (int64_t i = k - 1; i >= 0; --i) {
    host_.release(pairs[static_cast<size_t>(i)].src);
    s->table.set(first + i, pairs[static_cast<size_t>(i)].dst);
  }
  ops_.swap_in.insert(ops_.swap_in.end(), pairs.begin(), pairs.end());
  s->swapped = false;
  s->num_registered_blocks = 0;  // the new blocks may be offered to the cache again
  register_final_blocks(*s);
  changed();
  return Status::ok();
}

// ---------------------------------------------------------------- prefix cache

void KvCacheManager::drop_cache_entry(int32_t block) {
  cache_.erase(block);
  device_.clear_cached(block);
  if (logging()) log(kv_event::Evict{block});
  if (device_.refcount(block) == 0 && config_.poison_on_free) {
    ops_.poison.push_back(block);
    if (logging()) log(kv_event::Poison{block});
  }
}

void KvCacheManager::drop_orphans(int32_t block) {
  // Tables release their tails first, so a chain's parent is normally evicted after its
  // children. A sliding window releases a sequence's oldest blocks first: the parent can go
  // first, and its cached descendants could never be matched again (check_cache_reachable).
  // They leave the cache with it. Without a window nothing is orphaned this way; skip the scan.
  if (config_.sliding_window <= 0) return;
  std::vector<int32_t> gone{block};
  for (size_t d = 0; d < gone.size(); ++d) {
    for (int32_t c : cache_.blocks()) {
      if (cache_.entry(c).parent.block != gone[d]) continue;
      drop_cache_entry(c);
      gone.push_back(c);
    }
  }
}

int32_t KvCacheManager::evict_cached(int32_t n) {
  int32_t evicted = 0;
  while (evicted < n && device_.lru_evictable() >= 0) {
    const int32_t b = device_.lru_evictable();
    drop_cache_entry(b);
    drop_orphans(b);
    ++evicted;
  }
  if (evicted > 0) changed();
  return evicted;
}

void KvCacheManager::flush_prefix_cache() {
  for (int32_t b : cache_.blocks()) drop_cache_entry(b);
  changed();
}

KvPlanOps KvCacheManager::take_plan_ops() {
  KvPlanOps out = std::move(ops_);
  ops_.clear();
  return out;
}

}  // namespace kvp
