#include "optimized/backends/cost_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "kernels/kv_index.h"

namespace kvp {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

constexpr double kGB = 1e9;  // datasheets quote decimal gigabytes
constexpr double kTFLOPS = 1e12;

}  // namespace

// Shapes from each model's Hugging Face config.json (num_hidden_layers,
// num_attention_heads, num_key_value_heads, hidden_size / num_attention_heads,
// vocab_size, max_position_embeddings); parameter counts from the model cards / the
// safetensors index totals.
std::vector<ModelSpec> model_presets() {
  return {
      // meta-llama/Llama-2-7b-hf: 32 layers, 32 heads (MHA), hidden 4096, 4k context.
      {"llama-2-7b", 32, 32, 32, 128, 32000, 4096, 6.74e9},
      // meta-llama/Llama-2-13b-hf: 40 layers, 40 heads (MHA), hidden 5120, 4k context.
      {"llama-2-13b", 40, 40, 40, 128, 32000, 4096, 13.02e9},
      // meta-llama/Meta-Llama-3-8B: 32 layers, 32 heads, 8 KV heads (GQA), 8k context.
      {"llama-3-8b", 32, 32, 8, 128, 128256, 8192, 8.03e9},
      // mistralai/Mistral-7B-v0.1: 32 layers, 32 heads, 8 KV heads; sliding_window 4096 on
      // every layer: a sequence holds at most the window's blocks (and a step's tokens).
      {"mistral-7b", 32, 32, 8, 128, 32000, 32768, 7.24e9, 4096},
      // Qwen/Qwen2.5-7B: 28 layers, 28 heads, 4 KV heads, hidden 3584; 32k native context
      // (the model card's longer contexts need YaRN scaling).
      {"qwen2.5-7b", 28, 28, 4, 128, 152064, 32768, 7.62e9},
      // google/gemma-3-1b-it: 26 layers, 4 heads, 1 KV head, head_dim 256, vocab 262,144, 32k
      // context; five layers of window 512 to one global (layers 5, 11, 17, 23: 4 global).
      // Parameters: the Gemma 3 technical report's table 1 (302M embedding + 698M other).
      {"gemma-3-1b", 26, 4, 1, 256, 262144, 32768, 1.0e9, 512, 4},
      // google/gemma-3-27b (text): 62 layers, 32 heads, 16 KV heads, head_dim 128, vocab
      // 262,208, 128k context; window 1024 on five layers in six (10 global). Parameters: the
      // report's 1,416M embedding + 25,600M other (the 417M vision encoder left out).
      {"gemma-3-27b", 62, 32, 16, 128, 262208, 131072, 27.016e9, 1024, 10},
  };
}

// NVIDIA datasheets: A100 (SXM4 40GB / 80GB), H100 SXM5, H200 SXM. bf16 rates are the dense
// Tensor Core figures (the datasheets' headline numbers assume 2:4 sparsity: halved here).
// Host link: PCIe Gen4 x16 (A100, 64 GB/s both directions) and Gen5 x16 (H100/H200,
// 128 GB/s both directions); a swap moves one way at a time.
std::vector<GpuSpec> gpu_presets() {
  return {
      {"a100-40gb", 40 * kGB, 1555 * kGB, 312 * kTFLOPS, 32 * kGB},
      {"a100-80gb", 80 * kGB, 2039 * kGB, 312 * kTFLOPS, 32 * kGB},
      {"h100-80gb", 80 * kGB, 3350 * kGB, 989 * kTFLOPS, 64 * kGB},
      {"h200-141gb", 141 * kGB, 4800 * kGB, 989 * kTFLOPS, 64 * kGB},
  };
}

Result<ModelSpec> find_model_preset(const std::string& name) {
  const std::string n = lower(name);
  std::string known;
  for (const ModelSpec& m : model_presets()) {
    if (m.name == n) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  return Status::error("unknown model '" + name + "' (known: " + known + ")");
}

Result<GpuSpec> find_gpu_preset(const std::string& name) {
  std::string n = lower(name);
  if (n == "a100") n = "a100-80gb";
  if (n == "h100") n = "h100-80gb";
  if (n == "h200") n = "h200-141gb";
  std::string known;
  for (const GpuSpec& g : gpu_presets()) {
    if (g.name == n) return g;
    known += (known.empty() ? "" : ", ") + g.name;
  }
  return Status::error("unknown GPU '" + name + "' (known: " + known + "; aliases a100, h100, h200)");
}

Status CostModelConfig::validate() const {
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  auto fraction = [](double v) { return std::isfinite(v) && v > 0 && v <= 1; };
  if (model.num_layers <= 0 || model.num_heads <= 0 || model.num_kv_heads <= 0 || model.head_dim <= 0)
    return Status::error("model '" + model.name + "': layers, heads, KV heads and head dim must be > 0");
  if (model.sliding_window < 0) return Status::error("model '" + model.name + "': sliding_window must be >= 0");
  if (model.full_attention_layers < 0 || model.full_attention_layers > model.num_layers ||
      (model.full_attention_layers > 0 && model.sliding_window == 0))
    return Status::error("model '" + model.name + "': full_attention_layers must be in [0, layers] with a window");
  if (!positive(model.num_parameters)) return Status::error("model '" + model.name + "': num_parameters must be > 0");
  if (!positive(gpu.memory_bytes)) return Status::error("gpu '" + gpu.name + "': memory_bytes must be > 0");
  if (!positive(gpu.memory_bandwidth)) return Status::error("gpu '" + gpu.name + "': memory_bandwidth must be > 0");
  if (!positive(gpu.peak_bf16_flops)) return Status::error("gpu '" + gpu.name + "': peak_bf16_flops must be > 0");
  if (!positive(gpu.host_link_bandwidth))
    return Status::error("gpu '" + gpu.name + "': host_link_bandwidth must be > 0");
  if (!positive(weight_bytes_per_param)) return Status::error("weight_bytes_per_param must be > 0");
  if (!positive(kv_bytes_per_element)) return Status::error("kv_bytes_per_element must be > 0");
  if (!fraction(compute_efficiency)) return Status::error("compute_efficiency must be in (0, 1]");
  if (!fraction(bandwidth_efficiency)) return Status::error("bandwidth_efficiency must be in (0, 1]");
  if (!fraction(gpu_memory_utilization)) return Status::error("gpu_memory_utilization must be in (0, 1]");
  if (!std::isfinite(step_overhead_s) || step_overhead_s < 0) return Status::error("step_overhead_s must be >= 0");
  if (!std::isfinite(activation_reserve_bytes) || activation_reserve_bytes < 0)
    return Status::error("activation_reserve_bytes must be >= 0");
  if (!std::isfinite(host_swap_bytes) || host_swap_bytes < 0) return Status::error("host_swap_bytes must be >= 0");
  if (kv_layers_per_block < 0 || kv_layers_per_block > model.num_layers)
    return Status::error("kv_layers_per_block must be in [0, " + std::to_string(model.num_layers) + "]");
  return Status::ok();
}

int64_t CostModelConfig::num_device_blocks(int32_t block_size) const {
  const double blocks = std::floor(kv_pool_bytes() / kv_block_bytes(block_size));
  return blocks > 0 ? static_cast<int64_t>(blocks) : 0;
}

int64_t CostModelConfig::num_host_blocks(int32_t block_size) const {
  return static_cast<int64_t>(std::floor(host_swap_bytes / kv_block_bytes(block_size)));
}

std::vector<int64_t> ModelSpec::layer_windows() const {
  std::vector<int64_t> w(static_cast<size_t>(num_layers), sliding_window);
  if (full_attention_layers > 0 && sliding_window > 0) {
    const int64_t every = num_layers / full_attention_layers;
    for (int64_t k = 1; k <= full_attention_layers; ++k) w[static_cast<size_t>(k * every - 1)] = 0;
  }
  return w;
}

KvGroupLayout ModelSpec::kv_groups(bool groups) const {
  if (!groups || windowed_layers() == 0 || full_attention_layers == 0)
    return kv_group_layout(std::vector<int64_t>(static_cast<size_t>(num_layers), kv_window()));
  return kv_group_layout(layer_windows());
}

StepCost step_cost(const CostModelConfig& c, const BatchPlan& plan, int32_t block_size) {
  StepCost s;
  const double tokens = static_cast<double>(plan.num_tokens());
  const ModelSpec& m = c.model;
  const int64_t w = m.sliding_window;
  // Positions attended and K/V positions read, for a full layer and for a windowed one.
  double attended_full = 0, attended_windowed = 0;
  for (int32_t p : plan.positions) {
    attended_full += static_cast<double>(p + 1);
    attended_windowed += static_cast<double>(p + 1 - kernels::window_first(p, w));
  }
  double context_full = 0, context_windowed = 0;  // a windowed layer: from its first new token's window on
  for (std::size_t i = 0; i < plan.context_lens.size(); ++i) {
    const int64_t len = plan.context_lens[i];
    const int64_t n = plan.query_start[i + 1] - plan.query_start[i];
    context_full += static_cast<double>(len);
    context_windowed += static_cast<double>(len - kernels::window_first(len - n, w));
  }
  // Per layer on average: a hybrid's full and windowed layers weighted by their counts (a
  // model of one kind takes its own figures as they are).
  const auto layers = static_cast<double>(m.num_layers);
  const auto windowed = static_cast<double>(m.windowed_layers());
  const double full = layers - windowed;
  const auto mix = [&](double f, double wd) {
    return windowed == 0 ? f : full == 0 ? wd : (full * f + windowed * wd) / layers;
  };
  const double attended = mix(attended_full, attended_windowed);
  const double context = mix(context_full + tokens, context_windowed + tokens);
  const double kv_token = c.kv_bytes_per_token();
  if (tokens > 0) {
    s.flops =
        2.0 * m.num_parameters * tokens + 4.0 * static_cast<double>(m.num_layers * m.num_heads * m.head_dim) * attended;
    s.bytes = c.weight_bytes() + kv_token * context;
    s.compute_s = s.flops / (c.gpu.peak_bf16_flops * c.compute_efficiency);
    s.memory_s = s.bytes / (c.gpu.memory_bandwidth * c.bandwidth_efficiency);
  }
  const double block_bytes = c.kv_block_bytes(block_size);
  const double copies = static_cast<double>(plan.ops.block_copies.size());
  const double swaps = static_cast<double>(plan.ops.swap_out.size() + plan.ops.swap_in.size());
  s.transfer_s = copies * block_bytes * 2.0 / (c.gpu.memory_bandwidth * c.bandwidth_efficiency) +
                 swaps * block_bytes / (c.gpu.host_link_bandwidth * c.bandwidth_efficiency);
  s.total_s = std::max(s.compute_s, s.memory_s) + c.step_overhead_s + s.transfer_s;
  return s;
}

}  // namespace kvp
