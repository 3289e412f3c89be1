#include "verify/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "model/checkpoint.h"
#include "reference/reference_model.h"

namespace kvp::verify {

std::optional<KvScaleSource> kv_scale_source_from_name(std::string_view name) {
  if (name == "auto") return KvScaleSource::kAuto;
  if (name == "one") return KvScaleSource::kOne;
  if (name == "calibrate") return KvScaleSource::kCalibrate;
  if (name == "checkpoint") return KvScaleSource::kCheckpoint;
  return std::nullopt;
}

KvScales calibrate_kv_scales(const Model& model, const std::vector<std::vector<int32_t>>& prompts, DType dtype,
                             KvScaleGranularity granularity, int threads, std::size_t max_prompts,
                             std::size_t max_tokens) {
  const ModelConfig& c = model.config;
  const auto cells = static_cast<std::size_t>(c.num_layers * c.num_kv_heads);
  std::vector<double> k_max(cells, 0.0), v_max(cells, 0.0);
  const ReferenceModel<float> ref(model, threads);
  std::size_t used = 0;
  for (const std::vector<int32_t>& prompt : prompts) {
    if (used == max_prompts) break;
    const std::size_t n = std::min({prompt.size(), max_tokens, static_cast<std::size_t>(c.max_position_embeddings)});
    if (n == 0) continue;
    ++used;
    auto cache = ref.make_cache(static_cast<int64_t>(n));
    auto logits = ref.forward(std::span<const int32_t>(prompt.data(), n), cache);
    if (!logits) continue;  // a prompt the model refuses calibrates nothing (verify reports it)
    for (int64_t l = 0; l < c.num_layers; ++l) {
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        const auto at = static_cast<std::size_t>(l * c.num_kv_heads + h);
        const auto rows = static_cast<Eigen::Index>(n);
        k_max[at] = std::max(k_max[at], static_cast<double>(cache.keys(l, h).topRows(rows).cwiseAbs().maxCoeff()));
        v_max[at] = std::max(v_max[at], static_cast<double>(cache.values(l, h).topRows(rows).cwiseAbs().maxCoeff()));
      }
    }
  }
  KvScales out;
  const double fmax = fp8_max(dtype);
  for (std::vector<double>* m : {&k_max, &v_max}) {
    if (granularity == KvScaleGranularity::kTensor) {
      for (int64_t l = 0; l < c.num_layers; ++l) {
        const auto first = m->begin() + l * c.num_kv_heads;
        const double layer_max = *std::max_element(first, first + c.num_kv_heads);
        std::fill(first, first + c.num_kv_heads, layer_max);
      }
    }
    std::vector<float>& s = m == &k_max ? out.k : out.v;
    for (double x : *m) s.push_back(x > 0 && std::isfinite(x) ? static_cast<float>(x / fmax) : 1.0f);
  }
  out.source = std::string("calibrated ") + (granularity == KvScaleGranularity::kHead ? "per KV head" : "per layer") +
               " on " + std::to_string(used) + " prompt" + (used == 1 ? "" : "s") + " (max |x| / " +
               (dtype == DType::kF8E4M3 ? "448" : "57344") + ")";
  return out;
}

Result<KvScales> resolve_kv_scales(KvScaleSource source, KvScaleGranularity granularity, DType dtype,
                                   const Model& model, const std::filesystem::path& checkpoint,
                                   const std::vector<std::vector<int32_t>>& prompts, int threads) {
  if (!is_fp8(dtype)) {
    if (source != KvScaleSource::kAuto)
      return Status::error("--kv-scales: scales are for fp8 KV pools; this pool is " +
                           std::string(dtype_flag_name(dtype)));
    return KvScales{};
  }
  const auto cells = static_cast<std::size_t>(model.config.num_layers * model.config.num_kv_heads);
  if (source == KvScaleSource::kOne)
    return KvScales{std::vector<float>(cells, 1.0f), std::vector<float>(cells, 1.0f),
                    "1.0 (not calibrated: --kv-scales one)"};
  if (source == KvScaleSource::kAuto || source == KvScaleSource::kCheckpoint) {
    std::optional<CheckpointKvScales> from;
    if (!checkpoint.empty()) {
      auto loaded = load_kv_scales(checkpoint);
      if (!loaded) return loaded.status().with_context("--kv-scales");
      from = std::move(*loaded);
    }
    if (from)
      return KvScales{from->k, from->v,
                      std::string("from the checkpoint (") + (from->per_head ? "per KV head" : "per layer") + ")"};
    if (source == KvScaleSource::kCheckpoint)
      return Status::error(std::string("--kv-scales checkpoint: ") +
                           (checkpoint.empty() ? "the model is a preset, not a checkpoint"
                                               : checkpoint.string() + " has no k_scale/v_scale tensors"));
  }
  return calibrate_kv_scales(model, prompts, dtype, granularity, threads);
}

}  // namespace kvp::verify
