#include "simulate/simulate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <unordered_map>

#include "common/rng.h"
#include "kernels/kv_index.h"
#include "optimized/backends/cost_model_backend.h"
#include "optimized/checkers/engine_invariants.h"
#include "optimized/checkers/invariants.h"
#include "optimized/engine/engine.h"
#include "simulate/contiguous_allocator.h"

namespace kvp::sim {

namespace {

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

struct Outcome {
  double first_scheduled = -1, first_token = -1, finish = -1;
  bool rejected = false;
};

// A request in the engine.
struct Live {
  std::size_t index = 0;                 // into the traffic
  int64_t final_len = 0;                 // prompt + output
  int64_t res_offset = -1, res_len = 0;  // contiguous reservation
  bool sample = false;                   // a parallel sample (n > 1) of the traffic's request
};

// A request the contiguous allocator has not admitted yet (a restart carries its tokens).
struct Pending {
  std::size_t index = 0;
  std::vector<int32_t> tokens;  // empty: the original prompt
  int64_t max_tokens = 0;
};

class Driver {
 public:
  Driver(const SimOptions& o, const Traffic& t, const CostModelConfig& cost) : o_(o), t_(t), cost_(cost) {}

  Result<SimReport> run();

 private:
  bool contiguous() const { return o_.policy != AllocationPolicy::kPaged; }
  std::vector<int32_t> prompt_for(std::size_t i) const;
  void hand(std::size_t i, std::vector<int32_t> prompt, int64_t max_tokens, int64_t res_offset, int64_t res_len);
  int64_t reservation_for(int64_t len, int64_t final_len) const;
  void hand_pending();
  void grow_reservations();
  void preempt_restart(RequestId id);
  void after_step(double t0);
  // Records a memory and queue sample; with check, first recounts it (the error names the run,
  // the sample and the time).
  Status sample(double now);
  MemorySlots paged_sample();
  MemorySlots contiguous_sample();
  Status check_sample(const MemorySlots& m, double now) const;
  std::string run_name() const;
  // The phases of run(): the pool sized from the cost model, the engine on the cost-model
  // backend, the report's description of the run, the event loop, the results.
  struct Pool {
    int64_t block_size = 0, device_blocks = 0, host_blocks = 0;
  };
  Result<Pool> size_pool();
  Result<EngineConfig> build_engine(const Pool& pool);
  void describe_run(const EngineConfig& ec, const Pool& pool);
  Status drive();
  void summarize_requests();
  void summarize_memory();

  const SimOptions& o_;
  const Traffic& t_;
  CostModelConfig cost_;
  int64_t max_model_len_ = 0;
  int64_t capacity_ = 0;  // KV slots (with KV-cache groups: slots of group blocks)
  KvGroupLayout layout_;  // the KV-cache groups (one group of every layer: one table)
  std::unique_ptr<CostModelBackend> backend_;
  std::unique_ptr<Engine> engine_;
  int64_t checked_steps_ = 0;  // steps whose every invariant checker passed (--check)
  ProgressWatch progress_;     // S1: the run fails once it stops making progress (check_progress)
  std::unique_ptr<ContiguousAllocator> alloc_;
  std::vector<Outcome> outcomes_;
  std::unordered_map<RequestId, Live> live_;
  std::vector<RequestId> active_;  // in the engine, oldest first
  std::vector<RequestId> to_forget_;
  std::deque<Pending> pending_;
  int64_t ended_ = 0;
  int64_t contiguous_preemptions_ = 0;
  // Memory samples (slots).
  MemorySlots sum_memory_;
  double sum_running_ = 0;
  int64_t samples_ = 0;
  std::vector<int32_t> block_fill_, block_will_fill_;  // per device block, zero between samples
  std::vector<int32_t> touched_;
  SimReport rep_;
};

std::vector<int32_t> Driver::prompt_for(std::size_t i) const {
  const TrafficRequest& tr = t_.requests[i];
  std::vector<int32_t> p(static_cast<std::size_t>(tr.prompt_tokens));
  const auto vocab = static_cast<uint64_t>(cost_.model.vocab_size - 1);
  const auto shared = static_cast<std::size_t>(std::min(tr.shared_prefix_tokens, tr.prompt_tokens));
  Rng system(mix_seed(o_.seed, 0x5e5700000000ull + static_cast<uint64_t>(tr.tenant)));
  for (std::size_t k = 0; k < shared; ++k) p[k] = 1 + static_cast<int32_t>(system.below(vocab));
  Rng own(mix_seed(o_.seed, static_cast<uint64_t>(i)));
  for (std::size_t k = shared; k < p.size(); ++k) p[k] = 1 + static_cast<int32_t>(own.below(vocab));
  return p;
}

void Driver::hand(std::size_t i, std::vector<int32_t> prompt, int64_t max_tokens, int64_t res_offset, int64_t res_len) {
  const TrafficRequest& tr = t_.requests[i];
  RequestSpec spec;
  spec.prompt = std::move(prompt);
  spec.max_tokens = max_tokens;
  spec.tenant = tr.tenant;
  spec.n = o_.n;
  const RequestId id = engine_->add_request(std::move(spec));
  if (engine_->request(id).finished()) {  // rejected: it could never run
    Outcome& out = outcomes_[i];
    out.rejected = true;
    out.finish = backend_->clock_s();
    ++ended_;
    ++rep_.rejected;
    if (res_len > 0) alloc_->free(res_offset, res_len);
    engine_->forget(id);
    return;
  }
  live_[id] = Live{i, tr.prompt_tokens + tr.output_tokens, res_offset, res_len};
  active_.push_back(id);
}

int64_t Driver::reservation_for(int64_t len, int64_t final_len) const {
  switch (o_.policy) {
    case AllocationPolicy::kContiguousMax: return max_model_len_;
    case AllocationPolicy::kContiguousOracle: return final_len;
    case AllocationPolicy::kContiguousPow2: return std::max(len, std::min(next_pow2(len), max_model_len_));
    case AllocationPolicy::kPaged: break;
  }
  return 0;
}

void Driver::hand_pending() {
  while (!pending_.empty()) {
    if (engine_->scheduler().num_waiting() > 0) return;
    if (static_cast<int64_t>(active_.size()) >= o_.max_num_seqs) return;
    Pending& p = pending_.front();
    const TrafficRequest& tr = t_.requests[p.index];
    const int64_t final_len = tr.prompt_tokens + tr.output_tokens;
    if (final_len > max_model_len_) {  // the engine rejects it, with its reason
      const std::size_t i = p.index;
      pending_.pop_front();
      hand(i, prompt_for(i), tr.output_tokens, -1, 0);
      continue;
    }
    const int64_t len = p.tokens.empty() ? tr.prompt_tokens : static_cast<int64_t>(p.tokens.size());
    const int64_t res = reservation_for(len, final_len);
    if (res > capacity_) {
      outcomes_[p.index].rejected = true;
      outcomes_[p.index].finish = backend_->clock_s();
      ++ended_;
      ++rep_.rejected;
      pending_.pop_front();
      continue;
    }
    const int64_t off = alloc_->allocate(res);
    if (off < 0) return;  // FCFS: nobody overtakes the head
    Pending head = std::move(p);
    pending_.pop_front();
    const int64_t max_tokens = head.max_tokens > 0 ? head.max_tokens : tr.output_tokens;
    std::vector<int32_t> prompt = head.tokens.empty() ? prompt_for(head.index) : std::move(head.tokens);
    hand(head.index, std::move(prompt), max_tokens, off, res);
  }
}

void Driver::preempt_restart(RequestId id) {
  const Live l = live_.at(id);
  const Request& r = engine_->request(id);
  Pending p;
  p.index = l.index;
  p.tokens = r.tokens();
  p.max_tokens = r.spec.max_tokens - r.num_generated();
  engine_->cancel(id);
  to_forget_.push_back(id);
  alloc_->free(l.res_offset, l.res_len);
  live_.erase(id);
  active_.erase(std::find(active_.begin(), active_.end(), id));
  pending_.push_front(std::move(p));
  ++contiguous_preemptions_;
}

void Driver::grow_reservations() {
  for (std::size_t k = 0; k < active_.size(); ++k) {
    const RequestId id = active_[k];
    Live& l = live_.at(id);
    const auto need = static_cast<int64_t>(engine_->request(id).tokens().size());
    if (need <= l.res_len) continue;
    const int64_t grown = std::max(need, std::min(next_pow2(need), max_model_len_));
    while (true) {
      if (alloc_->try_extend(l.res_offset, l.res_len, grown)) {
        l.res_len = grown;
        break;
      }
      const int64_t off = alloc_->allocate(grown);  // copy, then release the old region
      if (off >= 0) {
        alloc_->free(l.res_offset, l.res_len);
        l.res_offset = off;
        l.res_len = grown;
        break;
      }
      const RequestId victim = active_.back();
      preempt_restart(victim);
      if (victim == id) break;
    }
    if (k >= active_.size() || active_[k] != id) break;  // id itself was preempted (it was the newest)
  }
}

void Driver::after_step(double t0) {
  const double now = backend_->clock_s();
  std::size_t keep = 0;
  std::vector<RequestId> forked;  // parallel samples made in this step
  for (std::size_t k = 0; k < active_.size(); ++k) {
    const RequestId id = active_[k];
    const Request& r = engine_->request(id);
    const Live l = live_.at(id);
    if (l.sample) {
      if (r.finished()) {
        live_.erase(id);
        engine_->forget(id);
        continue;
      }
      active_[keep++] = id;
      continue;
    }
    for (RequestId c : r.children) {
      if (live_.count(c) != 0) continue;
      live_[c] = Live{l.index, l.final_len, -1, 0, true};
      forked.push_back(c);
    }
    Outcome& out = outcomes_[l.index];
    if (out.first_scheduled < 0 && r.time.first_scheduled_step >= 0) out.first_scheduled = t0;
    if (out.first_token < 0 && r.num_generated() > 0) out.first_token = now;
    if (r.finished()) {
      out.finish = now;
      ++ended_;
      if (l.res_len > 0) alloc_->free(l.res_offset, l.res_len);
      live_.erase(id);
      if (!engine_->forget(id)) to_forget_.push_back(id);  // its samples run on
      continue;
    }
    active_[keep++] = id;
  }
  active_.resize(keep);
  active_.insert(active_.end(), forked.begin(), forked.end());
  std::size_t still = 0;
  for (RequestId id : to_forget_) {
    if (!engine_->forget(id)) to_forget_[still++] = id;
  }
  to_forget_.resize(still);
}

MemorySlots Driver::paged_sample() {
  const KvCacheManager& kv = engine_->kv();
  const int64_t bs = kv.block_size();
  if (block_fill_.empty()) {
    block_fill_.assign(static_cast<std::size_t>(kv.device_allocator().num_blocks()), 0);
    block_will_fill_.assign(block_fill_.size(), 0);
  }
  // Per distinct block: the slots its holders' token states fill, and the slots they will
  // fill by their final lengths. Holders of a shared block (prefix sharing, or a fork that
  // shares even the partial last block until its first write) count it once.
  for (const auto& [sid, s] : kv.sequences()) {
    if (s.swapped) continue;
    auto it = live_.find(sid);
    const int64_t final_len = it != live_.end() ? it->second.final_len : s.num_slots;
    for (const GroupTable& g : s.groups) {
      for (int64_t j = g.num_window_released; j < g.table.size(); ++j) {  // past the released entries
        const auto b = static_cast<std::size_t>(g.table[j]);
        const auto fill = static_cast<int32_t>(std::clamp<int64_t>(s.num_slots - j * bs, 0, bs));
        const auto will_fill = static_cast<int32_t>(std::clamp<int64_t>(final_len - j * bs, fill, bs));
        if (block_will_fill_[b] == 0 && will_fill > 0) touched_.push_back(static_cast<int32_t>(b));
        block_fill_[b] = std::max(block_fill_[b], fill);
        block_will_fill_[b] = std::max(block_will_fill_[b], will_fill);
      }
    }
  }
  MemorySlots m;
  for (int32_t b : touched_) {
    const auto i = static_cast<std::size_t>(b);
    m.token_states += block_fill_[i];
    m.reserved += block_will_fill_[i] - block_fill_[i];
    block_fill_[i] = block_will_fill_[i] = 0;
  }
  touched_.clear();
  m.internal = static_cast<int64_t>(kv.device_allocator().num_in_use()) * bs - m.token_states - m.reserved;
  return m;
}

MemorySlots Driver::contiguous_sample() {
  const KvCacheManager& kv = engine_->kv();
  MemorySlots m;
  for (RequestId id : active_) {
    const Live& l = live_.at(id);
    const SequenceState* s = kv.sequence(id);
    const int64_t n = s != nullptr ? s->num_slots : 0;
    const int64_t useful = std::min(l.res_len, l.final_len);
    m.token_states += n;
    m.reserved += std::max<int64_t>(0, useful - n);
    m.internal += l.res_len - useful;
  }
  if (!pending_.empty()) {
    const Pending& p = pending_.front();
    const TrafficRequest& tr = t_.requests[p.index];
    const int64_t len = p.tokens.empty() ? tr.prompt_tokens : static_cast<int64_t>(p.tokens.size());
    m.external = alloc_->free_in_holes_smaller_than(reservation_for(len, tr.prompt_tokens + tr.output_tokens));
  }
  return m;
}

std::string Driver::run_name() const {
  return std::string("run (policy ") + to_string(o_.policy) + ", block size " + std::to_string(rep_.block_size) +
         ", prefix sharing " + (rep_.prefix_sharing ? "on" : "off") +
         (rep_.sliding_window > 0 ? ", window " + std::to_string(rep_.sliding_window) : std::string()) +
         (rep_.kv_groups.empty() ? std::string() : ", KV-cache groups " + rep_.kv_groups) + ", n " +
         std::to_string(o_.n) + ", preemption " + to_string(o_.preemption) + ", " + std::to_string(capacity_) +
         " KV slots, seed " + std::to_string(o_.seed) + ")";
}

Status Driver::check_sample(const MemorySlots& m, double now) const {
  MemoryAccountingState st;
  st.kv = &engine_->kv();
  st.contiguous = contiguous();
  for (RequestId id : active_) {
    const Live& l = live_.at(id);
    st.requests.push_back({id, l.final_len, l.res_offset, l.res_len});
  }
  if (contiguous()) {
    st.capacity = capacity_;
    st.free_slots = alloc_->num_free();
    if (!pending_.empty()) {
      const Pending& p = pending_.front();
      const TrafficRequest& tr = t_.requests[p.index];
      const int64_t len = p.tokens.empty() ? tr.prompt_tokens : static_cast<int64_t>(p.tokens.size());
      st.head_reservation = reservation_for(len, tr.prompt_tokens + tr.output_tokens);
    }
  }
  return check_memory_accounting(st, m).with_context(run_name() + ", sample " + std::to_string(samples_) +
                                                     " at t=" + std::to_string(now) + " s");
}

Status Driver::sample(double now) {
  const MemorySlots m = contiguous() ? contiguous_sample() : paged_sample();
  if (o_.check) KVP_RETURN_IF_ERROR(check_sample(m, now));
  sum_memory_ += m;
  sum_running_ += static_cast<double>(engine_->scheduler().num_running());
  ++samples_;
  TimelinePoint pt;
  pt.t_s = now;
  pt.waiting = engine_->scheduler().num_waiting() + static_cast<int64_t>(pending_.size());
  pt.running = engine_->scheduler().num_running();
  pt.swapped = engine_->scheduler().num_swapped();
  const auto cap = static_cast<double>(capacity_);
  pt.kv_in_use = static_cast<double>(m.held()) / cap;
  pt.kv_tokens = static_cast<double>(m.token_states) / cap;
  pt.memory = m;
  rep_.peak_waiting = std::max(rep_.peak_waiting, pt.waiting);
  rep_.timeline.push_back(pt);
  return Status::ok();
}

// The KV pool the GPU's memory leaves after the weights: paged blocks (device and host), or
// for the contiguous policies a slot capacity and a block pool they can never exhaust.
Result<Driver::Pool> Driver::size_pool() {
  if (cost_.kv_pool_bytes() <= 0)
    return Status::error("model " + cost_.model.name + " (" + std::to_string(cost_.weight_bytes() / 1e9) +
                         " GB of weights) leaves no KV memory on " + cost_.gpu.name);
  // The window releases blocks in the paged pool; a contiguous reservation keeps its span. A
  // hybrid's window does through KV-cache groups, each pool block then holding group_size
  // layers (the same bytes of pool: more, smaller blocks).
  const bool window = o_.sliding_window && !contiguous();
  layout_ = cost_.model.kv_groups(window);
  if (!window) layout_.group_windows.assign(1, 0);
  cost_.kv_layers_per_block = layout_.num_groups() > 1 ? layout_.group_size : 0;
  Pool pool;
  pool.block_size = contiguous() ? 16 : o_.block_size;
  const int64_t bs = pool.block_size;
  const int64_t max_blocks = std::numeric_limits<int32_t>::max() / 2;
  if (contiguous()) {
    capacity_ = static_cast<int64_t>(std::floor(cost_.kv_pool_bytes() / cost_.kv_bytes_per_token()));
    // A pool the reservations can never exhaust: they hold at most capacity_ slots.
    pool.device_blocks = kernels::blocks_for_tokens(std::max(capacity_, max_model_len_), bs) + o_.max_num_seqs + 1;
    alloc_ = std::make_unique<ContiguousAllocator>(capacity_);
  } else {
    pool.device_blocks = cost_.num_device_blocks(o_.block_size);
    pool.host_blocks = cost_.num_host_blocks(o_.block_size);
    capacity_ = pool.device_blocks * bs;
  }
  if (pool.device_blocks > max_blocks || pool.host_blocks > max_blocks)
    return Status::error("KV pool too large for block size " + std::to_string(bs));
  if (pool.device_blocks <= 0) return Status::error("KV pool holds no block of " + std::to_string(bs) + " tokens");
  return pool;
}

// The real engine (scheduler and KV manager unchanged) on the cost-model backend; with
// --check, every plan and step checked.
Result<EngineConfig> Driver::build_engine(const Pool& pool) {
  EngineConfig ec;
  ec.vocab_size = cost_.model.vocab_size;
  ec.kv.pool.num_layers = static_cast<int32_t>(cost_.model.num_layers);
  ec.kv.pool.num_kv_heads = static_cast<int32_t>(cost_.model.num_kv_heads);
  ec.kv.pool.head_dim = static_cast<int32_t>(cost_.model.head_dim);
  ec.kv.pool.block_size = static_cast<int32_t>(pool.block_size);
  ec.kv.pool.num_device_blocks = static_cast<int32_t>(pool.device_blocks);
  ec.kv.pool.num_host_blocks = static_cast<int32_t>(pool.host_blocks);
  ec.kv.pool.kv_dtype = o_.kv_dtype;
  if (is_fp8(o_.kv_dtype)) {  // the pool's shape carries scales; the simulation moves no data
    const auto cells = static_cast<std::size_t>(cost_.model.num_layers * cost_.model.num_kv_heads);
    ec.kv.pool.k_scales.assign(cells, 1.0f);
    ec.kv.pool.v_scales.assign(cells, 1.0f);
  }
  ec.kv.enable_prefix_caching = o_.prefix_sharing && !contiguous();
  ec.kv.sliding_window = layout_.num_groups() == 1 ? layout_.group_windows[0] : 0;
  ec.kv.group_windows = layout_.manager_group_windows();
  ec.kv.watermark_blocks =
      contiguous() ? 0
                   : static_cast<int32_t>(std::floor(o_.watermark_fraction * static_cast<double>(pool.device_blocks)));
  ec.scheduler.max_num_batched_tokens = o_.max_num_batched_tokens;
  ec.scheduler.max_num_seqs = o_.max_num_seqs;
  ec.scheduler.max_model_len = max_model_len_;
  ec.scheduler.prefill_chunk_size = o_.prefill_chunk_size;
  ec.scheduler.admission = o_.admission;
  ec.scheduler.preemption = o_.preemption;
  backend_ = std::make_unique<CostModelBackend>(
      cost_, ec.kv.pool, PlanLimits{ec.vocab_size, max_model_len_, ec.kv.sliding_window, ec.kv.group_windows});
  auto engine = Engine::create(ec, *backend_);
  if (!engine) return engine.status();
  engine_ = std::move(*engine);
  if (o_.check) {
    engine_->set_plan_observer([](const Engine& e, const BatchPlan& plan) { return check_plan(e, plan); });
    engine_->set_step_observer([this](const Engine& e, const BatchPlan&) {
      ++checked_steps_;
      return check_engine_state(e);
    });
  }
  return ec;
}

void Driver::describe_run(const EngineConfig& ec, const Pool& pool) {
  rep_.traffic = t_.name;
  rep_.model = cost_.model.name;
  rep_.gpu = cost_.gpu.name;
  rep_.kv_dtype = std::string(dtype_flag_name(o_.kv_dtype));
  rep_.policy = to_string(o_.policy);
  rep_.admission = to_string(o_.admission);
  rep_.preemption = to_string(o_.preemption);
  rep_.block_size = o_.block_size;
  rep_.max_model_len = max_model_len_;
  rep_.prefix_sharing = ec.kv.enable_prefix_caching;
  rep_.sliding_window = *std::max_element(layout_.group_windows.begin(), layout_.group_windows.end());
  rep_.kv_groups = layout_.num_groups() > 1 ? layout_.to_string() : std::string();
  rep_.num_kv_groups = layout_.num_groups();
  rep_.rate = t_.mean_rate();
  rep_.ttft_slo_s = o_.ttft_slo_s;
  rep_.tpot_slo_s = o_.tpot_slo_s;
  rep_.kv_pool_bytes = cost_.kv_pool_bytes();
  rep_.kv_bytes_per_token = cost_.kv_bytes_per_token();
  rep_.kv_capacity_slots = capacity_;
  rep_.kv_capacity_tokens = capacity_ / layout_.num_groups();
  rep_.num_device_blocks = contiguous() ? 0 : pool.device_blocks;
  rep_.num_host_blocks = pool.host_blocks;
  rep_.requests = static_cast<int64_t>(t_.requests.size());
}

// The event loop: arrivals handed to the engine at their time (contiguous policies through
// their reservations), a memory sample every interval, one engine step at a time until every
// request has ended.
Status Driver::drive() {
  const std::size_t n = t_.requests.size();
  outcomes_.assign(n, Outcome{});
  std::size_t next = 0;
  double next_sample = 0;
  int64_t steps = 0;
  while (true) {
    const double now = backend_->clock_s();
    for (; next < n && t_.requests[next].arrival_s <= now; ++next) {
      if (contiguous())
        pending_.push_back(Pending{next, {}, 0});
      else
        hand(next, prompt_for(next), t_.requests[next].output_tokens, -1, 0);
    }
    if (contiguous()) {
      hand_pending();
      if (o_.policy == AllocationPolicy::kContiguousPow2) grow_reservations();
    }
    if (!engine_->has_unfinished()) {
      if (!pending_.empty()) return Status::error("simulate: a contiguous reservation was never admitted (driver bug)");
      if (next >= n) break;
      backend_->advance_to(t_.requests[next].arrival_s);
      continue;
    }
    if (o_.sample_interval_s <= 0 || now >= next_sample) {
      KVP_RETURN_IF_ERROR(sample(now).with_context("simulate --check"));
      next_sample = now + o_.sample_interval_s;
    }
    const double t0 = now;
    Status s = engine_->step();
    if (s) s = check_progress(*engine_, progress_);
    if (!s) return s.with_context(o_.check ? "simulate --check" : "simulate");
    after_step(t0);
    if (o_.progress && (++steps & 255) == 0)
      o_.progress(n > 0 ? static_cast<double>(ended_) / static_cast<double>(n) : 1);
  }
  if (o_.check) {
    KVP_RETURN_IF_ERROR(check_no_leak(engine_->kv()).with_context("simulate --check: at the end"));
    rep_.checked_steps = checked_steps_;
  }
  if (o_.progress) o_.progress(1.0);
  return Status::ok();
}

// Per-request results: latencies, SLO attainment, throughput over the run's span.
void Driver::summarize_requests() {
  const std::size_t n = t_.requests.size();
  const EngineMetrics m = engine_->metrics();
  rep_.preemptions = m.counters.preemptions + contiguous_preemptions_;
  rep_.swaps_out = m.counters.swaps_out;
  rep_.swaps_in = m.counters.swaps_in;
  rep_.prefix_hit_tokens = m.counters.prefix_hit_tokens;
  rep_.steps = backend_->steps();
  rep_.token_steps = backend_->token_steps();
  rep_.compute_bound_steps = backend_->compute_bound_steps();
  std::vector<double> e2e, queue;
  double last_finish = 0;
  int64_t output_tokens = 0, prompt_tokens = 0, ttft_ok = 0, tpot_ok = 0, both_ok = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Outcome& out = outcomes_[i];
    const TrafficRequest& tr = t_.requests[i];
    if (out.rejected) continue;
    ++rep_.finished;
    last_finish = std::max(last_finish, out.finish);
    output_tokens += tr.output_tokens * o_.n;
    prompt_tokens += tr.prompt_tokens;
    const double ttft = out.first_token - tr.arrival_s;
    rep_.ttft_samples.push_back(ttft);
    e2e.push_back(out.finish - tr.arrival_s);
    queue.push_back(out.first_scheduled - tr.arrival_s);
    const bool t_ok = ttft <= o_.ttft_slo_s;
    bool p_ok = true;
    if (tr.output_tokens > 1) {
      const double tpot = (out.finish - out.first_token) / static_cast<double>(tr.output_tokens - 1);
      rep_.tpot_samples.push_back(tpot);
      p_ok = tpot <= o_.tpot_slo_s;
    }
    ttft_ok += t_ok;
    tpot_ok += p_ok;
    both_ok += t_ok && p_ok;
  }
  rep_.duration_s = last_finish - (n > 0 ? t_.requests.front().arrival_s : 0);
  if (rep_.duration_s > 0) {
    rep_.requests_per_s = static_cast<double>(rep_.finished) / rep_.duration_s;
    rep_.output_tokens_per_s = static_cast<double>(output_tokens) / rep_.duration_s;
    rep_.total_tokens_per_s = static_cast<double>(output_tokens + prompt_tokens) / rep_.duration_s;
  }
  rep_.ttft_s = summarize(rep_.ttft_samples);
  rep_.tpot_s = summarize(rep_.tpot_samples);
  rep_.e2e_s = summarize(e2e);
  rep_.queue_s = summarize(queue);
  if (n > 0) {
    rep_.slo_attainment = static_cast<double>(both_ok) / static_cast<double>(n);
    rep_.ttft_attainment = static_cast<double>(ttft_ok) / static_cast<double>(n);
    rep_.tpot_attainment = static_cast<double>(tpot_ok) / static_cast<double>(n);
  }
}

// Where the KV memory went, over the samples: token states, reservations, fragmentation.
void Driver::summarize_memory() {
  rep_.memory_slots = sum_memory_;
  if (sum_memory_.total() > 0) {
    const auto total = static_cast<double>(sum_memory_.total());
    rep_.memory.token_states = static_cast<double>(sum_memory_.token_states) / total;
    rep_.memory.reserved = static_cast<double>(sum_memory_.reserved) / total;
    rep_.memory.internal = static_cast<double>(sum_memory_.internal) / total;
    rep_.memory.external = static_cast<double>(sum_memory_.external) / total;
  }
  if (samples_ > 0) {
    rep_.memory.mean_in_use =
        static_cast<double>(sum_memory_.held()) / static_cast<double>(samples_) / static_cast<double>(capacity_);
    rep_.mean_running = sum_running_ / static_cast<double>(samples_);
  }
}

Result<SimReport> Driver::run() {
  const auto wall0 = std::chrono::steady_clock::now();
  max_model_len_ = o_.max_model_len > 0 ? o_.max_model_len : cost_.model.max_position_embeddings;
  auto pool = size_pool();
  if (!pool) return pool.status();
  auto ec = build_engine(*pool);
  if (!ec) return ec.status();
  describe_run(*ec, *pool);
  KVP_RETURN_IF_ERROR(drive());
  summarize_requests();
  summarize_memory();
  if (o_.check) KVP_RETURN_IF_ERROR(check_memory_shares(rep_).with_context("simulate --check: " + run_name()));
  rep_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return rep_;
}

}  // namespace

Result<SimReport> simulate(const SimOptions& options, const Traffic& traffic) {
  auto model = find_model_preset(options.model);
  if (!model) return model.status();
  auto gpu = find_gpu_preset(options.gpu);
  if (!gpu) return gpu.status();
  CostModelConfig cost;
  cost.model = *model;
  cost.gpu = *gpu;
  cost.gpu_memory_utilization = options.gpu_memory_utilization;
  cost.kv_bytes_per_element = static_cast<double>(dtype_size(options.kv_dtype));
  KVP_RETURN_IF_ERROR(cost.validate());
  if (options.block_size < 1) return Status::error("block size must be >= 1");
  if (options.max_model_len < 0) return Status::error("max model len must be >= 0");
  if (options.n < 1) return Status::error("n must be >= 1");
  if (options.n > 1 && options.policy != AllocationPolicy::kPaged)
    return Status::error(
        "parallel samples (n > 1) need the paged policy (a contiguous reservation holds one sequence)");
  SchedulerConfig sc;
  sc.max_num_batched_tokens = options.max_num_batched_tokens;
  sc.max_num_seqs = options.max_num_seqs;
  sc.prefill_chunk_size = options.prefill_chunk_size;
  KVP_RETURN_IF_ERROR(validate(sc));
  if (options.rate > 0) {
    Traffic t = traffic;
    reshape_traffic(t, 1.0, options.rate, 0, 0);
    Driver d(options, t, cost);
    return d.run();
  }
  Driver d(options, traffic, cost);
  return d.run();
}

}  // namespace kvp::sim
