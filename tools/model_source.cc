#include "tools/model_source.h"

#include "model/checkpoint.h"
#include "model/presets.h"

namespace kvp::tools {

void ModelSource::add_options(CLI::App& cmd) {
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  auto* p = cmd.add_option("--preset", preset, "built-in model with seeded random weights: " + names);
  auto* c = cmd.add_option("--checkpoint", checkpoint,
                           "Hugging Face directory: config.json + model.safetensors or model.safetensors.index.json "
                           "and its shards (Llama, Qwen2, Mistral; F32, F16, BF16)");
  auto* j = cmd.add_option("--config", config,
                           "Hugging Face config.json (or its directory) with seeded random weights: any architecture "
                           "and shape kvproof implements, without a checkpoint");
  p->excludes(c)->excludes(j);
  c->excludes(p)->excludes(j);
  j->excludes(p)->excludes(c);
  cmd.add_option("--weight-seed", weight_seed, "seed of a preset's or a config's random weights");
}

namespace {

Result<Model> load_random_from_config(const std::string& path, uint64_t seed, int threads) {
  auto c = load_model_config(path);
  if (!c) return c.status();
  // Random weights are fp32 in memory: refuse what would not fit a workstation rather than
  // be killed drawing it.
  constexpr double kMaxBytes = 16.0 * (1ull << 30);
  const double bytes = 4.0 * static_cast<double>(c->num_parameters());
  if (bytes > kMaxBytes)
    return Status::error(path + ": " + std::to_string(c->num_parameters()) + " parameters, " +
                         std::to_string(static_cast<int64_t>(bytes / (1ull << 30))) +
                         " GiB of fp32 random weights: --config is for shapes up to 16 GiB (use --checkpoint)");
  return make_random_model(*c, seed, threads);
}

}  // namespace

Result<Model> ModelSource::load(int threads) const {
  if (!checkpoint.empty()) return load_checkpoint(checkpoint);
  if (!config.empty()) return load_random_from_config(config, weight_seed, threads);
  if (!preset.empty()) return make_preset(preset, weight_seed, threads);
  return Status::error("one of --preset, --checkpoint or --config is required");
}

std::string ModelSource::describe() const {
  if (!checkpoint.empty()) return "checkpoint " + checkpoint;
  if (!config.empty()) return "config " + config + " (weight seed " + std::to_string(weight_seed) + ")";
  return "preset " + preset;
}

}  // namespace kvp::tools
