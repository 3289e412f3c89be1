// The CUDA backend (cuda_backend.h) in the flavour this translation unit is compiled for:
// emulated (library kvp_cuda_backend, this file) or device (cuda_backend_device.cc includes
// it with KVP_CUDA_DEVICE_FLAVOUR). Everything here is in kvp::cuda_backend::emu or ::dev,
// or has internal linkage, so both flavours link into one program.
#include "optimized/backends/cuda_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/text.h"
#include "kernels/cuda/model_kernels.h"
#include "kernels/kv_element.h"
#include "kernels/kv_index.h"
#include "model/rope.h"
#include "optimized/backends/plan_validation.h"
#include "optimized/backends/plugin_attention.h"
#include "optimized/kv/kv_groups.h"

namespace kvp::cuda_backend::KVP_CUDA_FLAVOUR_NS {

namespace ck = cuda_kernels::KVP_CUDA_FLAVOUR_NS;

namespace {

Status cuda_status(const std::string& error) { return error.empty() ? Status::ok() : Status::error(error); }

#define KVP_CUDA_RETURN_IF_ERROR(expr) KVP_RETURN_IF_ERROR(cuda_status(expr))

// The memory an attention plug-in must work in: the device flavour's pools are CUDA device
// memory; the emulated flavour's "device" memory is host memory, so it runs host plug-ins.
#if defined(KVP_CUDA_DEVICE_FLAVOUR)
constexpr int32_t kPluginDevice = KVP_DEVICE_CUDA;
#else
constexpr int32_t kPluginDevice = KVP_DEVICE_HOST;
#endif

}  // namespace

// A grow-only device buffer for one step's activations or plan arrays. (Not in the anonymous
// namespace: cuda_backend_device.cc includes this file, and GCC's -Wsubobject-linkage then
// objects to an internal type as a member of CudaBackend::Device.)
struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t capacity = 0;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// This flavour's backend; its contract is in cuda_backend.h.
class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(const Model& model, const CudaBackendConfig& config);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Status execute(const BatchPlan& plan, StepOutput& out) override;
  const char* name() const override;
  const KvPoolShape& pool_shape() const override { return config_.pool; }
  Status read_block(PoolKind pool, int64_t layer, int32_t block, std::vector<float>& k,
                    std::vector<float>& v) const override;
  int64_t audited_block_reads() const override { return audited_block_reads_; }
  int64_t graph_replays() const override { return graph_replays_; }

 private:
  struct Device;
  // What a step's kernels run over: its tokens (padded ones included), its logit rows, the
  // block tables' width and the attention grid's partitions. A graph is captured per shape.
  // tokens: rows of every token buffer (and of each group's slots); rows: logit rows;
  // table_rows: block-table rows of each KV-cache group.
  struct StepShape {
    int64_t tokens = 0, rows = 0, table_width = 0, partitions = 0, table_rows = 0;
    friend bool operator==(const StepShape&, const StepShape&) = default;
  };
  CudaBackend(const Model& model, const CudaBackendConfig& config);
  Status init();
  Status run_ops(const KvPlanOps& ops);
  Status run_model(const BatchPlan& plan, StepOutput& out);
  // A decode step through a CUDA graph (CudaBackendConfig::max_graph_tokens).
  bool graph_eligible(const BatchPlan& plan) const;
  // Attention partitions of the plan's longest context; each token's own count is fixed by
  // its position, so the batch only sizes the grid, never a token's split points.
  int64_t partitions_for(const BatchPlan& plan) const;
  Status run_decode_graph(const BatchPlan& plan, StepOutput& out);
  // The step buffers sized for `shape` (allocations happen here, never inside a capture).
  Status prepare_buffers(const StepShape& shape);
  // Every kernel of the step, over the uploaded plan arrays (no allocation, no copy: what a
  // graph captures), with the final norm and LM head when shape.rows > 0.
  Status forward(const BatchPlan& plan, const StepShape& shape);
  // One layer's attention of the step's tokens: kvproof's kernel, or the plug-in's.
  Status attend(const BatchPlan& plan, std::size_t layer, const float* q, float* out, const StepShape& shape);
  const float* layer_scale(const float* scales, std::size_t l) const;

  ModelConfig model_config_;
  const Model* model_for_init_ = nullptr;  // only during create()
  CudaBackendConfig config_;
  // The pool's K/V arrays: one per slot of a block (layout_.group_size); layer l's at
  // layout_.layer_slot[l], reading its group's (layer_group[l]) table rows and slots.
  KvGroupLayout layout_;
  PlanLimits limits_;
  int64_t audited_block_reads_ = 0;
  int64_t graph_replays_ = 0;
  std::unique_ptr<Device> dev_;
};

struct CudaBackend::Device {
  struct Layer {
    float *input_layernorm = nullptr, *post_attention_layernorm = nullptr;
    ck::Weights q, k, v, o, gate, up, down;  // fp32 or bf16 (CudaBackendConfig::weight_dtype)
    // Biases; null when the model has none.
    float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr, *o_bias = nullptr;
    float *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
    // Gemma's MLP norms and Gemma 3's q/k norms; null elsewhere. Every norm pointer holds the
    // gain (norm_gain: Gemma's 1 + w).
    float *pre_feedforward_layernorm = nullptr, *post_feedforward_layernorm = nullptr;
    float *q_norm = nullptr, *k_norm = nullptr;
    bool local_rope = false;  // Gemma 3's sliding layer: local_inv_freq
  };
  std::vector<void*> owned;   // device allocations, freed at destruction
  std::vector<void*> pinned;  // pinned host allocations
  std::vector<Layer> layers;
  ck::Weights embed;
  float* norm = nullptr;
  ck::Weights lm_head;
  float* inv_freq = nullptr;
  float* local_inv_freq = nullptr;  // Gemma 3's sliding layers' RoPE; null when none
  float* k_scales = nullptr;        // fp8 pools: [layers][kv heads]; else null
  float* v_scales = nullptr;
  std::vector<std::byte*> k_pool, v_pool;  // device, per layer, of kv_dtype
  std::vector<std::byte*> host_k, host_v;  // pinned host, per layer, of kv_dtype
  // Step buffers.
  DeviceBuffer x, h, q, k, v, attn, attn_workspace, proj, gate, up, final_h, logits;
  // The one-launch attention merge's tickets, n * num_kv_heads words: zeroed when allocated,
  // left zero by every attention launch.
  DeviceBuffer merge_counters;
  DeviceBuffer token_ids, positions, slots, seq_of_token, block_tables, logit_rows;
  DeviceBuffer query_start, context_lens;  // only for an attention plug-in
  // Bumped whenever a step buffer is reallocated: a graph captured before holds the old
  // pointers and is dropped (run_decode_graph).
  uint64_t buffer_generation = 0;
  // Decode graphs: the stream they are captured on and replayed on, and one per shape.
  void* stream = nullptr;
  struct Graph {
    StepShape shape;
    void* exec = nullptr;
  };
  std::vector<Graph> graphs;
  uint64_t graphs_generation = 0;  // buffer_generation when `graphs` were captured

  void drop_graphs() {
    for (const Graph& g : graphs) ck::graph_destroy(g.exec);
    graphs.clear();
  }

  ~Device() {
    drop_graphs();
    ck::stream_destroy(stream);
    for (void* p : owned) ck::device_free(p);
    for (void* p : pinned) ck::pinned_free(p);
    for (DeviceBuffer* b : {&x,
                            &h,
                            &q,
                            &k,
                            &v,
                            &attn,
                            &attn_workspace,
                            &merge_counters,
                            &proj,
                            &gate,
                            &up,
                            &final_h,
                            &logits,
                            &token_ids,
                            &positions,
                            &slots,
                            &seq_of_token,
                            &block_tables,
                            &logit_rows,
                            &query_start,
                            &context_lens})
      ck::device_free(b->ptr);
  }

  Status alloc(float** ptr, int64_t floats) {
    void* p = nullptr;
    KVP_CUDA_RETURN_IF_ERROR(ck::device_alloc(&p, static_cast<std::size_t>(floats) * sizeof(float)));
    owned.push_back(p);
    *ptr = static_cast<float*>(p);
    return Status::ok();
  }
  Status upload(float** ptr, const float* host, int64_t floats) {
    KVP_RETURN_IF_ERROR(alloc(ptr, floats));
    return cuda_status(ck::copy_to_device(*ptr, host, static_cast<std::size_t>(floats) * sizeof(float)));
  }
  // A weight matrix as `dtype` (kF32 or kBF16); bf16 only when every value is one (else an
  // error naming `name`, the value and its index): the widening read gives back the value.
  Status upload_weights(ck::Weights* dst, const float* host, int64_t floats, DType dtype, const std::string& name) {
    if (dtype == DType::kF32) {
      float* p = nullptr;
      KVP_RETURN_IF_ERROR(upload(&p, host, floats));
      *dst = ck::Weights(p);
      return Status::ok();
    }
    std::vector<uint16_t> bits(static_cast<std::size_t>(floats));
    for (int64_t i = 0; i < floats; ++i) {
      const float value = host[i];
      bits[static_cast<std::size_t>(i)] = float_to_bf16(value);
      if (std::bit_cast<uint32_t>(bf16_to_float(bits[static_cast<std::size_t>(i)])) != std::bit_cast<uint32_t>(value))
        return Status::error("weight_dtype bf16: tensor " + name + " element " + std::to_string(i) + " = " +
                             std::to_string(value) +
                             " is not a bf16 value (round the model's weights to bf16 first, so that the reference "
                             "computes with the values the kernels read)");
    }
    void* p = nullptr;
    KVP_CUDA_RETURN_IF_ERROR(ck::device_alloc(&p, bits.size() * sizeof(uint16_t)));
    owned.push_back(p);
    KVP_CUDA_RETURN_IF_ERROR(ck::copy_to_device(p, bits.data(), bits.size() * sizeof(uint16_t)));
    *dst = ck::Weights(p, /*is_bf16=*/true);
    return Status::ok();
  }
  Status ensure(DeviceBuffer& b, std::size_t bytes) {
    if (b.capacity >= bytes && b.ptr != nullptr) return Status::ok();
    ++buffer_generation;
    ck::device_free(b.ptr);
    b.ptr = nullptr;
    b.capacity = 0;
    KVP_CUDA_RETURN_IF_ERROR(ck::device_alloc(&b.ptr, bytes));
    b.capacity = bytes;
    return Status::ok();
  }
  // As ensure, with the whole buffer zero when it is (re)allocated.
  Status ensure_zeroed(DeviceBuffer& b, std::size_t bytes) {
    if (b.capacity >= bytes && b.ptr != nullptr) return Status::ok();
    KVP_RETURN_IF_ERROR(ensure(b, bytes));
    const std::vector<std::byte> zeros(bytes);
    return cuda_status(ck::copy_to_device(b.ptr, zeros.data(), bytes));
  }
  template <class T>
  Status upload_vector(DeviceBuffer& b, const std::vector<T>& host) {
    KVP_RETURN_IF_ERROR(ensure(b, host.size() * sizeof(T)));
    return cuda_status(ck::copy_to_device(b.ptr, host.data(), host.size() * sizeof(T)));
  }
};

// Layer l's scales in a [layers][kv heads] device array; null stays null (no scales).
const float* CudaBackend::layer_scale(const float* scales, std::size_t l) const {
  return scales == nullptr ? nullptr : scales + l * static_cast<std::size_t>(model_config_.num_kv_heads);
}

namespace {
ck::AttentionVariant attention_variant(PlantedAttentionBug planted) {
  switch (planted) {
    case PlantedAttentionBug::kNone: return ck::AttentionVariant::kExact;
    case PlantedAttentionBug::kBf16Accumulator: return ck::AttentionVariant::kBf16Accumulator;
    case PlantedAttentionBug::kDropKvScales: return ck::AttentionVariant::kDropKvScales;
  }
  return ck::AttentionVariant::kExact;
}
}  // namespace

CudaBackend::CudaBackend(const Model& model, const CudaBackendConfig& config)
    : model_config_(model.config), model_for_init_(&model), config_(config), dev_(std::make_unique<Device>()) {
  const ModelConfig& c = model.config;
  layout_ = kv_group_layout(c, config.kv_groups);
  limits_ = {c.vocab_size, c.max_position_embeddings, layout_.num_groups() == 1 ? layout_.group_windows[0] : 0,
             layout_.manager_group_windows()};
}

CudaBackend::~CudaBackend() = default;

const char* CudaBackend::name() const { return KVP_CUDA_FLAVOUR_NAME; }

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const Model& model, const CudaBackendConfig& config) {
  const std::string context = std::string(KVP_CUDA_FLAVOUR_NAME) + " backend config";
  KVP_RETURN_IF_ERROR(model.config.validate().with_context("model config"));
  KVP_RETURN_IF_ERROR(config.validate().with_context(context));
  KVP_RETURN_IF_ERROR(check_pool_matches_model(config.pool, model.config).with_context(context));
  // With a plug-in, the plug-in's supports() says which shapes it takes, at every step.
  if (config.attention_plugin != nullptr) {
    KVP_RETURN_IF_ERROR(
        check_plugin_for_backend(*config.attention_plugin, KVP_CUDA_FLAVOUR_NAME, kPluginDevice, config.pool.kv_dtype)
            .with_context(context));
    KVP_RETURN_IF_ERROR(check_plugin_for_model(*config.attention_plugin, model.config).with_context(context));
  } else {
    KVP_RETURN_IF_ERROR(
        cuda_status(ck::check_attention_shape(model.config.num_heads, model.config.num_kv_heads, model.config.head_dim))
            .with_context(context));
  }
  const int64_t per_block = static_cast<int64_t>(config.pool.block_size) * model.config.kv_dim();
  const int64_t max_blocks = std::max(config.pool.num_device_blocks, config.pool.num_host_blocks);
  if (per_block > (int64_t{1} << 40) / std::max<int64_t>(max_blocks, 1))
    return Status::error(context + ": pool of " + str(max_blocks) + " blocks of " + str(per_block) +
                         " elements is too large");
  KVP_CUDA_RETURN_IF_ERROR(ck::check_device());
  std::unique_ptr<CudaBackend> b(new CudaBackend(model, config));
  const Status s = b->init();
  b->model_for_init_ = nullptr;
  if (!s) return s.with_context(KVP_CUDA_FLAVOUR_NAME);
  return b;
}

Status CudaBackend::init() {
  const Model& m = *model_for_init_;
  const ModelConfig& c = model_config_;
  Device& d = *dev_;
  const auto up = [&](float** p, const auto& tensor) {
    return d.upload(p, tensor.data(), static_cast<int64_t>(tensor.size()));
  };
  const auto up_w = [&](ck::Weights* p, const auto& tensor, const std::string& name) {
    return d.upload_weights(p, tensor.data(), static_cast<int64_t>(tensor.size()), config_.weight_dtype, name);
  };
  KVP_RETURN_IF_ERROR(up_w(&d.embed, m.weights.embed_tokens, "embed_tokens"));
  KVP_RETURN_IF_ERROR(up(&d.norm, norm_gain(c, m.weights.norm)));
  if (c.tie_word_embeddings) {
    d.lm_head = d.embed;
  } else {
    KVP_RETURN_IF_ERROR(up_w(&d.lm_head, m.weights.lm_head, "lm_head"));
  }
  for (const LayerWeights& w : m.weights.layers) {
    Device::Layer l;
    const std::string layer = "layers." + std::to_string(d.layers.size()) + ".";
    KVP_RETURN_IF_ERROR(up(&l.input_layernorm, norm_gain(c, w.input_layernorm)));
    KVP_RETURN_IF_ERROR(up_w(&l.q, w.q_proj, layer + "q_proj"));
    KVP_RETURN_IF_ERROR(up_w(&l.k, w.k_proj, layer + "k_proj"));
    KVP_RETURN_IF_ERROR(up_w(&l.v, w.v_proj, layer + "v_proj"));
    KVP_RETURN_IF_ERROR(up_w(&l.o, w.o_proj, layer + "o_proj"));
    KVP_RETURN_IF_ERROR(up(&l.post_attention_layernorm, norm_gain(c, w.post_attention_layernorm)));
    for (auto [dst, norm] : {std::pair{&l.pre_feedforward_layernorm, &w.pre_feedforward_layernorm},
                             {&l.post_feedforward_layernorm, &w.post_feedforward_layernorm},
                             {&l.q_norm, &w.q_norm},
                             {&l.k_norm, &w.k_norm}}) {
      if (norm->size() != 0) KVP_RETURN_IF_ERROR(up(dst, norm_gain(c, *norm)));
    }
    l.local_rope = c.layer_uses_local_rope(static_cast<int64_t>(d.layers.size()));
    KVP_RETURN_IF_ERROR(up_w(&l.gate, w.gate_proj, layer + "gate_proj"));
    KVP_RETURN_IF_ERROR(up_w(&l.up, w.up_proj, layer + "up_proj"));
    KVP_RETURN_IF_ERROR(up_w(&l.down, w.down_proj, layer + "down_proj"));
    for (auto [dst, bias] : {std::pair{&l.q_bias, &w.q_bias},
                             {&l.k_bias, &w.k_bias},
                             {&l.v_bias, &w.v_bias},
                             {&l.o_bias, &w.o_bias},
                             {&l.gate_bias, &w.gate_bias},
                             {&l.up_bias, &w.up_bias},
                             {&l.down_bias, &w.down_bias}}) {
      if (bias->size() != 0) KVP_RETURN_IF_ERROR(up(dst, *bias));
    }
    d.layers.push_back(l);
  }
  const std::vector<float> inv_freq = rope_inv_freq<float>(c);
  KVP_RETURN_IF_ERROR(d.upload(&d.inv_freq, inv_freq.data(), static_cast<int64_t>(inv_freq.size())));
  if (c.has_local_rope()) {
    const std::vector<float> local = rope_local_inv_freq<float>(c);
    KVP_RETURN_IF_ERROR(d.upload(&d.local_inv_freq, local.data(), static_cast<int64_t>(local.size())));
  }
  if (!config_.pool.k_scales.empty()) {
    KVP_RETURN_IF_ERROR(
        d.upload(&d.k_scales, config_.pool.k_scales.data(), static_cast<int64_t>(config_.pool.k_scales.size())));
    KVP_RETURN_IF_ERROR(
        d.upload(&d.v_scales, config_.pool.v_scales.data(), static_cast<int64_t>(config_.pool.v_scales.size())));
  }

  const int64_t per_block = config_.pool.elements_per_block();
  const std::size_t element = dtype_size(config_.pool.kv_dtype);
  const int64_t device_elements = per_block * config_.pool.num_device_blocks;
  const int64_t host_elements = per_block * config_.pool.num_host_blocks;
  // The host pool's start value, one element of kv_dtype: its quiet NaN or zero.
  std::vector<std::byte> fill(element, std::byte{0});
  if (config_.nan_fill_at_start) kernels::kv_element_store_nan(config_.pool.kv_dtype, fill.data());
  for (int64_t l = 0; l < layout_.group_size; ++l) {
    for (std::vector<std::byte*>* pool : {&d.k_pool, &d.v_pool}) {
      void* p = nullptr;
      KVP_CUDA_RETURN_IF_ERROR(ck::device_alloc(&p, static_cast<std::size_t>(device_elements) * element));
      d.owned.push_back(p);
      if (config_.nan_fill_at_start) {
        KVP_CUDA_RETURN_IF_ERROR(ck::fill_kv_nan(p, device_elements, config_.pool.kv_dtype));
      } else {
        const std::vector<std::byte> zeros(static_cast<std::size_t>(device_elements) * element, std::byte{0});
        KVP_CUDA_RETURN_IF_ERROR(ck::copy_to_device(p, zeros.data(), zeros.size()));
      }
      pool->push_back(static_cast<std::byte*>(p));
    }
    for (std::vector<std::byte*>* pool : {&d.host_k, &d.host_v}) {
      void* p = nullptr;
      KVP_CUDA_RETURN_IF_ERROR(ck::pinned_alloc(&p, static_cast<std::size_t>(host_elements) * element));
      d.pinned.push_back(p);
      auto* bytes = static_cast<std::byte*>(p);
      for (int64_t i = 0; i < host_elements; ++i) std::memcpy(bytes + i * element, fill.data(), element);
      pool->push_back(bytes);
    }
  }
  return cuda_status(ck::synchronize());
}

Status CudaBackend::read_block(PoolKind pool, int64_t layer, int32_t block, std::vector<float>& k,
                               std::vector<float>& v) const {
  const bool host = pool == PoolKind::kHost;
  const int32_t blocks = host ? config_.pool.num_host_blocks : config_.pool.num_device_blocks;
  if (layer < 0 || layer >= model_config_.num_layers)
    return Status::error("read_block: layer " + str(layer) + " out of range");
  if (block < 0 || block >= blocks) return Status::error("read_block: block " + str(block) + " out of range");
  const int64_t per_block = config_.pool.elements_per_block();
  const std::size_t element = dtype_size(config_.pool.kv_dtype);
  const std::size_t bytes = static_cast<std::size_t>(per_block) * element;
  const std::size_t at = static_cast<std::size_t>(block) * bytes;
  const auto l = static_cast<std::size_t>(layout_.layer_slot[static_cast<std::size_t>(layer)]);
  std::vector<std::byte> raw_k(bytes), raw_v(bytes);
  if (host) {
    std::memcpy(raw_k.data(), dev_->host_k[l] + at, bytes);
    std::memcpy(raw_v.data(), dev_->host_v[l] + at, bytes);
  } else {
    KVP_CUDA_RETURN_IF_ERROR(ck::copy_to_host(raw_k.data(), dev_->k_pool[l] + at, bytes));
    KVP_CUDA_RETURN_IF_ERROR(ck::copy_to_host(raw_v.data(), dev_->v_pool[l] + at, bytes));
  }
  config_.pool.block_to_float(layer, true, raw_k.data(), k);
  config_.pool.block_to_float(layer, false, raw_v.data(), v);
  return Status::ok();
}

Status CudaBackend::execute(const BatchPlan& plan, StepOutput& out) {
  auto reads = preflight_plan(plan, config_.pool, limits_);
  if (!reads) return reads.status();
  audited_block_reads_ += *reads;
  KVP_RETURN_IF_ERROR(run_ops(plan.ops).with_context(KVP_CUDA_FLAVOUR_NAME));
  KVP_RETURN_IF_ERROR(run_model(plan, out).with_context(KVP_CUDA_FLAVOUR_NAME));
  return cuda_status(ck::synchronize()).with_context(KVP_CUDA_FLAVOUR_NAME);
}

Status CudaBackend::run_ops(const KvPlanOps& ops) {
  Device& d = *dev_;
  const int64_t per_block = config_.pool.elements_per_block();
  const std::size_t bytes = static_cast<std::size_t>(per_block) * dtype_size(config_.pool.kv_dtype);
  const auto block_at = [bytes](std::byte* pool, int32_t block) {
    return pool + static_cast<std::size_t>(block) * bytes;
  };
  const auto layers = static_cast<std::size_t>(layout_.group_size);  // K/V arrays
  // Swaps go through the pinned host pool.
  for (const BlockCopy& s : ops.swap_out) {
    for (std::size_t l = 0; l < layers; ++l) {
      KVP_CUDA_RETURN_IF_ERROR(ck::copy_to_host(block_at(d.host_k[l], s.dst), block_at(d.k_pool[l], s.src), bytes));
      KVP_CUDA_RETURN_IF_ERROR(ck::copy_to_host(block_at(d.host_v[l], s.dst), block_at(d.v_pool[l], s.src), bytes));
    }
  }
  for (const BlockCopy& s : ops.block_copies) {
    for (std::size_t l = 0; l < layers; ++l) {
      KVP_CUDA_RETURN_IF_ERROR(
          ck::copy_device_to_device(block_at(d.k_pool[l], s.dst), block_at(d.k_pool[l], s.src), bytes));
      KVP_CUDA_RETURN_IF_ERROR(
          ck::copy_device_to_device(block_at(d.v_pool[l], s.dst), block_at(d.v_pool[l], s.src), bytes));
    }
  }
  for (int32_t b : ops.poison) {
    for (std::size_t l = 0; l < layers; ++l) {
      KVP_CUDA_RETURN_IF_ERROR(ck::fill_kv_nan(block_at(d.k_pool[l], b), per_block, config_.pool.kv_dtype));
      KVP_CUDA_RETURN_IF_ERROR(ck::fill_kv_nan(block_at(d.v_pool[l], b), per_block, config_.pool.kv_dtype));
    }
  }
  for (const BlockCopy& s : ops.swap_in) {
    for (std::size_t l = 0; l < layers; ++l) {
      KVP_CUDA_RETURN_IF_ERROR(ck::copy_to_device(block_at(d.k_pool[l], s.dst), block_at(d.host_k[l], s.src), bytes));
      KVP_CUDA_RETURN_IF_ERROR(ck::copy_to_device(block_at(d.v_pool[l], s.dst), block_at(d.host_v[l], s.src), bytes));
    }
  }
  return Status::ok();
}

Status CudaBackend::run_model(const BatchPlan& plan, StepOutput& out) {
  const ModelConfig& c = model_config_;
  Device& d = *dev_;
  const int64_t n = plan.num_tokens();

  std::vector<int32_t> seq_of_token;
  const std::vector<int32_t> logit_tokens = lay_out_logit_rows(plan, c.vocab_size, out, seq_of_token);
  if (n == 0) return Status::ok();
  if (graph_eligible(plan)) return run_decode_graph(plan, out);

  const StepShape shape{n, static_cast<int64_t>(logit_tokens.size()), plan.max_blocks_per_seq, partitions_for(plan),
                        plan.num_seqs()};
  KVP_RETURN_IF_ERROR(prepare_buffers(shape));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.token_ids, plan.token_ids));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.positions, plan.positions));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.slots, plan.slot_mapping));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.seq_of_token, seq_of_token));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.block_tables, plan.block_tables));
  if (shape.rows > 0) KVP_RETURN_IF_ERROR(d.upload_vector(d.logit_rows, logit_tokens));
  KVP_RETURN_IF_ERROR(forward(plan, shape));
  if (shape.rows == 0) return Status::ok();
  const std::size_t logit_floats = static_cast<std::size_t>(shape.rows * c.vocab_size);
  KVP_RETURN_IF_ERROR(cuda_status(ck::copy_to_host(out.logits.data(), d.logits.ptr, logit_floats * sizeof(float))));
  apply_final_softcap(c, out.logits.data(), shape.rows * c.vocab_size);
  return Status::ok();
}

int64_t CudaBackend::partitions_for(const BatchPlan& plan) const {
  const int32_t max_position =
      plan.positions.empty() ? 0 : *std::max_element(plan.positions.begin(), plan.positions.end());
  return ck::attention_partitions(max_position, config_.attention_partition);
}

bool CudaBackend::graph_eligible(const BatchPlan& plan) const {
  if (config_.max_graph_tokens == 0 || config_.attention_plugin != nullptr) return false;
  if (graph_tokens(plan.num_tokens(), config_.max_graph_tokens) == 0) return false;
  if (plan.num_tokens() != plan.num_seqs()) return false;
  for (int64_t i = 0; i < plan.num_seqs(); ++i)
    if (logit_rows_for(plan, i) != 1) return false;
  return true;  // one token per sequence (query_start is 0, 1, ..., n), each with its logits
}

// A decode step of n tokens run as graph_tokens(n) = b: tokens n..b-1 are padding (token 0
// at position 0, no slot: kSkipSlot, so they write nothing; a block table of block 0 alone,
// so their attention reads one valid slot; their own rows of every buffer, dropped at the
// end). Every kernel computes each token's row from that token's inputs alone (N1), so the
// real rows get the bits an unpadded eager step gives them.
Status CudaBackend::run_decode_graph(const BatchPlan& plan, StepOutput& out) {
  const ModelConfig& c = model_config_;
  Device& d = *dev_;
  const int64_t n = plan.num_tokens();
  const int64_t b = graph_tokens(n, config_.max_graph_tokens);
  const auto pow2 = [](int64_t x) {
    int64_t p = 1;
    while (p < x) p *= 2;
    return p;
  };
  const StepShape shape{b, b, pow2(std::max<int64_t>(plan.max_blocks_per_seq, 1)), pow2(partitions_for(plan)), b};
  const auto un = static_cast<std::size_t>(n);
  const auto ub = static_cast<std::size_t>(b);
  std::vector<int32_t> token_ids = plan.token_ids, positions = plan.positions, rows(ub);
  token_ids.resize(ub, 0);
  positions.resize(ub, 0);
  for (std::size_t t = 0; t < ub; ++t) rows[t] = static_cast<int32_t>(t);  // token t: sequence t, logit row t
  // Every KV-cache group's slots and table rows, each padded to b tokens.
  const auto groups = static_cast<std::size_t>(plan.num_groups);
  std::vector<int64_t> slots(groups * ub, kernels::kSkipSlot);
  const auto width = static_cast<std::size_t>(shape.table_width);
  const auto plan_width = static_cast<std::size_t>(plan.max_blocks_per_seq);
  std::vector<int32_t> tables(groups * ub * width, -1);
  for (std::size_t g = 0; g < groups; ++g) {
    std::copy_n(plan.group_slots(static_cast<int64_t>(g)), un, slots.begin() + static_cast<std::ptrdiff_t>(g * ub));
    for (std::size_t t = 0; t < ub; ++t) {
      int32_t* row = tables.data() + (g * ub + t) * width;
      if (t < un) {
        std::copy_n(plan.table_row(static_cast<int64_t>(g), static_cast<int64_t>(t)), plan_width, row);
      } else {
        row[0] = 0;
      }
    }
  }
  KVP_RETURN_IF_ERROR(prepare_buffers(shape));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.token_ids, token_ids));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.positions, positions));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.slots, slots));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.seq_of_token, rows));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.block_tables, tables));
  KVP_RETURN_IF_ERROR(d.upload_vector(d.logit_rows, rows));
  if (d.stream == nullptr) KVP_CUDA_RETURN_IF_ERROR(ck::stream_create(&d.stream));
  // A graph holds the buffers' pointers: any reallocation since it was captured drops it.
  if (d.graphs_generation != d.buffer_generation) {
    d.drop_graphs();
    d.graphs_generation = d.buffer_generation;
  }
  const auto found =
      std::find_if(d.graphs.begin(), d.graphs.end(), [&](const Device::Graph& g) { return g.shape == shape; });
  void* exec = found == d.graphs.end() ? nullptr : found->exec;
  if (exec == nullptr) {
    KVP_CUDA_RETURN_IF_ERROR(ck::begin_capture(d.stream));
    const Status captured = forward(plan, shape);
    const std::string ended = ck::end_capture(d.stream, &exec);  // always ends the capture
    KVP_RETURN_IF_ERROR(captured.with_context("capturing a decode graph"));
    KVP_CUDA_RETURN_IF_ERROR(ended);
    d.graphs.push_back({shape, exec});
  }
  KVP_CUDA_RETURN_IF_ERROR(ck::graph_replay(exec, d.stream));
  ++graph_replays_;
  const std::size_t logit_floats = un * static_cast<std::size_t>(c.vocab_size);  // the real rows, 0..n-1
  KVP_RETURN_IF_ERROR(cuda_status(ck::copy_to_host(out.logits.data(), d.logits.ptr, logit_floats * sizeof(float))));
  apply_final_softcap(c, out.logits.data(), n * c.vocab_size);
  return Status::ok();
}

Status CudaBackend::prepare_buffers(const StepShape& s) {
  const ModelConfig& c = model_config_;
  Device& d = *dev_;
  const auto fbytes = [](int64_t floats) { return static_cast<std::size_t>(floats) * sizeof(float); };
  const int64_t n = s.tokens;
  KVP_RETURN_IF_ERROR(d.ensure(d.x, fbytes(n * c.hidden_size)));
  KVP_RETURN_IF_ERROR(d.ensure(d.h, fbytes(n * c.hidden_size)));
  KVP_RETURN_IF_ERROR(d.ensure(d.q, fbytes(n * c.q_dim())));
  KVP_RETURN_IF_ERROR(d.ensure(d.k, fbytes(n * c.kv_dim())));
  KVP_RETURN_IF_ERROR(d.ensure(d.v, fbytes(n * c.kv_dim())));
  KVP_RETURN_IF_ERROR(d.ensure(d.attn, fbytes(n * c.q_dim())));
  KVP_RETURN_IF_ERROR(
      d.ensure(d.attn_workspace, fbytes(ck::attention_workspace_floats(n, c.num_heads, c.head_dim, s.partitions))));
  KVP_RETURN_IF_ERROR(
      d.ensure_zeroed(d.merge_counters, static_cast<std::size_t>(n * c.num_kv_heads) * sizeof(int32_t)));
  KVP_RETURN_IF_ERROR(d.ensure(d.proj, fbytes(n * c.hidden_size)));
  KVP_RETURN_IF_ERROR(d.ensure(d.gate, fbytes(n * c.intermediate_size)));
  KVP_RETURN_IF_ERROR(d.ensure(d.up, fbytes(n * c.intermediate_size)));
  if (s.rows == 0) return Status::ok();
  KVP_RETURN_IF_ERROR(d.ensure(d.final_h, fbytes(s.rows * c.hidden_size)));
  return d.ensure(d.logits, fbytes(s.rows * c.vocab_size));
}

Status CudaBackend::forward(const BatchPlan& plan, const StepShape& shape) {
  const ModelConfig& c = model_config_;
  Device& d = *dev_;
  const int64_t n = shape.tokens;
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* x = d.x.as<float>();
  float* h = d.h.as<float>();
  float* q = d.q.as<float>();
  float* k = d.k.as<float>();
  float* v = d.v.as<float>();
  float* attn = d.attn.as<float>();
  float* proj = d.proj.as<float>();
  float* gate = d.gate.as<float>();
  float* upv = d.up.as<float>();
  const int32_t* positions = d.positions.as<int32_t>();

  // Seven launches a layer (the fused kernels of model_kernels.h; eight with Gemma 3's q/k
  // norms): the q/k/v projections with RoPE and the KV write; attention (its merge in the same
  // launch); the o projection; the residual add
  // with the norms around it; gate, up and the activation; the down projection; the residual
  // add with the next layer's input norm. Each gives the unfused kernels' bits.
  KVP_CUDA_RETURN_IF_ERROR(ck::embed(d.embed, d.token_ids.as<int32_t>(), n, hidden, x, c.embed_scale()));
  if (!d.layers.empty())
    KVP_CUDA_RETURN_IF_ERROR(ck::rms_norm(x, nullptr, d.layers[0].input_layernorm, n, hidden, eps, h));
  for (std::size_t l = 0; l < d.layers.size(); ++l) {
    const Device::Layer& w = d.layers[l];
    const float* inv_freq = w.local_rope ? d.local_inv_freq : d.inv_freq;
    // The layer's K/V array and its KV-cache group's slots.
    const auto array = static_cast<std::size_t>(layout_.layer_slot[l]);
    const int64_t* slots = d.slots.as<int64_t>() + layout_.layer_group[l] * n;
    // Every new token's K/V goes into its slot before attention reads (same stream: ordered).
    if (c.qk_norm()) {  // Gemma 3: each head's RMSNorm (over the whole head) before RoPE
      KVP_CUDA_RETURN_IF_ERROR(
          ck::project_qkv(w.q, w.q_bias, w.k, w.k_bias, w.v, w.v_bias, c.q_dim(), c.kv_dim(), hidden, h, n, q, k, v));
      KVP_CUDA_RETURN_IF_ERROR(ck::heads_rope_kv(q, k, v, n, c.num_heads, c.num_kv_heads, c.head_dim, w.q_norm,
                                                 w.k_norm, eps, positions, inv_freq, slots, config_.pool.kv_dtype,
                                                 d.k_pool[array], d.v_pool[array], layer_scale(d.k_scales, l),
                                                 layer_scale(d.v_scales, l)));
    } else {
      KVP_CUDA_RETURN_IF_ERROR(ck::project_qkv_rope_kv(
          w.q, w.q_bias, w.k, w.k_bias, w.v, w.v_bias, c.num_heads, c.num_kv_heads, c.head_dim, hidden, h, n, positions,
          inv_freq, slots, q, k, v, config_.pool.kv_dtype, d.k_pool[array], d.v_pool[array], layer_scale(d.k_scales, l),
          layer_scale(d.v_scales, l)));
    }
    KVP_RETURN_IF_ERROR(attend(plan, l, q, attn, shape));
    KVP_CUDA_RETURN_IF_ERROR(ck::project(w.o, w.o_bias, hidden, c.q_dim(), attn, n, proj));
    // Gemma: the attention's output normalised before the add, GeGLU between the pre- and
    // post-feedforward norms.
    KVP_CUDA_RETURN_IF_ERROR(ck::add_norm(proj, c.gemma() ? w.post_attention_layernorm : nullptr, x,
                                          c.gemma() ? w.pre_feedforward_layernorm : w.post_attention_layernorm, n,
                                          hidden, eps, h));
    KVP_CUDA_RETURN_IF_ERROR(ck::project_gated(w.gate, w.gate_bias, w.up, w.up_bias, c.intermediate_size, hidden, h, n,
                                               c.gemma(), gate, upv));
    KVP_CUDA_RETURN_IF_ERROR(ck::project(w.down, w.down_bias, hidden, c.intermediate_size, gate, n, proj));
    const float* next_norm = l + 1 < d.layers.size() ? d.layers[l + 1].input_layernorm : nullptr;
    KVP_CUDA_RETURN_IF_ERROR(
        ck::add_norm(proj, c.gemma() ? w.post_feedforward_layernorm : nullptr, x, next_norm, n, hidden, eps, h));
  }
  if (shape.rows == 0) return Status::ok();
  KVP_CUDA_RETURN_IF_ERROR(
      ck::rms_norm(x, d.logit_rows.as<int32_t>(), d.norm, shape.rows, hidden, eps, d.final_h.as<float>()));
  KVP_CUDA_RETURN_IF_ERROR(
      ck::project(d.lm_head, nullptr, c.vocab_size, hidden, d.final_h.as<float>(), shape.rows, d.logits.as<float>()));
  return Status::ok();
}

Status CudaBackend::attend(const BatchPlan& plan, std::size_t layer, const float* q, float* out,
                           const StepShape& shape) {
  const ModelConfig& c = model_config_;
  Device& d = *dev_;
  if (config_.attention_plugin == nullptr) {
    const float scale = c.attention_scale();
    const auto array = static_cast<std::size_t>(layout_.layer_slot[layer]);
    const int32_t* tables =
        d.block_tables.as<int32_t>() + layout_.layer_group[layer] * shape.table_rows * shape.table_width;
    return cuda_status(ck::attention(q, config_.pool.kv_dtype, d.k_pool[array], d.v_pool[array], tables,
                                     shape.table_width, d.seq_of_token.as<int32_t>(), d.positions.as<int32_t>(),
                                     shape.tokens, c.num_heads, c.num_kv_heads, c.head_dim, config_.pool.block_size,
                                     scale, config_.attention_partition, shape.partitions, d.attn_workspace.as<float>(),
                                     out, layer_scale(d.k_scales, layer), layer_scale(d.v_scales, layer),
                                     attention_variant(config_.planted), c.layer_window(static_cast<int64_t>(layer)),
                                     static_cast<float>(c.attn_logit_softcapping), d.merge_counters.as<int32_t>()));
  }
  // Uploaded once per step (at layer 0); the other plan arrays are the kernel's own uploads.
  if (layer == 0) {
    KVP_RETURN_IF_ERROR(d.upload_vector(d.query_start, plan.query_start));
    KVP_RETURN_IF_ERROR(d.upload_vector(d.context_lens, plan.context_lens));
  }
  PluginBatch batch;
  batch.query = q;
  batch.out = out;
  batch.query_start = d.query_start.as<int32_t>();
  batch.token_seq = d.seq_of_token.as<int32_t>();
  batch.positions = d.positions.as<int32_t>();
  batch.context_lens = d.context_lens.as<int32_t>();
  batch.block_tables = d.block_tables.as<int32_t>();
  batch.k_cache = d.k_pool[layer];
  batch.k_scale = layer_scale(d.k_scales, layer);
  batch.v_scale = layer_scale(d.v_scales, layer);
  batch.v_cache = d.v_pool[layer];
  batch.stream = nullptr;  // the legacy default stream, which this backend's kernels run on
  batch.window = static_cast<int32_t>(c.layer_window(static_cast<int64_t>(layer)));
  batch.scale = c.attention_scale();
  batch.softcap = static_cast<float>(c.attn_logit_softcapping);
  return plugin_attention(*config_.attention_plugin, plan, c.num_heads, config_.pool, batch);
}

Result<std::unique_ptr<Backend>> create(const Model& model, const CudaBackendConfig& config) {
  auto made = CudaBackend::create(model, config);
  if (!made) return made.status();
  return std::unique_ptr<Backend>(std::move(*made));
}

Status device_status() { return cuda_status(ck::check_device()); }

}  // namespace kvp::cuda_backend::KVP_CUDA_FLAVOUR_NS
