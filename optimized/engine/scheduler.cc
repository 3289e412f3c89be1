#include "optimized/engine/scheduler.h"

#include <algorithm>

#include "kernels/kv_index.h"

namespace kvp {

Status validate(const SchedulerConfig& c) {
  if (c.max_num_batched_tokens <= 0) return Status::error("max_num_batched_tokens must be > 0");
  if (c.max_num_seqs <= 0) return Status::error("max_num_seqs must be > 0");
  if (c.max_model_len <= 0) return Status::error("max_model_len must be > 0");
  if (c.prefill_chunk_size <= 0) return Status::error("prefill_chunk_size must be > 0");
  return Status::ok();
}

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager& kv) : config_(config), kv_(kv) {
  KVP_CHECK(validate(config).is_ok());
}

void Scheduler::add(Request* r) {
  KVP_CHECK(!r->in_kv_ && r->kv_tokens_ == nullptr);
  r->tokens_ = r->spec.prompt;
  r->state_ = RequestState::kWaiting;
  waiting_.push_back(r);
}

void Scheduler::finish(Request* r, FinishReason reason) {
  KVP_CHECK(!r->finished());
  auto drop = [r](auto& queue) { queue.erase(std::remove(queue.begin(), queue.end(), r), queue.end()); };
  drop(waiting_);
  drop(running_);
  drop(swapped_);
  if (r->in_kv_) release_sequence(r);
  r->state_ = RequestState::kFinished;
  r->finish_ = reason;
}

void Scheduler::reject(Request* r, std::string reason) {
  KVP_CHECK(r->state_ == RequestState::kWaiting && !r->in_kv_);
  KVP_CHECK(std::find(waiting_.begin(), waiting_.end(), r) == waiting_.end());
  r->tokens_ = r->spec.prompt;
  r->reject_reason_ = std::move(reason);
  r->state_ = RequestState::kFinished;
  r->finish_ = FinishReason::kRejected;
}

int64_t Scheduler::worst_case_blocks(const Request& r) const {
  const int64_t bs = kv_.block_size();
  const int64_t one = kernels::blocks_for_tokens(r.num_prompt() + r.spec.max_tokens, bs);
  const int64_t shared = r.num_prompt() / bs;  // full prompt blocks, shared by every sample
  const int64_t all = r.seats() == 1 ? one : shared + r.seats() * (one - shared);
  // Every KV-cache group holds its own table: the sum of the groups'.
  int64_t worst = 0;
  for (int64_t g = 0; g < kv_.config().num_groups(); ++g) {
    const int64_t w = kv_.config().window_of(g);
    if (w <= 0) {
      worst += all;
      continue;
    }
    // Behind a sliding window a sequence holds, at a step that runs n tokens from its final
    // length F, the entries from (F - W + 1) / bs up to (F + n) / bs rounded up: at most
    // (W - 1 + n) / bs + 2. n is at most a prefill chunk, or a decode token and its drafts.
    const int64_t step =
        std::max<int64_t>(std::min(config_.max_num_batched_tokens, config_.prefill_chunk_size), 1 + r.max_drafts);
    const int64_t windowed = (w - 1 + step) / bs + 2;
    worst += std::min(all, r.seats() * std::min(one, windowed));
  }
  return worst;
}

int64_t Scheduler::seats_in_use() const {
  int64_t seats = 0;
  for (const Request* r : running_) seats += r->seats();
  return seats;
}

int64_t Scheduler::tokens_to_compute(const Request& r, const PrefixHit& hit) const {
  // The manager's slots are the positions computed (or being computed in the plan that
  // reserved them); a sequence with no blocks yet will first take its cached prefix.
  KVP_CHECK(kv_.is_current(hit, r.id));  // a stale hit's num_tokens may be wrong
  const SequenceState* s = kv_.sequence(r.id);
  int64_t done = 0;
  if (s != nullptr) done = s->num_slots > 0 ? s->num_slots : hit.num_tokens;
  return static_cast<int64_t>(r.tokens().size()) - done;
}

int64_t Scheduler::tokens_to_compute(const Request& r) const { return tokens_to_compute(r, kv_.find_prefix(r.id)); }

void Scheduler::take_sequence(Request* r) {
  KVP_CHECK(!r->in_kv_);
  KVP_CHECK(kv_.add_sequence(r->id, r->spec.tenant, std::move(r->tokens_)).is_ok());
  r->tokens_.clear();
  r->kv_tokens_ = &kv_.sequence(r->id)->tokens;
  r->in_kv_ = true;
}

void Scheduler::release_sequence(Request* r) {
  KVP_CHECK(r->in_kv_);
  KVP_CHECK(kv_.free(r->id, &r->tokens_).is_ok());
  r->kv_tokens_ = nullptr;
  r->in_kv_ = false;
}

void Scheduler::prepare_sample(const Request& parent, Request* child) {
  KVP_CHECK(!child->in_kv_ && child->kv_tokens_ == nullptr);
  child->tokens_ = parent.tokens();
}

void Scheduler::insert_running(Request* r) {
  r->state_ = RequestState::kRunning;
  auto at = std::lower_bound(running_.begin(), running_.end(), r,
                             [](const Request* a, const Request* b) { return a->id < b->id; });
  running_.insert(at, r);
}

void Scheduler::preempt(Request* victim, ScheduleStats& stats) {
  running_.erase(std::remove(running_.begin(), running_.end(), victim), running_.end());
  ++victim->num_preemptions_;
  ++stats.preemptions;
  if (config_.preemption == PreemptionMode::kSwap && kv_.swap_out(victim->id).is_ok()) {
    ++victim->num_swaps_;
    ++stats.swaps_out;
    victim->state_ = RequestState::kSwapped;
    swapped_.push_back(victim);
    std::sort(swapped_.begin(), swapped_.end(), [](const Request* a, const Request* b) { return a->id < b->id; });
    return;
  }
  // Recompute (or swap fallback when the host pool is full): the cache is dropped and
  // rebuilt; the prefix cache may serve part of it back.
  release_sequence(victim);
  victim->state_ = RequestState::kWaiting;
  waiting_.push_front(victim);
}

std::span<const int32_t> Scheduler::drafts_for(const Request& r, int64_t max_tokens, const PrefixHit& hit) const {
  KVP_CHECK(kv_.is_current(hit, r.id));
  if (drafts_ == nullptr || r.num_drafts_ != 0) return {};
  auto it = drafts_->find(r.id);
  if (it == drafts_->end() || it->second.empty()) return {};
  const SequenceState* s = kv_.sequence(r.id);
  if (s == nullptr || s->swapped || s->num_slots == 0 || tokens_to_compute(r, hit) != 1) return {};
  // Every accepted draft is a generated token, and one more always follows them.
  const int64_t may_generate = r.spec.max_tokens - r.num_generated();
  const int64_t d = std::min({static_cast<int64_t>(it->second.size()), max_tokens - 1, may_generate - 1});
  if (d <= 0) return {};
  return std::span<const int32_t>(it->second).first(static_cast<std::size_t>(d));
}

Scheduler::Planned Scheduler::try_plan(Request* r, int64_t budget, BatchPlan& plan) {
  const PrefixHit hit = kv_.find_prefix(r->id);
  const int64_t max_tokens = std::min<int64_t>(budget, config_.prefill_chunk_size);
  int64_t n = 0;
  // Drafts ride along only when the pool holds the whole verification row; otherwise the
  // request decodes one token. allocate_slots decides the fit before anything changes.
  if (const std::span<const int32_t> drafts = drafts_for(*r, max_tokens, hit); !drafts.empty()) {
    if (allocate(r->id, 1, hit, plan, drafts) == AllocStatus::kOk) {
      r->num_drafts_ = static_cast<int32_t>(drafts.size());
      n = 1 + static_cast<int64_t>(drafts.size());
    }
  }
  if (n == 0) {
    n = std::min(tokens_to_compute(*r, hit), max_tokens);
    if (n <= 0) return {};
    if (const AllocStatus fit = allocate(r->id, n, hit, plan); fit != AllocStatus::kOk) {
      return {.n = 0, .fit = fit};
    }
  }
  const int64_t end = kv_.sequence(r->id)->num_slots;
  const bool at_end = end == static_cast<int64_t>(r->tokens().size());
  add_plan_row(plan, r->id, r->tokens(), end, n, at_end || r->spec.capture_logits,
               r->spec.capture_logits || r->num_drafts_ > 0);
  if (r->time.first_scheduled_step < 0) r->time.first_scheduled_step = plan.step;
  return {.n = n, .fit = AllocStatus::kOk, .prefix_hit_tokens = hit.num_tokens};
}

int64_t Scheduler::schedule_running(Request* r, int64_t budget, BatchPlan& plan, ScheduleStats& stats) {
  if (std::min(tokens_to_compute(*r), budget) <= 0) return 0;
  while (true) {
    const Planned p = try_plan(r, budget, plan);
    if (p.n > 0 || p.fit == AllocStatus::kOk) return p.n;
    KVP_CHECK(p.fit != AllocStatus::kNever);  // admission rejected what could never fit
    Request* victim = running_.back();
    preempt(victim, stats);
    if (victim == r) return 0;
  }
}

ScheduledStep Scheduler::schedule(int64_t step, const DraftTokens& drafts) {
  drafts_ = &drafts;
  ScheduledStep out;
  BatchPlan& plan = out.plan;
  ScheduleStats& stats = out.stats;
  plan.step = step;
  plan.query_start.push_back(0);
  int64_t budget = config_.max_num_batched_tokens;
  if (kv_.config().num_groups() > 1) {
    group_slots_.resize(static_cast<std::size_t>(kv_.config().num_groups()));
    for (std::vector<int64_t>& g : group_slots_) g.clear();
  }

  // 1. Running requests, oldest first. A preemption removes requests from the back, so
  //    iterating by index over a shrinking vector visits each survivor once.
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    budget -= schedule_running(r, budget, plan, stats);
    if (i < running_.size() && running_[i] == r) ++i;
  }

  // 2. Swapped requests come back before anything new is admitted.
  if (stats.preemptions == 0) {
    while (!swapped_.empty() && budget > 0 && seats_in_use() + swapped_.front()->seats() <= config_.max_num_seqs) {
      Request* r = swapped_.front();
      if (!kv_.can_swap_in(r->id)) break;
      KVP_CHECK(kv_.swap_in(r->id).is_ok());
      ++stats.swaps_in;
      swapped_.pop_front();
      insert_running(r);
      budget -= try_plan(r, budget, plan).n;
    }
  }

  // 3. Waiting requests, FCFS.
  if (stats.preemptions == 0 && swapped_.empty()) {
    while (!waiting_.empty() && budget > 0 && seats_in_use() + waiting_.front()->seats() <= config_.max_num_seqs) {
      Request* r = waiting_.front();
      if (config_.admission == AdmissionRule::kConservative) {
        int64_t worst = worst_case_blocks(*r);
        for (const Request* o : running_) worst += worst_case_blocks(*o);
        if (worst > kv_.config().pool.num_device_blocks) break;
      }
      if (!r->in_kv_) take_sequence(r);
      const Planned p = try_plan(r, budget, plan);
      if (p.n == 0) break;  // FCFS: nobody overtakes
      waiting_.pop_front();
      insert_running(r);
      ++stats.admitted;
      stats.prefix_hit_tokens += p.prefix_hit_tokens;
      if (kv_.config().enable_prefix_caching) stats.prefix_lookup_tokens += static_cast<int64_t>(r->tokens().size());
      r->prefix_hit_tokens_ += p.prefix_hit_tokens;
      budget -= p.n;
    }
  }
  finish_plan(kv_, plan, kv_.config().num_groups() > 1 ? std::span(group_slots_) : std::span<std::vector<int64_t>>());
  drafts_ = nullptr;
  return out;
}

void add_plan_row(BatchPlan& plan, SeqId seq, std::span<const int32_t> tokens, int64_t end, int64_t n,
                  bool needs_logits, bool logits_all) {
  plan.seq_ids.push_back(seq);
  for (int64_t p = end - n; p < end; ++p) {
    plan.token_ids.push_back(tokens[static_cast<std::size_t>(p)]);
    plan.positions.push_back(static_cast<int32_t>(p));
  }
  plan.query_start.push_back(static_cast<int32_t>(plan.token_ids.size()));
  plan.context_lens.push_back(static_cast<int32_t>(end));
  plan.needs_logits.push_back(needs_logits ? 1 : 0);
  plan.logits_all.push_back(logits_all ? 1 : 0);
}

void finish_plan(KvCacheManager& kv, BatchPlan& plan, std::span<std::vector<int64_t>> group_slots) {
  const int64_t groups = kv.config().num_groups();
  KVP_CHECK(groups == 1 ? group_slots.empty() : static_cast<int64_t>(group_slots.size()) == groups);
  int32_t max_blocks = 0;
  for (int64_t id : plan.seq_ids)
    max_blocks = std::max(max_blocks, static_cast<int32_t>(kv.sequence(id)->table().size()));
  plan.num_groups = static_cast<int32_t>(groups);
  plan.max_blocks_per_seq = max_blocks;
  plan.block_tables.assign(
      static_cast<std::size_t>(groups) * plan.seq_ids.size() * static_cast<std::size_t>(max_blocks), -1);
  for (int64_t g = 0; g < groups; ++g) {
    for (std::size_t i = 0; i < plan.seq_ids.size(); ++i) {
      const BlockTable& t = kv.sequence(plan.seq_ids[i])->group(g).table;
      const std::size_t row = static_cast<std::size_t>(g) * plan.seq_ids.size() + i;
      std::copy(t.blocks().begin(), t.blocks().end(),
                plan.block_tables.begin() + static_cast<std::ptrdiff_t>(row * static_cast<std::size_t>(max_blocks)));
    }
  }
  if (!group_slots.empty()) {
    plan.slot_mapping.clear();
    for (const std::vector<int64_t>& g : group_slots) {
      KVP_CHECK(static_cast<int64_t>(g.size()) == plan.num_tokens());
      plan.slot_mapping.insert(plan.slot_mapping.end(), g.begin(), g.end());
    }
  }
  plan.ops = kv.take_plan_ops();
}

AllocStatus Scheduler::allocate(SeqId seq, int64_t n, const PrefixHit& hit, BatchPlan& plan,
                                std::span<const int32_t> drafts) {
  if (kv_.config().num_groups() == 1) return kv_.allocate_slots(seq, n, hit, plan.slot_mapping, drafts);
  return kv_.allocate_slots(seq, n, hit, std::span(group_slots_), drafts);
}

void Scheduler::apply(const BatchPlan& plan, const StepUpdate& update) {
  for (const StepUpdate::Verification& v : update.verifications) {
    Request* r = v.request;
    KVP_CHECK(r->num_drafts_ > 0 && v.num_accepted >= 0 && v.num_accepted <= r->num_drafts_);
    const auto keep = static_cast<int64_t>(r->tokens().size()) - (r->num_drafts_ - v.num_accepted);
    KVP_CHECK(kv_.sequence(r->id)->num_final <= keep);  // a draft is never final before it is accepted
    KVP_CHECK(kv_.truncate(r->id, keep).is_ok());
    r->num_drafts_ = 0;
  }
  for (const Request* r : running_) KVP_CHECK(r->num_drafts_ == 0);  // every verification resolved
  for (int64_t i = 0; i < plan.num_seqs(); ++i) {
    const auto ui = static_cast<std::size_t>(i);
    const int64_t accepted_end = std::min<int64_t>(plan.context_lens[ui], kv_.sequence(plan.seq_ids[ui])->num_slots);
    KVP_CHECK(kv_.mark_final(plan.seq_ids[ui], accepted_end).is_ok());
  }
  for (const StepUpdate::Fork& f : update.forks) {
    KVP_CHECK(f.parent->state_ == RequestState::kRunning);
    for (Request* c : f.children) {
      KVP_CHECK(!c->in_kv_ && c->tokens_ == f.parent->tokens());  // prepare_sample's copy
      KVP_CHECK(kv_.fork(f.parent->id, c->id).is_ok());
      c->tokens_.clear();
      c->kv_tokens_ = &kv_.sequence(c->id)->tokens;
      c->in_kv_ = true;
      insert_running(c);
    }
  }
  for (const StepUpdate::Token& t : update.tokens) {
    Request* r = t.request;
    KVP_CHECK(kv_.append_tokens(r->id, std::span<const int32_t>(&t.token, 1)).is_ok());
    if (t.finish != FinishReason::kNone) finish(r, t.finish);
  }
}

}  // namespace kvp
