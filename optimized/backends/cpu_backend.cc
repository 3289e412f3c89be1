#include "optimized/backends/cpu_backend.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/text.h"
#include "kernels/gemm.h"
#include "kernels/kv_element.h"
#include "kernels/kv_index.h"
#include "model/rope.h"
#include "optimized/backends/plan_validation.h"

namespace kvp {

// A fixed set of worker threads. parallel_for(n, fn) cuts [0, n) into num_threads
// contiguous ranges, runs range 0 on the calling thread and range i on worker i-1, and
// returns when all are done. Which thread runs a range never changes what it computes.
class CpuBackend::ThreadPool {
 public:
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;

  explicit ThreadPool(int num_threads) : num_threads_(num_threads) {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  void parallel_for(int64_t n, const RangeFn& fn) {
    if (n <= 0) return;
    if (num_threads_ == 1 || n == 1) {
      fn(0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      pending_ = num_threads_ - 1;
      ++generation_;
    }
    start_cv_.notify_all();
    run_range(fn, n, 0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void run_range(const RangeFn& fn, int64_t n, int index) const {
    const int64_t begin = n * index / num_threads_;
    const int64_t end = n * (index + 1) / num_threads_;
    if (begin < end) fn(begin, end);
  }

  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      const RangeFn* fn = nullptr;
      int64_t n = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
        n = n_;
      }
      run_range(*fn, n, index);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --pending_;
      }
      done_cv_.notify_one();
    }
  }

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

// Activations of one step, [tokens, width] row-major; reused across steps.
struct CpuBackend::Scratch {
  std::vector<float> x, h, q, k, v, attn, proj, gate, up, final_h, logits;
  std::vector<int32_t> seq_of_token;
};

namespace {

// Multiply-adds below which a product or an attention pass runs on the calling thread:
// about 50 us of work at the GEMM's speed, several times a worker's wake-up.
constexpr int64_t kMinParallelMacs = int64_t{1} << 20;

const float* bias_or_null(const VectorF& bias) { return bias.size() != 0 ? bias.data() : nullptr; }

// fn(KvT{}) with the pool element type of `dtype` (kernels/kv_element.h).
template <typename Fn>
void with_kv_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF16: fn(kernels::F16Bits{}); return;
    case DType::kBF16: fn(kernels::BF16Bits{}); return;
    case DType::kF8E4M3: fn(kernels::F8E4M3Bits{}); return;
    case DType::kF8E5M2: fn(kernels::F8E5M2Bits{}); return;
    case DType::kF32:
    case DType::kF64: break;  // refused by CpuBackendConfig::validate
  }
  fn(float{});
}

}  // namespace

Status CpuBackendConfig::validate() const {
  KVP_RETURN_IF_ERROR(pool.validate_for_backend());
  if (pool.kv_dtype == DType::kF64)
    return Status::error("kv_dtype must be F32, F16, BF16, F8_E4M3 or F8_E5M2, got " +
                         std::string(dtype_name(pool.kv_dtype)));
  if (num_threads < 1 || num_threads > 256) return Status::error("num_threads must be in [1, 256]");
  if (attention_partition <= 0) return Status::error("attention_partition must be > 0");
  if (attention_plugin != nullptr)
    KVP_RETURN_IF_ERROR(check_plugin_for_backend(*attention_plugin, "cpu", KVP_DEVICE_HOST, pool.kv_dtype));
  // The plug-in ABI passes one block table per sequence and one K/V array per layer.
  if (attention_plugin != nullptr && kv_groups)
    return Status::error("kv_groups: an attention plug-in takes one block table per sequence (no KV-cache groups)");
  if (!kernels::gemm_isa_supported(gemm_isa))
    return Status::error("gemm_isa " + std::string(kernels::gemm_isa_name(gemm_isa)) + " is not supported by this CPU");
  return Status::ok();
}

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(const Model& model, const CpuBackendConfig& config) {
  KVP_RETURN_IF_ERROR(model.config.validate().with_context("model config"));
  return create(std::make_shared<const Model>(model), config);
}

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(std::shared_ptr<const Model> shared,
                                                       const CpuBackendConfig& config) {
  KVP_CHECK(shared != nullptr);
  const Model& model = *shared;
  KVP_RETURN_IF_ERROR(model.config.validate().with_context("model config"));
  KVP_RETURN_IF_ERROR(config.validate().with_context("cpu backend config"));
  KVP_RETURN_IF_ERROR(check_pool_matches_model(config.pool, model.config).with_context("cpu backend config"));
  if (config.attention_plugin != nullptr)
    KVP_RETURN_IF_ERROR(
        check_plugin_for_model(*config.attention_plugin, model.config).with_context("cpu backend config"));
  // Each pool of one layer must be addressable: blocks * block_size * kv_dim elements.
  const int64_t per_block = static_cast<int64_t>(config.pool.block_size) * model.config.kv_dim();
  const int64_t max_blocks = std::max(config.pool.num_device_blocks, config.pool.num_host_blocks);
  if (per_block > (int64_t{1} << 40) / std::max<int64_t>(max_blocks, 1))
    return Status::error("cpu backend config: pool of " + str(max_blocks) + " blocks of " + str(per_block) +
                         " elements is too large");
  return std::make_unique<CpuBackend>(std::move(shared), config);
}

CpuBackend::CpuBackend(const Model& model, const CpuBackendConfig& config)
    : CpuBackend(std::make_shared<const Model>(model), config) {}

CpuBackend::CpuBackend(std::shared_ptr<const Model> model, const CpuBackendConfig& config)
    : model_(std::move(model)), config_(config), scratch_(std::make_unique<Scratch>()) {
  KVP_CHECK(model_ != nullptr);
  KVP_CHECK(model_->config.validate().is_ok());
  KVP_CHECK(config_.validate().is_ok());
  KVP_CHECK(check_pool_matches_model(config_.pool, model_->config).is_ok());
  const ModelConfig& c = model_->config;
  inv_freq_ = rope_inv_freq<float>(c);
  if (c.has_local_rope()) local_inv_freq_ = rope_local_inv_freq<float>(c);
  for (const LayerWeights& w : model_->weights.layers) {
    gains_.push_back({norm_gain(c, w.input_layernorm), norm_gain(c, w.post_attention_layernorm),
                      norm_gain(c, w.pre_feedforward_layernorm), norm_gain(c, w.post_feedforward_layernorm),
                      norm_gain(c, w.q_norm), norm_gain(c, w.k_norm)});
  }
  final_gain_ = norm_gain(c, model_->weights.norm);
  // Zeros, or every element the dtype's quiet NaN (kernels/kv_element.h).
  const std::size_t element = dtype_size(config_.pool.kv_dtype);
  std::vector<std::byte> one(element, std::byte{0});
  if (config_.nan_fill_at_start) kernels::kv_element_store_nan(config_.pool.kv_dtype, one.data());
  const auto filled = [&](int64_t blocks) {
    std::vector<std::byte> pool(static_cast<std::size_t>(blocks) * bytes_per_block());
    for (std::size_t i = 0; i < pool.size(); i += element) std::memcpy(pool.data() + i, one.data(), element);
    return pool;
  };
  const std::vector<std::byte> device = filled(config_.pool.num_device_blocks);
  const std::vector<std::byte> host = filled(config_.pool.num_host_blocks);
  layout_ = kv_group_layout(c, config_.kv_groups);
  limits_ = {c.vocab_size, c.max_position_embeddings, layout_.num_groups() == 1 ? layout_.group_windows[0] : 0,
             layout_.manager_group_windows()};
  for (int64_t l = 0; l < layout_.group_size; ++l) {
    device_k_.push_back(device);
    device_v_.push_back(device);
    host_k_.push_back(host);
    host_v_.push_back(host);
  }
  pool_ = std::make_unique<ThreadPool>(config_.num_threads);
}

CpuBackend::~CpuBackend() = default;

int64_t CpuBackend::elements_per_block() const {
  return static_cast<int64_t>(config_.pool.block_size) * model_->config.kv_dim();
}
std::size_t CpuBackend::bytes_per_block() const {
  return static_cast<std::size_t>(elements_per_block()) * dtype_size(config_.pool.kv_dtype);
}
const float* CpuBackend::k_scales_of(int64_t layer) const {
  return config_.pool.k_scales.empty() ? nullptr : config_.pool.k_scales.data() + layer * model_->config.num_kv_heads;
}
const float* CpuBackend::v_scales_of(int64_t layer) const {
  return config_.pool.v_scales.empty() ? nullptr : config_.pool.v_scales.data() + layer * model_->config.num_kv_heads;
}
int64_t CpuBackend::num_device_slots() const {
  return static_cast<int64_t>(config_.pool.num_device_blocks) * config_.pool.block_size;
}
int64_t CpuBackend::num_host_slots() const {
  return static_cast<int64_t>(config_.pool.num_host_blocks) * config_.pool.block_size;
}

void CpuBackend::run_ops(const KvPlanOps& ops) {
  const std::size_t per_block = bytes_per_block();
  const auto copy_block = [per_block](const std::vector<std::byte>& from, int64_t src, std::vector<std::byte>& to,
                                      int64_t dst) {
    std::memcpy(to.data() + static_cast<std::size_t>(dst) * per_block,
                from.data() + static_cast<std::size_t>(src) * per_block, per_block);
  };
  const auto num_layers = static_cast<std::size_t>(layout_.group_size);  // K/V arrays
  for (const BlockCopy& s : ops.swap_out) {
    for (std::size_t l = 0; l < num_layers; ++l) {
      copy_block(device_k_[l], s.src, host_k_[l], s.dst);
      copy_block(device_v_[l], s.src, host_v_[l], s.dst);
    }
  }
  for (const BlockCopy& s : ops.block_copies) {
    for (std::size_t l = 0; l < num_layers; ++l) {
      copy_block(device_k_[l], s.src, device_k_[l], s.dst);
      copy_block(device_v_[l], s.src, device_v_[l], s.dst);
    }
  }
  // Poison: every element of the block the dtype's quiet NaN.
  const std::size_t element = dtype_size(config_.pool.kv_dtype);
  std::vector<std::byte> nan_block(per_block);
  for (std::size_t i = 0; i < per_block; i += element)
    kernels::kv_element_store_nan(config_.pool.kv_dtype, nan_block.data() + i);
  for (int32_t b : ops.poison) {
    for (std::size_t l = 0; l < num_layers; ++l) {
      std::memcpy(device_k_[l].data() + static_cast<std::size_t>(b) * per_block, nan_block.data(), per_block);
      std::memcpy(device_v_[l].data() + static_cast<std::size_t>(b) * per_block, nan_block.data(), per_block);
    }
  }
  for (const BlockCopy& s : ops.swap_in) {
    for (std::size_t l = 0; l < num_layers; ++l) {
      copy_block(host_k_[l], s.src, device_k_[l], s.dst);
      copy_block(host_v_[l], s.src, device_v_[l], s.dst);
    }
  }
}

Status CpuBackend::read_block(PoolKind pool, int64_t layer, int32_t block, std::vector<float>& k,
                              std::vector<float>& v) const {
  const bool host = pool == PoolKind::kHost;
  const int32_t blocks = host ? config_.pool.num_host_blocks : config_.pool.num_device_blocks;
  if (layer < 0 || layer >= model_->config.num_layers)
    return Status::error("read_block: layer " + str(layer) + " out of range");
  if (block < 0 || block >= blocks) return Status::error("read_block: block " + str(block) + " out of range");
  const auto& kp = host ? host_k_ : device_k_;
  const auto& vp = host ? host_v_ : device_v_;
  const std::size_t at = static_cast<std::size_t>(block) * bytes_per_block();
  const auto slot = static_cast<std::size_t>(layout_.layer_slot[static_cast<std::size_t>(layer)]);
  config_.pool.block_to_float(layer, true, kp[slot].data() + at, k);
  config_.pool.block_to_float(layer, false, vp[slot].data() + at, v);
  return Status::ok();
}

Status CpuBackend::execute(const BatchPlan& plan, StepOutput& out) {
  auto reads = preflight_plan(plan, config_.pool, limits_);
  if (!reads) return reads.status();
  audited_block_reads_ += *reads;
  run_ops(plan.ops);
  attention_status_ = Status::ok();
  run_model(plan, out);
  return attention_status_;
}

void CpuBackend::project(const float* w, const VectorF& bias, int64_t out_dim, int64_t in_dim, const float* x,
                         int64_t n, float* y) {
  const Projection p[] = {{w, &bias, out_dim, y}};
  project_all(p, in_dim, x, n);
}

void CpuBackend::project_all(std::span<const Projection> ps, int64_t in_dim, const float* x, int64_t n) {
  // kernels/gemm.h: each output element's arithmetic depends only on in_dim, so a token's row
  // is the same bits whatever its neighbours, the split of rows over threads or the ISA.
  const kernels::GemmIsa isa = config_.gemm_isa;
  int64_t total = 0;
  for (const Projection& p : ps) total += p.out_dim;
  // Thread range [begin, end) of the projections' rows laid end to end.
  const auto rows = [&](int64_t begin, int64_t end) {
    int64_t base = 0;
    for (const Projection& p : ps) {
      const int64_t lo = std::max(begin, base) - base;
      const int64_t hi = std::min(end, base + p.out_dim) - base;
      if (lo < hi) kernels::gemm_rows(isa, p.w, bias_or_null(*p.bias), p.out_dim, in_dim, x, n, p.y, lo, hi);
      base += p.out_dim;
    }
  };
  split_rows(total, total * in_dim * n, rows);
}

void CpuBackend::split_rows(int64_t rows, int64_t macs, const std::function<void(int64_t, int64_t)>& fn) {
  // Waking the workers costs more than a small product saves.
  if (macs < kMinParallelMacs) {
    fn(0, rows);
  } else {
    pool_->parallel_for(rows, fn);
  }
}

void CpuBackend::attention(const BatchPlan& plan, int64_t layer, const float* q, float* out) {
  const ModelConfig& c = model_->config;
  const int64_t d = c.head_dim;
  const int64_t n = plan.num_tokens();
  const float scale = c.attention_scale();
  const auto softcap = static_cast<float>(c.attn_logit_softcapping);
  const auto slot = static_cast<std::size_t>(layout_.layer_slot[static_cast<std::size_t>(layer)]);
  const int64_t kv_group = layout_.layer_group[static_cast<std::size_t>(layer)];
  const std::byte* k_bytes = device_k_[slot].data();
  const std::byte* v_bytes = device_v_[slot].data();
  const float* k_scale = k_scales_of(layer);
  const float* v_scale = v_scales_of(layer);
  const std::vector<int32_t>& seq_of_token = scratch_->seq_of_token;
  if (config_.attention_plugin != nullptr) {
    PluginBatch batch;
    batch.query = q;
    batch.out = out;
    batch.query_start = plan.query_start.data();
    batch.token_seq = seq_of_token.data();
    batch.positions = plan.positions.data();
    batch.context_lens = plan.context_lens.data();
    batch.block_tables = plan.block_tables.data();
    batch.k_cache = k_bytes;
    batch.v_cache = v_bytes;
    batch.k_scale = k_scale;
    batch.v_scale = v_scale;
    batch.window = static_cast<int32_t>(c.layer_window(layer));
    batch.scale = scale;
    batch.softcap = static_cast<float>(c.attn_logit_softcapping);
    Status s = plugin_attention(*config_.attention_plugin, plan, c.num_heads, config_.pool, batch);
    if (attention_status_.is_ok() && !s.is_ok()) attention_status_ = s;
    return;
  }
  // Each head of each token reads its context (its window's part) once for the scores and
  // once for the values.
  const int64_t window = c.layer_window(layer);
  const auto context_of = [&](int32_t p) { return static_cast<int64_t>(p) + 1 - kernels::window_first(p, window); };
  int64_t macs = 0;
  for (int32_t p : plan.positions) macs += context_of(p) * 2 * d * c.num_heads;
  const bool parallel = macs >= kMinParallelMacs;
  // An item is a token's run of `kv_per_item` KV heads with the query heads that read them
  // (kernels::paged_attention_kv_heads): all of them, so that each slot's record is read
  // once, in order, unless that leaves the threads too few items (a short batch), then one.
  // The split changes no bit.
  const int64_t group = c.group_size();
  const int64_t kv_per_item = parallel && n < 4 * static_cast<int64_t>(pool_->num_threads()) ? 1 : c.num_kv_heads;
  const int64_t items_per_token = c.num_kv_heads / kv_per_item;
  const auto items = [&](int64_t begin, int64_t end) {
    with_kv_type(config_.pool.kv_dtype, [&]<typename KvT>(KvT /*tag*/) {
      const auto* k_pool = reinterpret_cast<const KvT*>(k_bytes);
      const auto* v_pool = reinterpret_cast<const KvT*>(v_bytes);
      std::vector<float> scratch(
          static_cast<std::size_t>(kernels::attention_scratch_size<KvT>(d, kv_per_item * group)));
      for (int64_t item = begin; item < end; ++item) {
        const int64_t t = item / items_per_token;
        const int64_t kv_begin = item % items_per_token * kv_per_item;
        const auto seq = static_cast<std::size_t>(seq_of_token[static_cast<std::size_t>(t)]);
        const int32_t* table = plan.table_row(kv_group, static_cast<int64_t>(seq));
        const int64_t row = t * c.q_dim() + kv_begin * group * d;
        kernels::paged_attention_kv_heads(q + row, k_pool, v_pool, table, config_.pool.block_size, c.num_kv_heads,
                                          kv_begin, kv_per_item, group, d, plan.positions[static_cast<std::size_t>(t)],
                                          scale, config_.attention_partition, scratch.data(), out + row, k_scale,
                                          v_scale, window, softcap);
      }
    });
  };
  const int64_t num_items = n * items_per_token;
  if (!parallel) {
    items(0, num_items);
    return;
  }
  // Each thread takes a run of items of about equal work, not of equal count: an item's work
  // grows with its token's context (in a causal prefill the last tokens cost many times the
  // first ones).
  const int threads = pool_->num_threads();
  std::vector<int64_t> split(static_cast<std::size_t>(threads) + 1, num_items);
  split[0] = 0;
  int64_t total = 0;
  for (int32_t p : plan.positions) total += context_of(p) * items_per_token;
  int64_t done = 0;
  int next = 1;
  for (int64_t i = 0; i < num_items && next < threads; ++i) {
    done += context_of(plan.positions[static_cast<std::size_t>(i / items_per_token)]);
    while (next < threads && done * threads >= total * next) split[static_cast<std::size_t>(next++)] = i + 1;
  }
  pool_->parallel_for(threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      items(split[static_cast<std::size_t>(i)], split[static_cast<std::size_t>(i) + 1]);
  });
}

void CpuBackend::write_new_kv(const BatchPlan& plan, int64_t layer) {
  const ModelConfig& c = model_->config;
  const Scratch& s = *scratch_;
  // As the CUDA kernel writes (kernels/cuda/model_kernels.cu, write_kv_kernel): each element
  // rounded to the pool's type, an fp8 one divided by its KV head's scale first.
  const float* k_scale = k_scales_of(layer);
  const float* v_scale = v_scales_of(layer);
  with_kv_type(config_.pool.kv_dtype, [&]<typename KvT>(KvT /*tag*/) {
    const auto array = static_cast<std::size_t>(layout_.layer_slot[static_cast<std::size_t>(layer)]);
    auto* k_pool = reinterpret_cast<KvT*>(device_k_[array].data());
    auto* v_pool = reinterpret_cast<KvT*>(device_v_[array].data());
    const int64_t* slots = plan.group_slots(layout_.layer_group[static_cast<std::size_t>(layer)]);
    for (int64_t t = 0; t < plan.num_tokens(); ++t) {
      const int64_t slot = slots[t];
      if (slot == kernels::kSkipSlot) continue;
      const int64_t at = kernels::kv_pool_offset(slot, 0, c.num_kv_heads, c.head_dim);
      const float* k = s.k.data() + t * c.kv_dim();
      const float* v = s.v.data() + t * c.kv_dim();
      for (int64_t i = 0; i < c.kv_dim(); ++i) {
        if (k_scale == nullptr) {
          kernels::kv_store(k_pool + at + i, k[i]);
          kernels::kv_store(v_pool + at + i, v[i]);
        } else {
          kernels::kv_store(k_pool + at + i, k[i] / k_scale[i / c.head_dim]);
          kernels::kv_store(v_pool + at + i, v[i] / v_scale[i / c.head_dim]);
        }
      }
    }
  });
}

void CpuBackend::mlp(const LayerWeights& w, const LayerGains& g, int64_t n) {
  // SwiGLU: x += W_down (silu(W_gate h) * (W_up h)), h = RMSNorm(x). Gemma: GeGLU (the tanh
  // GELU) after its pre-feedforward norm, the output normalised before the add.
  const ModelConfig& c = model_->config;
  const int64_t hidden = c.hidden_size;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  Scratch& s = *scratch_;
  const VectorF& in_gain = c.gemma() ? g.pre_feedforward : g.post_attention;
  for (int64_t t = 0; t < n; ++t)
    kernels::rms_norm(s.x.data() + t * hidden, in_gain.data(), hidden, eps, s.h.data() + t * hidden);
  // gate = act(W_gate h) * (W_up h) in one pass over the threads: each thread's rows of both
  // products, then the same columns' elementwise products (which run on the threads too).
  const int64_t inter = c.intermediate_size;
  const kernels::GemmIsa isa = config_.gemm_isa;
  const bool geglu = c.gemma();
  const auto gate_up = [&](int64_t begin, int64_t end) {
    kernels::gemm_rows(isa, w.gate_proj.data(), bias_or_null(w.gate_bias), inter, hidden, s.h.data(), n, s.gate.data(),
                       begin, end);
    kernels::gemm_rows(isa, w.up_proj.data(), bias_or_null(w.up_bias), inter, hidden, s.h.data(), n, s.up.data(), begin,
                       end);
    for (int64_t t = 0; t < n; ++t) {
      float* gt = s.gate.data() + t * inter;
      const float* u = s.up.data() + t * inter;
      if (geglu) {
        for (int64_t j = begin; j < end; ++j) gt[j] = kernels::gelu_tanh(gt[j]) * u[j];
      } else {
        for (int64_t j = begin; j < end; ++j) gt[j] = kernels::silu(gt[j]) * u[j];
      }
    }
  };
  split_rows(inter, 2 * inter * hidden * n, gate_up);
  project(w.down_proj.data(), w.down_bias, hidden, c.intermediate_size, s.gate.data(), n, s.proj.data());
  if (c.gemma()) {
    for (int64_t t = 0; t < n; ++t)
      kernels::rms_norm(s.proj.data() + t * hidden, g.post_feedforward.data(), hidden, eps, s.proj.data() + t * hidden);
  }
  for (int64_t i = 0; i < n * hidden; ++i) s.x[static_cast<std::size_t>(i)] += s.proj[static_cast<std::size_t>(i)];
}

void CpuBackend::run_model(const BatchPlan& plan, StepOutput& out) {
  const ModelConfig& c = model_->config;
  const int64_t n = plan.num_tokens();
  const int64_t hidden = c.hidden_size;
  const int64_t d = c.head_dim;
  const int64_t half = d / 2;
  const float eps = static_cast<float>(c.rms_norm_eps);
  Scratch& s = *scratch_;
  const auto resize = [](std::vector<float>& v, int64_t size) { v.resize(static_cast<std::size_t>(size)); };

  const std::vector<int32_t> logit_tokens = lay_out_logit_rows(plan, c.vocab_size, out, s.seq_of_token);
  const auto num_rows = static_cast<int64_t>(logit_tokens.size());
  if (n == 0) return;

  resize(s.x, n * hidden);
  resize(s.h, n * hidden);
  resize(s.q, n * c.q_dim());
  resize(s.k, n * c.kv_dim());
  resize(s.v, n * c.kv_dim());
  resize(s.attn, n * c.q_dim());
  resize(s.proj, n * hidden);
  resize(s.gate, n * c.intermediate_size);
  resize(s.up, n * c.intermediate_size);

  const float embed_scale = c.embed_scale();  // Gemma: sqrt(hidden); else 1, not applied
  for (int64_t t = 0; t < n; ++t) {
    const float* e = model_->weights.embed_tokens.data() + plan.token_ids[static_cast<std::size_t>(t)] * hidden;
    float* x = s.x.data() + t * hidden;
    std::copy_n(e, hidden, x);
    if (c.gemma()) {
      for (int64_t i = 0; i < hidden; ++i) x[i] *= embed_scale;
    }
  }

  // cos/sin of every token's position, shared by all heads and layers (Gemma 3's sliding
  // layers: a second table, of their own RoPE base).
  const auto cos_sin = [&](const std::vector<float>& inv_freq, std::vector<float>& cs, std::vector<float>& sn) {
    cs.resize(static_cast<std::size_t>(n * half));
    sn.resize(static_cast<std::size_t>(n * half));
    for (int64_t t = 0; t < n; ++t)
      kernels::rope_cos_sin(plan.positions[static_cast<std::size_t>(t)], inv_freq.data(), half, cs.data() + t * half,
                            sn.data() + t * half);
  };
  std::vector<float> cos_table, sin_table, local_cos, local_sin;
  cos_sin(inv_freq_, cos_table, sin_table);
  if (!local_inv_freq_.empty()) cos_sin(local_inv_freq_, local_cos, local_sin);

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model_->weights.layers[static_cast<std::size_t>(l)];
    const LayerGains& g = gains_[static_cast<std::size_t>(l)];
    const bool local = c.layer_uses_local_rope(l);
    const std::vector<float>& layer_cos = local ? local_cos : cos_table;
    const std::vector<float>& layer_sin = local ? local_sin : sin_table;
    for (int64_t t = 0; t < n; ++t)
      kernels::rms_norm(s.x.data() + t * hidden, g.input.data(), hidden, eps, s.h.data() + t * hidden);
    const Projection qkv[] = {{w.q_proj.data(), &w.q_bias, c.q_dim(), s.q.data()},
                              {w.k_proj.data(), &w.k_bias, c.kv_dim(), s.k.data()},
                              {w.v_proj.data(), &w.v_bias, c.kv_dim(), s.v.data()}};
    project_all(qkv, hidden, s.h.data(), n);
    for (int64_t t = 0; t < n; ++t) {
      const float* cs = layer_cos.data() + t * half;
      const float* sn = layer_sin.data() + t * half;
      for (int64_t head = 0; head < c.num_heads; ++head) {
        float* qh = s.q.data() + t * c.q_dim() + head * d;
        if (c.qk_norm()) kernels::rms_norm(qh, g.q_norm.data(), d, eps, qh);  // Gemma 3, before RoPE
        kernels::apply_rope(qh, cs, sn, half);
      }
      for (int64_t kvh = 0; kvh < c.num_kv_heads; ++kvh) {
        float* kh = s.k.data() + t * c.kv_dim() + kvh * d;
        if (c.qk_norm()) kernels::rms_norm(kh, g.k_norm.data(), d, eps, kh);
        kernels::apply_rope(kh, cs, sn, half);
      }
    }
    // Every new token's K/V goes into its slot before any attention reads (a token attends
    // to the tokens of its own chunk).
    write_new_kv(plan, l);
    attention(plan, l, s.q.data(), s.attn.data());
    project(w.o_proj.data(), w.o_bias, hidden, c.q_dim(), s.attn.data(), n, s.proj.data());
    if (c.gemma()) {  // Gemma normalises the attention's output before the residual add
      for (int64_t t = 0; t < n; ++t)
        kernels::rms_norm(s.proj.data() + t * hidden, g.post_attention.data(), hidden, eps, s.proj.data() + t * hidden);
    }
    for (int64_t i = 0; i < n * hidden; ++i) s.x[static_cast<std::size_t>(i)] += s.proj[static_cast<std::size_t>(i)];

    mlp(w, g, n);
  }

  if (num_rows == 0) return;
  resize(s.final_h, num_rows * hidden);
  for (int64_t r = 0; r < num_rows; ++r)
    kernels::rms_norm(s.x.data() + logit_tokens[static_cast<std::size_t>(r)] * hidden, final_gain_.data(), hidden, eps,
                      s.final_h.data() + r * hidden);
  project(model_->weights.output_embedding(c).data(), VectorF(), c.vocab_size, hidden, s.final_h.data(), num_rows,
          out.logits.data());
  apply_final_softcap(c, out.logits.data(), num_rows * c.vocab_size);
}

}  // namespace kvp
