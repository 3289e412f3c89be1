#include "tools/run_inputs.h"

namespace kvp::tools {

void RunInputs::add_options(CLI::App& cmd, const std::string& default_shape) {
  source.preset = "tiny";
  shape = default_shape;
  cmd.add_option("--preset", source.preset, "built-in model (default tiny)");
  cmd.add_option("--checkpoint", source.checkpoint, "Hugging Face checkpoint directory (instead of --preset)");
  cmd.add_option("--workload", workload_file, "JSON workload file (instead of --shape)");
  cmd.add_option(
      "--shape", shape,
      "built-in traffic shape: short-chat, long-docs, many-users, shared-prefix, mixed, multi-tenant (default " +
          default_shape + ")");
  cmd.add_option("--seed", seed, "seed of the workload's generated tokens");
}

Result<std::pair<Model, Workload>> RunInputs::load() const {
  ModelSource s = source;
  if (!s.checkpoint.empty()) s.preset.clear();
  auto model = s.load();
  if (!model) return model.status();
  auto workload = workload_file.empty() ? builtin_workload(shape, model->config.vocab_size, seed)
                                        : load_workload(workload_file, model->config.vocab_size, seed);
  if (!workload) return workload.status();
  return std::pair<Model, Workload>(std::move(*model), std::move(*workload));
}

std::string RunInputs::describe(const Workload& w) const {
  ModelSource s = source;
  if (!s.checkpoint.empty()) s.preset.clear();
  return s.describe() + ", workload " + w.name + " (" + std::to_string(w.requests.size()) + " requests)";
}

void add_pool_options(CLI::App& cmd, verify::VerifyOptions& v) {
  cmd.add_option("--block-size", v.block_size, "tokens per KV block")->check(CLI::Range(1, 1024));
  cmd.add_option("--num-blocks", v.num_blocks, "device KV blocks (small, so that preemption happens)")
      ->check(CLI::Range(1, 1 << 24));
  cmd.add_option("--host-blocks", v.num_host_blocks, "host (swap) KV blocks")->check(CLI::Range(0, 1 << 24));
}

}  // namespace kvp::tools
