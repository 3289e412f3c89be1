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
  p->excludes(c);
  c->excludes(p);
  cmd.add_option("--weight-seed", weight_seed, "seed of a preset's random weights")->needs(p);
}

Result<Model> ModelSource::load(int threads) const {
  if (preset.empty() && checkpoint.empty()) return Status::error("one of --preset or --checkpoint is required");
  if (!preset.empty()) return make_preset(preset, weight_seed, threads);
  return load_checkpoint(checkpoint);
}

}  // namespace kvp::tools
