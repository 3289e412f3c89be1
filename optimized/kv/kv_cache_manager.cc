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
  if (!c.group_windows.empty() && c.sliding_window != 0) {
    return Status::error("sliding_window must be 0 when group_windows is set (each group has its own window)");
  }
  for (size_t g = 0; g < c.group_windows.size(); ++g) {
    if (c.group_windows[g] < 0) {
      return Status::error("group_windows[" + std::to_string(g) + "] must be >= 0 (0: full attention)");
    }
  }
  return Status::ok();
}

int64_t KvCacheConfig::anchor_group() const {
  if (num_groups() == 1 || !any_window()) return -1;
  for (int64_t g = 0; g < num_groups(); ++g) {
    if (window_of(g) == 0) return g;
  }
  return -1;
}

bool KvCacheConfig::any_window() const {
  for (int64_t g = 0; g < num_groups(); ++g) {
    if (window_of(g) > 0) return true;
  }
  return false;
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
                     config_.global_prefix_sharing, config_.sliding_window, config_.group_windows});
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
  s.groups.resize(static_cast<size_t>(config_.num_groups()));
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

int64_t KvCacheManager::window_dead_blocks(int64_t num_final, int64_t group) const {
  const int64_t w = config_.window_of(group);
  if (w <= 0) return 0;
  return std::max<int64_t>(0, (num_final - w + 1) / config_.pool.block_size);
}

void KvCacheManager::release_window_blocks(SequenceState& s) {
  for (int64_t g = 0; g < s.num_groups(); ++g) {
    GroupTable& gt = s.group(g);
    const int64_t dead = std::min(window_dead_blocks(s.num_final, g), gt.table.size());
    for (int64_t j = gt.num_window_released; j < dead; ++j) {
      const int32_t b = gt.table[j];
      if (b == kNoBlock) continue;  // a prefix hit's entry before the window: no block was taken
      gt.window_parent = device_.handle(b);
      gt.table.set(j, kNoBlock);
      if (logging()) log(kv_event::WindowRelease{s.id, j, b, static_cast<int32_t>(g)});
      release_device_block(b);
    }
    gt.num_window_released = std::max(gt.num_window_released, dead);
  }
}

void KvCacheManager::register_final_blocks(SequenceState& s) {
  if (!config_.enable_prefix_caching || s.swapped) return;
  const int64_t bs = config_.pool.block_size;
  const int64_t full = s.num_final / bs;
  // The anchor first: the other groups' blocks are registered under its blocks.
  const int64_t anchor = config_.anchor_group();
  for (int64_t k = -1; k < s.num_groups(); ++k) {
    const int64_t g = k < 0 ? anchor : k;
    if (g < 0 || (k >= 0 && g == anchor)) continue;
    GroupTable& gt = s.group(g);
    register_final_blocks(s, g, full);
    gt.num_registered_blocks = std::max(gt.num_registered_blocks, full);
  }
}

void KvCacheManager::register_final_blocks(SequenceState& s, int64_t g, int64_t full) {
  const int64_t bs = config_.pool.block_size;
  const GroupTable& gt = s.group(g);
  for (int64_t i = std::max(gt.num_registered_blocks, gt.num_window_released); i < full; ++i) {
    const int32_t b = gt.table[i];
    if (device_.is_cached(b)) continue;
    BlockHandle parent;
    if (anchored(g)) {
      // Registered under the anchor's block of the same positions, whose chain vouches for
      // every token before them: a window's blocks are found without the blocks before the
      // window (which it released, and which are evicted first).
      const int32_t a = s.group(config_.anchor_group()).table[i];
      if (!device_.is_cached(a)) continue;  // the anchor's block is not the cached one
      parent = device_.handle(a);
    } else if (i > 0) {
      // The parent's handle; the window may have released the entry (then it is the handle
      // it had, current only while that block was not evicted since).
      parent = gt.table[i - 1] == kNoBlock ? gt.window_parent : device_.handle(gt.table[i - 1]);
      // A chain is only as good as its parent: an uncached parent cannot be matched.
      if (!device_.is_current(parent) || !device_.is_cached(parent.block)) continue;
      // A released block keeps its generation while another sequence holds it, and that
      // sequence may rewrite it in place: it truncated into the block while both held it
      // and writes once this one's window let go (no copy on write for a sole holder). It
      // may then cache the block with other tokens. Chain onto the block only while its entry
      // still holds this sequence's block i - 1 (found by the kv_ops fuzzer: a next block
      // registered under a parent whose tokens had changed).
      if (gt.table[i - 1] == kNoBlock && !same_block_content(cache_.entry(parent.block), s, i - 1)) continue;
    }
    const BlockHash& h = block_hash(s, i);
    auto block_tokens = std::span<const int32_t>(s.tokens).subspan(i * bs, bs);
    const auto group = static_cast<int32_t>(g);
    if (cache_.find(h, salt_of(s), block_tokens, parent, group) >= 0) continue;  // a duplicate
    device_.mark_cached(b);
    rolled_back_generation_[static_cast<size_t>(b)] = -1;  // registered again, with final tokens
    cache_.insert(b, PrefixCacheEntry{h, salt_of(s), std::vector<int32_t>(block_tokens.begin(), block_tokens.end()),
                                      parent, group});
    if (logging()) log(kv_event::Cache{b});
  }
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
  if (!config_.enable_prefix_caching || s.swapped || !s.table().empty() || s.num_slots != 0 || s.tokens.empty()) {
    return hit;  // no chains: every decode step asks, and allocates nothing
  }
  const int64_t num_groups = config_.num_groups();
  hit.blocks.resize(static_cast<size_t>(num_groups));
  const int64_t bs = config_.pool.block_size;
  // At least the last token is recomputed, so that its logits exist.
  int64_t num_blocks = (static_cast<int64_t>(s.tokens.size()) - 1) / bs;
  hit.num_looked_up = num_blocks * num_groups;
  if (config_.anchor_group() >= 0) {
    find_anchored_hit(s, num_blocks, hit);
  } else {
    // The hit is what every group can serve: each group's chain, cut to the shortest. (A
    // windowed group's chain must reach back to the first block too, although the sequence
    // keeps only its window's: a chain is matched from its root.)
    for (int64_t g = 0; g < num_groups && num_blocks > 0; ++g) {
      hit.blocks[static_cast<size_t>(g)] = cached_chain(s, g, num_blocks);
      num_blocks = std::min(num_blocks, static_cast<int64_t>(hit.blocks[static_cast<size_t>(g)].size()));
    }
    for (auto& chain : hit.blocks) chain.resize(static_cast<size_t>(num_blocks));
    hit.num_tokens = num_blocks * bs;
  }
  // The blocks the sequence keeps leave the available pool: not those a window releases as
  // soon as it takes them (take_prefix_hit), which stay cached.
  for (int64_t g = 0; g < num_groups; ++g) {
    const std::vector<int32_t>& chain = hit.blocks[static_cast<size_t>(g)];
    for (auto j = static_cast<size_t>(window_dead_blocks(hit.num_tokens, g)); j < chain.size(); ++j) {
      if (chain[j] != kNoBlock && device_.refcount(chain[j]) == 0) ++hit.num_evictable;
    }
  }
  return hit;
}

void KvCacheManager::find_anchored_hit(const SequenceState& s, int64_t max_blocks, PrefixHit& hit) const {
  const int64_t bs = config_.pool.block_size;
  const int64_t anchor = config_.anchor_group();
  const std::vector<int32_t> chain = cached_chain(s, anchor, max_blocks);
  // The longest k first: a longer hit needs later blocks, but fewer before the windows, so
  // the first k every group serves is the longest.
  for (auto k = static_cast<int64_t>(chain.size()); k >= 0; --k) {
    bool served = true;
    for (int64_t g = 0; g < config_.num_groups() && served; ++g) {
      std::vector<int32_t>& blocks = hit.blocks[static_cast<size_t>(g)];
      if (g == anchor) {
        blocks.assign(chain.begin(), chain.begin() + k);
        continue;
      }
      // Entries before the window of the first new position (k * bs) are released as the
      // hit is taken: they need no block (kNoBlock).
      const int64_t dead = window_dead_blocks(k * bs, g);
      blocks.assign(static_cast<size_t>(k), kNoBlock);
      for (int64_t j = dead; j < k && served; ++j) {
        const int32_t b =
            cache_.find(block_hash(s, j), salt_of(s), std::span<const int32_t>(s.tokens).subspan(j * bs, bs),
                        device_.handle(chain[static_cast<size_t>(j)]), static_cast<int32_t>(g));
        served = b >= 0;
        blocks[static_cast<size_t>(j)] = b;
      }
    }
    if (served) {
      hit.num_tokens = k * bs;
      return;
    }
  }
  KVP_CHECK(false);  // k = 0 is always served
}

std::vector<int32_t> KvCacheManager::cached_chain(const SequenceState& s, int64_t group, int64_t max_blocks) const {
  const int64_t bs = config_.pool.block_size;
  std::vector<int32_t> chain;
  BlockHandle parent;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const int32_t b = cache_.find(block_hash(s, i), salt_of(s), std::span<const int32_t>(s.tokens).subspan(i * bs, bs),
                                  parent, static_cast<int32_t>(group));
    if (b < 0) break;
    chain.push_back(b);
    parent = device_.handle(b);
  }
  return chain;
}

PrefixHit KvCacheManager::find_prefix(SeqId seq) const {
  const SequenceState* s = sequence(seq);
  if (s != nullptr) return find_prefix(*s);
  PrefixHit none;
  none.seq = seq;
  none.version = version_;
  return none;
}

bool KvCacheManager::needs_copy_on_write(const SequenceState& s, int64_t group, int64_t n_new_tokens) const {
  if (n_new_tokens <= 0 || s.num_slots % config_.pool.block_size == 0) return false;
  const int32_t last = s.group(group).table.back();
  return device_.refcount(last) > 1 || device_.is_cached(last);
}

AllocStatus KvCacheManager::can_allocate(const SequenceState& s, int64_t n_new_tokens, const PrefixHit& hit,
                                         int64_t num_lookahead) const {
  if (s.swapped || n_new_tokens < 0 || num_lookahead < 0) return AllocStatus::kNever;
  const int64_t bs = config_.pool.block_size;
  const int64_t num_hit = hit.num_tokens / bs;
  const int64_t start = s.num_slots + hit.num_tokens;
  const int64_t end = start + n_new_tokens + num_lookahead;
  if (end > static_cast<int64_t>(s.tokens.size()) + num_lookahead) return AllocStatus::kNever;
  const bool admitting = s.table().empty();
  const int64_t watermark = admitting ? config_.watermark_blocks : 0;
  const int64_t total = blocks_for_tokens(end, bs);
  int64_t held = 0;  // blocks every group's table holds after the allocation
  int64_t need = 0;  // blocks it takes from the pool
  for (int64_t g = 0; g < s.num_groups(); ++g) {
    const GroupTable& gt = s.group(g);
    // The entries the window has released by then hold no block (admitting: those of the hit).
    held += total - (admitting ? window_dead_blocks(hit.num_tokens, g) : gt.num_window_released);
    need += total - (gt.table.size() + num_hit) + (needs_copy_on_write(s, g, n_new_tokens + num_lookahead) ? 1 : 0);
  }
  if (held > config_.pool.num_device_blocks - watermark) return AllocStatus::kNever;
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
  int64_t num_hits = 0, num_unneeded = 0;
  for (int64_t g = 0; g < static_cast<int64_t>(hit.blocks.size()); ++g) {
    GroupTable& gt = s.group(g);
    for (int32_t b : hit.blocks[static_cast<size_t>(g)]) {
      gt.table.push_back(b);
      if (logging()) log(kv_event::Share{s.id, b, kv_event::ShareReason::kPrefixHit, static_cast<int32_t>(g)});
      if (b == kNoBlock) {  // before the window: released as it is taken, never looked up
        ++num_unneeded;
        continue;
      }
      device_.retain(b);
      ++num_hits;
    }
  }
  for (GroupTable& gt : s.groups) gt.num_registered_blocks = hit.num_tokens / config_.pool.block_size;
  s.num_slots = s.num_final = hit.num_tokens;
  cache_.stats().hits += num_hits;
  cache_.stats().misses += hit.num_looked_up - num_hits - num_unneeded;
  // The hit's blocks wholly before the window of its first new position go straight back
  // (still cached): the sequence keeps what the window needs. The log states the hit's
  // length first, which the replayer bounds a window release by.
  bool any_dead = false;
  for (int64_t g = 0; g < s.num_groups(); ++g) any_dead |= window_dead_blocks(hit.num_tokens, g) > 0;
  if (any_dead && logging()) log(kv_event::Slots{s.id, hit.num_tokens});
  release_window_blocks(s);
}

AllocStatus KvCacheManager::allocate_slots(SeqId seq, int64_t n_new_tokens, const PrefixHit& hit,
                                           std::vector<int64_t>& slot_mapping, std::span<const int32_t> lookahead) {
  KVP_CHECK(config_.num_groups() == 1);  // one slot mapping: one group
  return allocate_slots(seq, n_new_tokens, hit, std::span<std::vector<int64_t>>(&slot_mapping, 1), lookahead);
}

AllocStatus KvCacheManager::allocate_slots(SeqId seq, int64_t n_new_tokens, const PrefixHit& hit,
                                           std::span<std::vector<int64_t>> slot_mappings,
                                           std::span<const int32_t> lookahead) {
  KVP_CHECK(is_current(hit, seq));  // a hit is used before the state changes
  KVP_CHECK(static_cast<int64_t>(slot_mappings.size()) == config_.num_groups());
  SequenceState* s = find(seq);
  if (s == nullptr) return AllocStatus::kNever;
  return allocate_slots(s, n_new_tokens, hit, slot_mappings, lookahead);
}

AllocStatus KvCacheManager::allocate_slots(SequenceState* s, int64_t n_new_tokens, const PrefixHit& hit,
                                           std::span<std::vector<int64_t>> slot_mappings,
                                           std::span<const int32_t> lookahead) {
  const SeqId seq = s->id;
  const auto num_lookahead = static_cast<int64_t>(lookahead.size());
  if (const AllocStatus st = can_allocate(*s, n_new_tokens, hit, num_lookahead); st != AllocStatus::kOk) return st;
  const int64_t bs = config_.pool.block_size;
  if (config_.enable_prefix_caching && s->table().empty() && s->num_slots == 0) take_prefix_hit(*s, hit);
  if (num_lookahead > 0) s->tokens.insert(s->tokens.end(), lookahead.begin(), lookahead.end());
  const int64_t n = n_new_tokens + num_lookahead;
  const int64_t start = s->num_slots;
  const int64_t end = start + n;
  const int64_t blocks_needed = blocks_for_tokens(end, bs);

  for (int64_t g = 0; g < s->num_groups(); ++g) {
    BlockTable& table = s->group(g).table;
    if (needs_copy_on_write(*s, g, n)) {
      const int64_t i = table.size() - 1;
      const int32_t src = table[i];
      const int32_t dst = take_device_block(/*is_copy_dst=*/true);
      ops_.block_copies.push_back({src, dst});
      table.set(i, dst);
      if (logging()) {
        log(kv_event::Cow{seq, i, src, dst, static_cast<int32_t>(g)});
      }
      release_device_block(src);
    }
    while (table.size() < blocks_needed) {
      const int32_t b = take_device_block(/*is_copy_dst=*/false);
      table.push_back(b);
      if (logging()) log(kv_event::Alloc{seq, b, static_cast<int32_t>(g)});
    }
    std::vector<int64_t>& slot_mapping = slot_mappings[static_cast<size_t>(g)];
    for (int64_t p = start; p < end; ++p) {
      slot_mapping.push_back(kernels::slot_of(table.data(), p, bs));
    }
  }
  s->num_slots = end;
  if (logging()) log(kv_event::Slots{seq, end});
  changed();
  return AllocStatus::kOk;
}

Status KvCacheManager::allocate_slots(SeqId seq, int64_t n_new_tokens, std::vector<int64_t>& slot_mapping) {
  SequenceState* s = find(seq);
  if (s == nullptr) return Status::error(seq_error("allocate_slots", seq, "unknown sequence"));
  KVP_CHECK(config_.num_groups() == 1);  // one slot mapping: one group
  const AllocStatus st =
      allocate_slots(s, n_new_tokens, find_prefix(*s), std::span<std::vector<int64_t>>(&slot_mapping, 1), {});
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
  for (int64_t g = 0; g < s.num_groups(); ++g) {
    GroupTable& gt = s.group(g);
    while (gt.table.size() > num_blocks) {
      const int32_t b = gt.table.back();
      gt.table.pop_back();
      if (logging()) log(kv_event::Release{s.id, b, static_cast<int32_t>(g)});
      if (b == kNoBlock) {
        gt.num_window_released = std::min(gt.num_window_released, gt.table.size());
        continue;  // the window released its block already
      }
      if (s.swapped) {
        host_.release(b);
      } else {
        release_device_block(b);
      }
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
  if (logging()) log(kv_event::Fork{parent, child});
  for (int64_t g = 0; g < c.num_groups(); ++g) {
    for (int32_t b : c.group(g).table.blocks()) {
      if (b == kNoBlock) continue;  // the child starts with the parent's released entries
      device_.retain(b);
      if (logging()) {
        log(kv_event::Share{child, b, kv_event::ShareReason::kFork, static_cast<int32_t>(g)});
      }
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
  for (int64_t g = 0; g < s->num_groups(); ++g) {
    const int64_t released = s->group(g).num_window_released;
    if (window_dead_blocks(std::min(s->num_final, new_len), g) < released) {
      return Status::error(seq_error("truncate", seq,
                                     "new_len " + std::to_string(new_len) +
                                         " would need positions the sliding window already released (" +
                                         std::to_string(released) + " blocks" +
                                         (s->num_groups() > 1 ? " of group " + std::to_string(g) : "") + ")"));
    }
  }
  if (!s->swapped && new_len < static_cast<int64_t>(s->tokens.size())) {
    // I9: cached blocks holding a dropped position leave the prefix cache.
    std::vector<BlockHandle> dropped;
    for (const GroupTable& gt : s->groups) {
      for (int64_t i = new_len / bs; i < gt.table.size(); ++i) {
        const int32_t b = gt.table[i];
        if (b == kNoBlock || !device_.is_cached(b)) continue;
        rolled_back_generation_[static_cast<size_t>(b)] = device_.generation(b);
        dropped.push_back(device_.handle(b));
        drop_cache_entry(b);
      }
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
  for (GroupTable& gt : s->groups) gt.num_registered_blocks = std::min(gt.num_registered_blocks, s->num_final / bs);
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
  const std::vector<LiveEntry> live = live_entries(*s);
  const auto k = static_cast<int64_t>(live.size());
  if (host_.num_available() < k) {
    return Status::error(
        seq_error("swap_out", seq,
                  "needs " + std::to_string(k) + " host blocks, " + std::to_string(host_.num_available()) + " free"));
  }
  std::vector<BlockCopy> pairs;
  pairs.reserve(static_cast<size_t>(k));
  for (const LiveEntry& e : live) pairs.push_back({s->group(e.group).table[e.index], host_.allocate().block});
  if (logging()) log(kv_event::SwapOut{seq, pairs});
  for (int64_t i = k - 1; i >= 0; --i) {
    const LiveEntry& e = live[static_cast<size_t>(i)];
    release_device_block(pairs[static_cast<size_t>(i)].src);
    s->group(e.group).table.set(e.index, pairs[static_cast<size_t>(i)].dst);
  }
  ops_.swap_out.insert(ops_.swap_out.end(), pairs.begin(), pairs.end());
  s->swapped = true;
  changed();
  return Status::ok();
}

bool KvCacheManager::can_swap_in(SeqId seq) const {
  const SequenceState* s = sequence(seq);
  return s != nullptr && s->swapped && device_.num_available() >= static_cast<int64_t>(live_entries(*s).size());
}

Status KvCacheManager::swap_in(SeqId seq) {
  SequenceState* s = find(seq);
  if (s == nullptr) return Status::error(seq_error("swap_in", seq, "unknown sequence"));
  if (!s->swapped) return Status::error(seq_error("swap_in", seq, "not swapped out"));
  const std::vector<LiveEntry> live = live_entries(*s);
  const auto k = static_cast<int64_t>(live.size());
  if (device_.num_available() < k) {
    return Status::error(seq_error(
        "swap_in", seq,
        "needs " + std::to_string(k) + " device blocks, " + std::to_string(device_.num_available()) + " available"));
  }
  std::vector<BlockCopy> pairs;
  pairs.reserve(static_cast<size_t>(k));
  for (const LiveEntry& e : live) {
    pairs.push_back({s->group(e.group).table[e.index], take_device_block(/*is_copy_dst=*/false)});
  }
  if (logging()) log(kv_event::SwapIn{seq, pairs});
  for (int64_t i = k - 1; i >= 0; --i) {
    const LiveEntry& e = live[static_cast<size_t>(i)];
    host_.release(pairs[static_cast<size_t>(i)].src);
    s->group(e.group).table.set(e.index, pairs[static_cast<size_t>(i)].dst);
  }
  ops_.swap_in.insert(ops_.swap_in.end(), pairs.begin(), pairs.end());
  s->swapped = false;
  for (GroupTable& gt : s->groups) gt.num_registered_blocks = 0;  // the new blocks may be offered to the cache again
  register_final_blocks(*s);
  changed();
  return Status::ok();
}

std::vector<KvCacheManager::LiveEntry> KvCacheManager::live_entries(const SequenceState& s) {
  std::vector<LiveEntry> live;
  for (int64_t g = 0; g < s.num_groups(); ++g) {
    const GroupTable& gt = s.group(g);
    for (int64_t i = gt.num_window_released; i < gt.table.size(); ++i) live.push_back({g, i});
  }
  return live;
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
  if (!config_.any_window()) return;
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
