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

Result<std::pair<Model, Workload>> RunInputs::load(int threads) const {
  ModelSource s = source;
  if (!s.checkpoint.empty()) s.preset.clear();
  auto model = s.load(threads);
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

void add_pool_options(CLI::App& cmd, verify::EngineOptions& v) {
  cmd.add_option("--block-size", v.block_size, "tokens per KV block")->check(CLI::Range(1, 1024));
  cmd.add_option("--num-blocks", v.num_blocks, "device KV blocks (small, so that preemption happens)")
      ->check(CLI::Range(1, 1 << 24));
  cmd.add_option("--host-blocks", v.num_host_blocks, "host (swap) KV blocks")->check(CLI::Range(0, 1 << 24));
}

void BackendChoice::add_options(CLI::App& cmd, const std::vector<std::string>& extra) {
  std::vector<std::string> choices = extra;
  for (const BackendKind b : kBackendKinds) choices.emplace_back(backend_name(b));
  std::string names;
  for (const std::string& c : choices) names += (names.empty() ? "" : ", ") + c;
  cmd.add_option("--backend", backend,
                 "model executor: " + names +
                     " (cuda-emu: the CUDA kernels emulated on the CPU; cuda: on a GPU, see kvproof info)")
      ->check(CLI::IsMember(choices));
  cmd.add_option("--kv-dtype", kv_dtype,
                 "KV pool element type: f32, f16 or bf16 (rounded when written, read as fp32; cuda backends)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd.add_option("--threads", threads,
                 "threads of the CPU backend (and of verify's oracle; the results do not depend on it)")
      ->check(CLI::Range(1, 256));
}

Status BackendChoice::apply(verify::EngineOptions& v) const {
  auto kind = parse_backend_kind(backend);
  if (!kind) return kind.status().with_context("--backend");
  const std::optional<DType> dtype = dtype_from_flag(kv_dtype);
  if (!dtype || *dtype == DType::kF64) return Status::error("--kv-dtype " + kv_dtype + ": not one of f32, f16, bf16");
  if (*kind == BackendKind::kCpu && *dtype != DType::kF32)
    return Status::error("--kv-dtype " + kv_dtype +
                         ": the cpu backend keeps f32 KV pools only; f16 and bf16 run on --backend cuda-emu or cuda");
  v.backend = *kind;
  v.kv_dtype = *dtype;
  v.num_threads = threads;
  return Status::ok();
}

}  // namespace kvp::tools
