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
  r->state = RequestState::kWaiting;
  waiting_.push_back(r);
}

void Scheduler::finish(Request* r, FinishReason reason) {
  KVP_CHECK(!r->finished());
  auto drop = [r](auto& queue) { queue.erase(std::remove(queue.begin(), queue.end(), r), queue.end()); };
  drop(waiting_);
  drop(running_);
  drop(swapped_);
  if (r->in_kv) {
    KVP_CHECK(kv_.free(r->id).is_ok());
    r->in_kv = false;
  }
  r->state = RequestState::kFinished;
  r->finish = reason;
}

int64_t Scheduler::worst_case_blocks(const Request& r) const {
  const int64_t bs = kv_.block_size();
  const int64_t one = kernels::blocks_for_tokens(r.num_prompt() + r.spec.max_tokens, bs);
  if (r.seats() == 1) return one;
  const int64_t shared = r.num_prompt() / bs;  // full prompt blocks, shared by every sample
  return shared + r.seats() * (one - shared);
}

int64_t Scheduler::seats_in_use() const {
  int64_t seats = 0;
  for (const Request* r : running_) seats += r->seats();
  return seats;
}

int64_t Scheduler::tokens_to_compute(const Request& r) const {
  // The manager's slots are the positions computed (or being computed in the plan that
  // reserved them): only a sequence in the manager has any.
  const SequenceState* s = kv_.sequence(r.id);
  return static_cast<int64_t>(r.tokens.size()) - (s != nullptr ? s->num_slots : 0);
}

void Scheduler::insert_running(Request* r) {
  r->state = RequestState::kRunning;
  auto at = std::lower_bound(running_.begin(), running_.end(), r,
                             [](const Request* a, const Request* b) { return a->id < b->id; });
  running_.insert(at, r);
}

void Scheduler::preempt(Request* victim, ScheduleStats& stats) {
  running_.erase(std::remove(running_.begin(), running_.end(), victim), running_.end());
  ++victim->num_preemptions;
  ++stats.preemptions;
  if (config_.preemption == PreemptionMode::kSwap && kv_.swap_out(victim->id).is_ok()) {
    ++victim->num_swaps;
    ++stats.swaps_out;
    victim->state = RequestState::kSwapped;
    swapped_.push_back(victim);
    std::sort(swapped_.begin(), swapped_.end(), [](const Request* a, const Request* b) { return a->id < b->id; });
    return;
  }
  // Recompute (or swap fallback when the host pool is full): the cache is dropped and
  // rebuilt; the prefix cache may serve part of it back.
  KVP_CHECK(kv_.free(victim->id).is_ok());
  victim->in_kv = false;
  victim->state = RequestState::kWaiting;
  waiting_.push_front(victim);
}

void Scheduler::add_to_plan(Request* r, int64_t n, const std::vector<int64_t>& slots, BatchPlan& plan) {
  const SequenceState* s = kv_.sequence(r->id);
  const int64_t end = s->num_slots;
  const int64_t start = end - n;
  plan.seq_ids.push_back(r->id);
  for (int64_t p = start; p < end; ++p) {
    plan.token_ids.push_back(r->tokens[static_cast<std::size_t>(p)]);
    plan.positions.push_back(static_cast<int32_t>(p));
  }
  plan.slot_mapping.insert(plan.slot_mapping.end(), slots.begin(), slots.end());
  plan.query_start.push_back(static_cast<int32_t>(plan.token_ids.size()));
  plan.context_lens.push_back(static_cast<int32_t>(end));
  const bool at_end = end == static_cast<int64_t>(r->tokens.size());
  plan.needs_logits.push_back(at_end || r->spec.capture_logits ? 1 : 0);
  plan.logits_all.push_back(r->spec.capture_logits ? 1 : 0);
  if (r->time.first_scheduled_step < 0) r->time.first_scheduled_step = plan.step;
}

int64_t Scheduler::schedule_running(Request* r, int64_t budget, BatchPlan& plan, ScheduleStats& stats) {
  const int64_t n = std::min({tokens_to_compute(*r), budget, static_cast<int64_t>(config_.prefill_chunk_size)});
  if (n <= 0) return 0;
  while (true) {
    const AllocStatus st = kv_.can_allocate(r->id, n);
    if (st == AllocStatus::kOk) break;
    KVP_CHECK(st != AllocStatus::kNever);  // admission rejected what could never fit
    Request* victim = running_.back();
    preempt(victim, stats);
    if (victim == r) return 0;
  }
  std::vector<int64_t> slots;
  KVP_CHECK(kv_.allocate_slots(r->id, n, slots).is_ok());
  add_to_plan(r, n, slots, plan);
  return n;
}

ScheduleStats Scheduler::schedule(BatchPlan& plan) {
  const int64_t step = plan.step;
  plan = BatchPlan{};
  plan.step = step;
  plan.query_start.push_back(0);
  ScheduleStats stats;
  int64_t budget = config_.max_num_batched_tokens;

  // 1. Running requests, oldest first. A preemption removes requests from the back, so
  //    iterating by index over a shrinking vector visits each survivor once.
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    const int64_t n = schedule_running(r, budget, plan, stats);
    budget -= n;
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
      const int64_t n = std::min({tokens_to_compute(*r), budget, static_cast<int64_t>(config_.prefill_chunk_size)});
      if (n > 0 && kv_.can_allocate(r->id, n) == AllocStatus::kOk) {
        std::vector<int64_t> slots;
        KVP_CHECK(kv_.allocate_slots(r->id, n, slots).is_ok());
        add_to_plan(r, n, slots, plan);
        budget -= n;
      }
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
      if (!r->in_kv) {
        KVP_CHECK(kv_.add_sequence(r->id, r->spec.tenant, r->tokens).is_ok());
        r->in_kv = true;
      }
      const int64_t cached = kv_.cached_prefix_tokens(r->id);
      const int64_t n = std::min({static_cast<int64_t>(r->tokens.size()) - cached, budget,
                                  static_cast<int64_t>(config_.prefill_chunk_size)});
      if (kv_.can_allocate(r->id, n) != AllocStatus::kOk) break;  // FCFS: nobody overtakes
      std::vector<int64_t> slots;
      KVP_CHECK(kv_.allocate_slots(r->id, n, slots).is_ok());
      waiting_.pop_front();
      insert_running(r);
      ++stats.admitted;
      stats.prefix_hit_tokens += cached;
      if (kv_.config().enable_prefix_caching) stats.prefix_lookup_tokens += static_cast<int64_t>(r->tokens.size());
      r->prefix_hit_tokens += cached;
      add_to_plan(r, n, slots, plan);
      budget -= n;
    }
  }

  // The plan's block tables, padded to the longest.
  int32_t max_blocks = 0;
  for (int64_t id : plan.seq_ids)
    max_blocks = std::max(max_blocks, static_cast<int32_t>(kv_.sequence(id)->table.size()));
  plan.max_blocks_per_seq = max_blocks;
  plan.block_tables.assign(plan.seq_ids.size() * static_cast<std::size_t>(max_blocks), -1);
  for (std::size_t i = 0; i < plan.seq_ids.size(); ++i) {
    const BlockTable& t = kv_.sequence(plan.seq_ids[i])->table;
    for (int64_t j = 0; j < t.size(); ++j)
      plan.block_tables[i * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(j)] = t[j];
  }
  plan.ops = kv_.take_plan_ops();
  return stats;
}

}  // namespace kvp
