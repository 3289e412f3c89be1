#include "optimized/engine/engine.h"

#include <algorithm>

#include "kernels/kv_index.h"

namespace kvp {

namespace {
constexpr int32_t kMaxSpeculativeTokens = 64;
}  // namespace

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kRejected: return "rejected";
  }
  return "?";
}

Status validate(const EngineConfig& c) {
  KVP_RETURN_IF_ERROR(validate(c.kv).with_context("kv cache"));
  KVP_RETURN_IF_ERROR(validate(c.scheduler).with_context("scheduler"));
  if (c.vocab_size <= 0) return Status::error("vocab_size must be > 0");
  if (c.speculation.k < 0 || c.speculation.k > kMaxSpeculativeTokens)
    return Status::error("speculation k must be in [0, " + std::to_string(kMaxSpeculativeTokens) + "]");
  if (c.ngram_min < 1 || c.ngram_max < c.ngram_min) return Status::error("need 1 <= ngram_min <= ngram_max");
  return Status::ok();
}

Status check_compatible(const EngineConfig& c, const Backend& backend) {
  KVP_RETURN_IF_ERROR(validate(c));
  if (!(backend.pool_shape() == c.kv.pool))
    return Status::error(std::string("backend '") + backend.name() + "' has pool (" + backend.pool_shape().to_string() +
                         ") but the KV-cache manager's is (" + c.kv.pool.to_string() + ")");
  return Status::ok();
}

Engine::Engine(const EngineConfig& config, Backend& backend)
    : config_(config),
      backend_(backend),
      kv_(config.kv),
      scheduler_(config.scheduler, kv_),
      ngram_(std::max(1, config.ngram_max), std::max(1, std::min(config.ngram_min, config.ngram_max))) {
  KVP_CHECK(check_compatible(config, backend).is_ok());
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config, Backend& backend) {
  KVP_RETURN_IF_ERROR(check_compatible(config, backend));
  return std::make_unique<Engine>(config, backend);
}

double Engine::now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

RequestId Engine::add_request(RequestSpec spec) {
  const RequestId id = next_id_++;
  auto owned = std::make_unique<Request>(id, std::move(spec));
  Request& r = *owned;
  requests_.emplace(id, std::move(owned));
  r.time.arrival_step = step_;
  r.time.arrival_s = now();

  const int64_t prompt = r.num_prompt();
  if (prompt == 0) {
    reject(r, "empty prompt");
    return id;
  }
  for (std::size_t i = 0; i < r.spec.prompt.size(); ++i) {
    if (r.spec.prompt[i] < 0 || r.spec.prompt[i] >= config_.vocab_size) {
      reject(r, "prompt token " + std::to_string(r.spec.prompt[i]) + " at index " + std::to_string(i) +
                    " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")");
      return id;
    }
  }
  if (r.spec.max_tokens < 1) {
    reject(r, "max_tokens must be >= 1");
    return id;
  }
  if (r.spec.n < 1 || r.spec.n > config_.scheduler.max_num_seqs) {
    reject(r, "n (parallel samples) must be in [1, max_num_seqs = " + std::to_string(config_.scheduler.max_num_seqs) +
                  "], got " + std::to_string(r.spec.n));
    return id;
  }
  if (Status s = r.spec.sampling.validate(); !s) {
    reject(r, s.message());
    return id;
  }
  for (int32_t t : r.spec.forced_tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      reject(r, "forced token " + std::to_string(t) + " is outside the vocabulary");
      return id;
    }
  }
  if (r.spec.speculation) {
    const SpeculationParams& sp = *r.spec.speculation;
    if (sp.k < 0 || sp.k > kMaxSpeculativeTokens) {
      reject(r, "speculation k must be in [0, " + std::to_string(kMaxSpeculativeTokens) + "], got " +
                    std::to_string(sp.k));
      return id;
    }
  }
  if (speculation_of(r).enabled() && speculation_of(r).proposer == ProposerKind::kDraft && draft_ == nullptr) {
    reject(r, "speculation with a draft model, but the engine has no draft model");
    return id;
  }
  if (prompt + r.spec.max_tokens > config_.scheduler.max_model_len) {
    reject(r, "prompt (" + std::to_string(prompt) + ") + max_tokens (" + std::to_string(r.spec.max_tokens) +
                  ") exceeds max_model_len " + std::to_string(config_.scheduler.max_model_len));
    return id;
  }
  r.max_drafts = speculation_of(r).enabled() ? speculation_of(r).k : 0;
  const int64_t usable = config_.kv.pool.num_device_blocks - config_.kv.watermark_blocks;
  if (scheduler_.worst_case_blocks(r) > usable) {
    reject(r, "needs " + std::to_string(scheduler_.worst_case_blocks(r)) + " blocks at its longest, the pool has " +
                  std::to_string(usable) + " usable (after the watermark)");
    return id;
  }
  counters_.prompt_tokens += prompt;
  scheduler_.add(&r);
  return id;
}

void Engine::set_draft_proposer(std::unique_ptr<Proposer> proposer) {
  KVP_CHECK(step_ == 0);
  draft_ = std::move(proposer);
}

SpeculationParams Engine::speculation_of(const Request& r) const {
  return r.spec.speculation ? *r.spec.speculation : config_.speculation;
}

DraftTokens Engine::propose() {
  DraftTokens drafts;
  std::vector<ProposalRequest> ngram_asks, draft_asks;
  for (const Request* r : scheduler_.running()) {
    const SpeculationParams sp = speculation_of(*r);
    if (!sp.enabled()) continue;
    // Decoding: the prompt computed, a first token generated (forks made), forced tokens
    // used up, and room for at least one draft before the length limit.
    const int64_t generated = r->num_generated();
    if (generated < 1 || generated < static_cast<int64_t>(r->spec.forced_tokens.size())) continue;
    if (scheduler_.tokens_to_compute(*r) != 1) continue;
    const int64_t k = std::min<int64_t>(sp.k, r->spec.max_tokens - generated - 1);
    if (k <= 0) continue;
    ProposalRequest ask{r->id, r->tokens(), static_cast<int32_t>(k), r->spec.sampling};
    (sp.proposer == ProposerKind::kDraft ? draft_asks : ngram_asks).push_back(ask);
  }
  draft_probs_.clear();
  std::vector<Proposal> proposals;
  if (!ngram_asks.empty() && ngram_.propose(ngram_asks, proposals).is_ok()) {
    for (std::size_t i = 0; i < ngram_asks.size(); ++i)
      if (!proposals[i].tokens.empty()) drafts[ngram_asks[i].id] = std::move(proposals[i].tokens);
  }
  // The draft model also runs with nothing to propose, so it drops the sequences of
  // requests that left (its rollback in step with the target's).
  if (draft_ != nullptr && draft_->propose(draft_asks, proposals).is_ok()) {
    for (std::size_t i = 0; i < draft_asks.size(); ++i) {
      if (proposals[i].tokens.empty()) continue;
      drafts[draft_asks[i].id] = std::move(proposals[i].tokens);
      if (!proposals[i].draft_probs.empty()) draft_probs_[draft_asks[i].id] = std::move(proposals[i].draft_probs);
    }
  }
  return drafts;
}

void Engine::reject(Request& r, std::string reason) {
  scheduler_.reject(&r, std::move(reason));
  r.time.finish_step = step_;
  r.time.finish_s = now();
  ++counters_.rejections;
}

void Engine::cancel(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->finished() || it->second->cancel_requested) return;
  Request& r = *it->second;
  r.cancel_requested = true;
  r.cancel_step = step_;
  for (RequestId c : r.children) cancel(c);
}

void Engine::finish(Request& r, FinishReason reason) {
  scheduler_.finish(&r, reason);
  record_finish(r);
}

void Engine::record_finish(Request& r) {
  r.time.finish_step = step_;
  r.time.finish_s = now();
  if (r.finish() == FinishReason::kCancelled) ++counters_.cancellations;
}

bool Engine::release_logits(RequestId id) { return take_logits(id).has_value(); }

std::optional<std::vector<std::vector<float>>> Engine::take_logits(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second->finished()) return std::nullopt;
  std::vector<std::vector<float>>& rows = it->second->logits;
  std::vector<std::vector<float>> taken(rows.size());
  for (std::size_t p = 0; p < rows.size(); ++p) taken[p].swap(rows[p]);
  return taken;
}

std::vector<std::pair<int64_t, std::vector<float>>> Engine::take_captured_logits(RequestId id) {
  std::vector<std::pair<int64_t, std::vector<float>>> taken;
  auto it = requests_.find(id);
  if (it == requests_.end()) return taken;
  std::vector<std::vector<float>>& rows = it->second->logits;
  for (std::size_t p = 0; p < rows.size(); ++p) {
    if (rows[p].empty()) continue;
    taken.emplace_back(static_cast<int64_t>(p), std::vector<float>());
    taken.back().second.swap(rows[p]);
  }
  return taken;
}

bool Engine::forget(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second->finished()) return false;
  for (RequestId c : it->second->children)
    if (requests_.count(c) != 0) return false;
  requests_.erase(it);
  return true;
}

bool Engine::has_unfinished() const { return !scheduler_.idle(); }

Status Engine::flush_prefix_cache_when_idle() {
  if (has_unfinished())
    return Status::error(
        "flush_prefix_cache_when_idle: " +
        std::to_string(scheduler_.num_waiting() + scheduler_.num_running() + scheduler_.num_swapped()) +
        " sequences are waiting, running or swapped");
  kv_.flush_prefix_cache();
  return Status::ok();
}

Status Engine::step() {
  for (auto& [id, r] : requests_) {
    if (!r->cancel_requested || r->finished()) continue;
    const SequenceState* s = kv_.sequence(id);
    switch (r->state()) {
      case RequestState::kWaiting: r->cancelled_in = "waiting"; break;
      case RequestState::kSwapped: r->cancelled_in = "swapped"; break;
      default: r->cancelled_in = s != nullptr && s->num_slots < r->num_prompt() ? "prefill" : "running";
    }
    finish(*r, FinishReason::kCancelled);
  }

  const DraftTokens drafts = propose();
  ScheduledStep scheduled = scheduler_.schedule(step_, drafts);
  BatchPlan& plan = scheduled.plan;
  const ScheduleStats& stats = scheduled.stats;
  const double scheduled_at = now();
  for (int64_t id : plan.seq_ids) {
    Request& r = *requests_.at(id);
    if (r.time.first_scheduled_s < 0) r.time.first_scheduled_s = scheduled_at;
  }
  counters_.preemptions += stats.preemptions;
  counters_.swaps_out += stats.swaps_out;
  counters_.swaps_in += stats.swaps_in;
  counters_.prefix_hit_tokens += stats.prefix_hit_tokens;
  counters_.prefix_lookup_tokens += stats.prefix_lookup_tokens;
  counters_.copy_on_writes += static_cast<int64_t>(plan.ops.block_copies.size());
  counters_.poisoned_blocks += static_cast<int64_t>(plan.ops.poison.size());
  counters_.scheduled_tokens += plan.num_tokens();

  if (config_.audit_reads && !config_.kv.global_prefix_sharing) fill_audit_arrays(plan);
  if (plan_observer_) KVP_RETURN_IF_ERROR(plan_observer_(*this, plan));
  if (!plan.empty()) {
    StepOutput out;
    const int64_t replays = backend_.graph_replays();
    KVP_RETURN_IF_ERROR(backend_.execute(plan, out).with_context("step " + std::to_string(step_)));
    counters_.graph_steps += backend_.graph_replays() - replays;
    process_outputs(plan, out);
  }
  if (draft_ != nullptr && scheduler_.idle()) {
    std::vector<Proposal> none;
    (void)draft_->propose({}, none);  // nothing left to draft for: the draft model's pool empties
  }

  int64_t used = 0, allocated = 0;
  for (const auto& [id, s] : kv_.sequences()) {
    if (s.swapped) continue;
    for (const GroupTable& gt : s.groups) {
      used += s.num_slots - gt.num_window_released * kv_.block_size();             // released positions hold nothing
      allocated += (gt.table.size() - gt.num_window_released) * kv_.block_size();  // the released entries hold none
    }
  }
  counters_.kv_used_slots_sum += static_cast<double>(used);
  counters_.kv_allocated_slots_sum += static_cast<double>(allocated);
  const BlockAllocator& dev = kv_.device_allocator();
  const double occupancy = static_cast<double>(dev.num_in_use()) / dev.num_blocks();
  counters_.pool_occupancy_sum += occupancy;
  counters_.peak_pool_occupancy = std::max(counters_.peak_pool_occupancy, occupancy);
  ++counters_.steps;
  counters_.elapsed_s = now();

  Status observed = observer_ ? observer_(*this, plan) : Status::ok();
  ++step_;
  return observed;
}

void Engine::process_outputs(const BatchPlan& plan, const StepOutput& out) {
  StepUpdate update;
  for (int64_t i = 0; i < plan.num_seqs(); ++i) {
    const auto ui = static_cast<std::size_t>(i);
    Request& r = *requests_.at(plan.seq_ids[ui]);
    const int64_t n = plan.query_start[ui + 1] - plan.query_start[ui];
    const int64_t end = plan.context_lens[ui];
    if (end - n < r.num_prompt()) counters_.prefill_tokens += std::min(end, r.num_prompt()) - (end - n);
    counters_.decode_tokens += std::max<int64_t>(0, end - std::max(end - n, r.num_prompt()));

    const int32_t rows = logit_rows_for(plan, i);
    if (rows == 0) continue;
    const int32_t row0 = out.logit_row_start[ui];
    if (r.num_drafts() > 0) {
      verify_drafts(r, out, row0, update);
      continue;
    }
    capture_logits(r, out, row0, end - rows, rows);
    if (end != static_cast<int64_t>(r.tokens().size())) continue;  // a prefill chunk, not the last

    const float* last = out.row(row0 + rows - 1);
    const std::span<const float> logits(last, static_cast<std::size_t>(out.vocab_size));
    std::vector<Request*> samplers = {&r};
    if (r.spec.n > 1 && !r.forked && r.num_generated() == 0) {
      StepUpdate::Fork fork{&r, make_samples(r)};
      samplers.insert(samplers.end(), fork.children.begin(), fork.children.end());
      update.forks.push_back(std::move(fork));
    }
    for (Request* s : samplers) update.tokens.push_back(next_token(*s, logits));
    ++counters_.target_forwards;
  }
  scheduler_.apply(plan, update);
  for (const StepUpdate::Token& t : update.tokens)
    if (t.finish != FinishReason::kNone) record_finish(*t.request);
}

void Engine::verify_drafts(Request& r, const StepOutput& out, int32_t row0, StepUpdate& update) {
  const int32_t k = r.num_drafts();
  const int64_t accepted_len = static_cast<int64_t>(r.tokens().size()) - k;  // tokens before the drafts
  const std::span<const int32_t> drafts(r.tokens().data() + accepted_len, static_cast<std::size_t>(k));
  const VerifyRows rows{out.row(row0), out.vocab_size, k + 1};
  AcceptResult a;
  if (r.spec.sampling.greedy()) {
    a = accept_greedy(drafts, rows);
  } else {
    auto probs = draft_probs_.find(r.id);
    const std::span<const std::vector<double>> q = probs == draft_probs_.end()
                                                       ? std::span<const std::vector<double>>()
                                                       : std::span<const std::vector<double>>(probs->second);
    a = accept_sampled(drafts, q.subspan(0, q.empty() ? 0 : static_cast<std::size_t>(k)), rows, r.spec.sampling, r.rng,
                       config_.acceptance_rule);
  }
  // The emitted tokens: the accepted drafts, then the target's token; the first that stops
  // the request (stop token or length) is the last.
  const int64_t generated = accepted_len - r.num_prompt();
  int32_t keep = a.num_accepted;
  int32_t token = a.next_token;
  FinishReason finish = FinishReason::kNone;
  for (int32_t j = 0; j <= a.num_accepted; ++j) {
    const int32_t t = j < a.num_accepted ? drafts[static_cast<std::size_t>(j)] : a.next_token;
    finish = finish_after(r, t, generated + j + 1);
    if (finish != FinishReason::kNone) {
      keep = j;  // the finishing token goes through the token path, as in plain decoding
      token = t;
      break;
    }
  }
  // Logits of rows 0..keep are conditioned on accepted tokens only; later rows saw a
  // rejected draft and are dropped.
  capture_logits(r, out, row0, accepted_len - 1, keep + 1);
  ++r.spec_steps;
  r.spec_proposed += k;
  r.spec_accepted += keep;
  ++counters_.spec_steps;
  counters_.spec_proposed += k;
  counters_.spec_accepted += keep;
  ++counters_.target_forwards;
  counters_.generated_tokens += keep + 1;
  update.verifications.push_back({&r, keep});
  update.tokens.push_back({&r, token, finish});
}

std::vector<Request*> Engine::make_samples(Request& r) {
  std::vector<Request*> samples;
  for (int32_t k = 1; k < r.spec.n; ++k) {
    RequestSpec spec = r.spec;
    spec.n = 1;
    spec.sampling.seed = r.spec.sampling.seed + static_cast<uint64_t>(k);
    auto owned = std::make_unique<Request>(next_id_++, std::move(spec));
    Request& c = *owned;
    scheduler_.prepare_sample(r, &c);
    c.logits = r.logits;
    c.time = r.time;
    c.parent = r.id;
    r.children.push_back(c.id);
    samples.push_back(owned.get());
    requests_.emplace(c.id, std::move(owned));
  }
  r.forked = true;
  return samples;
}

StepUpdate::Token Engine::next_token(Request& r, std::span<const float> logits) {
  const int64_t k = r.num_generated();
  int32_t token;
  if (k < static_cast<int64_t>(r.spec.forced_tokens.size())) {
    token = r.spec.forced_tokens[static_cast<std::size_t>(k)];
  } else {
    token = sample_token(logits, r.spec.sampling, r.rng);
  }
  ++counters_.generated_tokens;
  if (r.time.first_token_step < 0) {
    r.time.first_token_step = step_;
    r.time.first_token_s = now();
  }
  return {&r, token, finish_after(r, token, k + 1)};
}

FinishReason Engine::finish_after(const Request& r, int32_t token, int64_t num_generated) {
  if (r.spec.is_stop(token)) return FinishReason::kStop;
  if (num_generated >= r.spec.max_tokens) return FinishReason::kLength;
  return FinishReason::kNone;
}

void Engine::capture_logits(Request& r, const StepOutput& out, int32_t row0, int64_t first_pos, int32_t rows) {
  if (!r.spec.capture_logits) return;
  for (int32_t k = 0; k < rows; ++k) {
    const int64_t pos = first_pos + k;
    std::vector<float> row(out.row(row0 + k), out.row(row0 + k) + out.vocab_size);
    if (static_cast<int64_t>(r.logits.size()) <= pos) r.logits.resize(static_cast<std::size_t>(pos) + 1);
    std::vector<float>& slot = r.logits[static_cast<std::size_t>(pos)];
    if (!slot.empty() && slot != row) ++r.recomputed_logit_mismatches;
    slot = std::move(row);
  }
}

void Engine::fill_audit_arrays(BatchPlan& plan) const {
  plan.block_tenants.assign(static_cast<std::size_t>(config_.kv.pool.num_device_blocks), -1);
  for (const auto& [id, s] : kv_.sequences()) {
    if (s.swapped) continue;
    for (const GroupTable& gt : s.groups) {
      for (int32_t b : gt.table.blocks()) {
        if (b == kNoBlock) continue;  // released by the sliding window
        int64_t& t = plan.block_tenants[static_cast<std::size_t>(b)];
        // A block held across tenants (an I4 violation the checkers report) is marked -2,
        // which no reader's tenant matches.
        t = (t == -1 || t == s.tenant) ? s.tenant : -2;
      }
    }
  }
  plan.seq_tenants.clear();
  for (int64_t id : plan.seq_ids) plan.seq_tenants.push_back(requests_.at(id)->spec.tenant);
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  m.counters = counters_;
  std::vector<double> ttft, tpot, e2e, queue, ttft_s, tpot_s, e2e_s, queue_s;
  for (const auto& [id, r] : requests_) {
    const RequestTimeline& t = r->time;
    if (r->finish() != FinishReason::kStop && r->finish() != FinishReason::kLength) continue;
    ttft.push_back(static_cast<double>(t.first_token_step - t.arrival_step + 1));
    e2e.push_back(static_cast<double>(t.finish_step - t.arrival_step + 1));
    queue.push_back(static_cast<double>(t.first_scheduled_step - t.arrival_step));
    ttft_s.push_back(t.first_token_s - t.arrival_s);
    e2e_s.push_back(t.finish_s - t.arrival_s);
    queue_s.push_back(t.first_scheduled_s - t.arrival_s);
    if (r->num_generated() > 1) {
      tpot.push_back(static_cast<double>(t.finish_step - t.first_token_step) /
                     static_cast<double>(r->num_generated() - 1));
      tpot_s.push_back((t.finish_s - t.first_token_s) / static_cast<double>(r->num_generated() - 1));
    }
  }
  m.ttft_steps = percentiles(ttft);
  m.tpot_steps = percentiles(tpot);
  m.e2e_steps = percentiles(e2e);
  m.queue_steps = percentiles(queue);
  m.ttft_s = percentiles(ttft_s);
  m.tpot_s = percentiles(tpot_s);
  m.e2e_s = percentiles(e2e_s);
  m.queue_s = percentiles(queue_s);
  m.tokens_per_s = counters_.elapsed_s > 0 ? static_cast<double>(counters_.scheduled_tokens) / counters_.elapsed_s : 0;
  m.kv_utilization =
      counters_.kv_allocated_slots_sum > 0 ? counters_.kv_used_slots_sum / counters_.kv_allocated_slots_sum : 0;
  m.internal_fragmentation = counters_.kv_allocated_slots_sum > 0 ? 1.0 - m.kv_utilization : 0;
  m.mean_pool_occupancy = counters_.steps > 0 ? counters_.pool_occupancy_sum / static_cast<double>(counters_.steps) : 0;
  m.prefix_hit_rate = counters_.prefix_lookup_tokens > 0 ? static_cast<double>(counters_.prefix_hit_tokens) /
                                                               static_cast<double>(counters_.prefix_lookup_tokens)
                                                         : 0;
  const auto ratio = [](int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
  m.acceptance_rate = ratio(counters_.spec_accepted, counters_.spec_proposed);
  m.mean_accepted_length = ratio(counters_.spec_accepted, counters_.spec_steps);
  m.forwards_per_token = ratio(counters_.target_forwards, counters_.generated_tokens);
  return m;
}

}  // namespace kvp
