#include "tools/run_inputs.h"

#include "verify/kv_scales.h"

namespace kvp::tools {

void RunInputs::add_options(CLI::App& cmd, const std::string& default_shape) {
  source.preset = "tiny";
  shape = default_shape;
  auto* p = cmd.add_option("--preset", source.preset, "built-in model (default tiny)");
  auto* c =
      cmd.add_option("--checkpoint", source.checkpoint, "Hugging Face checkpoint directory (instead of --preset)");
  cmd.add_option("--config", source.config,
                 "Hugging Face config.json (or its directory) with seeded random weights (instead of --preset)")
      ->excludes(p)
      ->excludes(c);
  cmd.add_option("--weight-seed", source.weight_seed, "seed of a preset's or a config's random weights");
  cmd.add_option("--workload", workload_file, "JSON workload file (instead of --shape)");
  cmd.add_option(
      "--shape", shape,
      "built-in traffic shape: short-chat, long-docs, many-users, shared-prefix, mixed, multi-tenant (default " +
          default_shape + ")");
  cmd.add_option("--seed", seed, "seed of the workload's generated tokens");
}

Result<std::pair<Model, Workload>> RunInputs::load(int threads) const {
  ModelSource s = source;
  if (!s.checkpoint.empty() && !s.config.empty())
    return Status::error("--checkpoint and --config name two models: give one");
  if (!s.checkpoint.empty() || !s.config.empty()) s.preset.clear();
  auto model = s.load(threads);
  if (!model) return model.status();
  auto workload = workload_file.empty() ? builtin_workload(shape, model->config.vocab_size, seed)
                                        : load_workload(workload_file, model->config.vocab_size, seed);
  if (!workload) return workload.status();
  return std::pair<Model, Workload>(std::move(*model), std::move(*workload));
}

std::string RunInputs::describe(const Workload& w) const {
  ModelSource s = source;
  if (!s.checkpoint.empty() || !s.config.empty()) s.preset.clear();
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
                 "KV pool element type: f32, f16, bf16, fp8-e4m3 or fp8-e5m2 (rounded when written, read as fp32; "
                 "every backend; fp8 scaled per layer and KV head, see --kv-scales)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"}));
  cmd.add_option("--kv-scales", kv_scales,
                 "fp8 KV scales: checkpoint (its k_scale/v_scale tensors), calibrate (max |K|, |V| of the "
                 "workload's prompts over the fp8 max), one (1.0: no scaling, reported as such), auto (the "
                 "checkpoint's if it has them, else calibrate)")
      ->check(CLI::IsMember({"auto", "checkpoint", "calibrate", "one"}));
  cmd.add_option("--kv-scale-granularity", kv_scale_granularity,
                 "calibrated fp8 scales per KV head (head) or per layer (tensor)")
      ->check(CLI::IsMember({"head", "tensor"}));
  cmd.add_option("--weight-dtype", weight_dtype,
                 "weight matrices of the CUDA backends: f32, bf16 (the model's matrices rounded to bf16 first, for "
                 "every backend and the oracle alike) or auto (bf16 where they already are bf16 values, a bf16 "
                 "checkpoint's, on the CUDA backends; else f32)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  cmd.add_option("--max-graph-tokens", max_graph_tokens,
                 "CUDA backends: decode steps of up to this many sequences run as CUDA graphs, padded to 1, 2, 4, 8 "
                 "or a multiple of 8 tokens, one graph captured per padded size (0: every step eager)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  cmd.add_option("--kv-groups", kv_groups,
                 "a hybrid model's KV-cache groups (one block table per group of full or sliding layers, the "
                 "sliding ones releasing what their window left behind; the pool keeps its bytes): auto (without an "
                 "attention plug-in or a KV-event stream) or off (one table, every block kept)")
      ->check(CLI::IsMember({"auto", "off"}));
  cmd.add_option("--plant", plant, "a planted attention bug (testing kvproof's checks)")
      ->check(CLI::IsMember({"none", "bf16-accumulator", "drop-kv-scales"}))
      ->group("");
  cmd.add_option("--threads", threads,
                 "threads of the CPU backend (and of verify's oracle; the results do not depend on it)")
      ->check(CLI::Range(1, 256));
}

Status BackendChoice::apply(verify::EngineOptions& v) const {
  auto kind = parse_backend_kind(backend);
  if (!kind) return kind.status().with_context("--backend");
  const std::optional<DType> dtype = dtype_from_flag(kv_dtype);
  if (!dtype || *dtype == DType::kF64)
    return Status::error("--kv-dtype " + kv_dtype + ": not one of f32, f16, bf16, fp8-e4m3, fp8-e5m2");
  if (!is_fp8(*dtype) && kv_scales != "auto")
    return Status::error("--kv-scales " + kv_scales + ": scales are for fp8 KV pools; --kv-dtype is " + kv_dtype);
  if (plant != "none" && *kind == BackendKind::kCpu)
    return Status::error("--plant " + plant + ": planted attention bugs are in the cuda backends' kernel");
  v.planted = plant == "bf16-accumulator" ? PlantedAttentionBug::kBf16Accumulator
              : plant == "drop-kv-scales" ? PlantedAttentionBug::kDropKvScales
                                          : PlantedAttentionBug::kNone;
  v.backend = *kind;
  v.kv_dtype = *dtype;
  v.num_threads = threads;
  v.max_graph_tokens = max_graph_tokens;
  v.kv_groups = kv_groups == "auto";
  return Status::ok();
}

Result<std::string> BackendChoice::apply_weight_dtype(Model& model, verify::EngineOptions& v) const {
  if (weight_dtype == "bf16") {
    const bool already = matrices_are_bf16(model);
    if (!already) round_matrices_to_bf16(model);
    v.weight_dtype = DType::kBF16;
    return std::string(already ? "bf16" : "bf16 (the matrices rounded from fp32, for the oracle too)");
  }
  if (weight_dtype == "auto" && v.backend != BackendKind::kCpu && matrices_are_bf16(model)) {
    v.weight_dtype = DType::kBF16;
    return std::string("bf16 (the matrices are bf16 values)");
  }
  if (weight_dtype != "auto" && weight_dtype != "f32")
    return Status::error("--weight-dtype " + weight_dtype + ": not one of auto, f32, bf16");
  v.weight_dtype = DType::kF32;
  return std::string("f32");
}

std::vector<std::vector<int32_t>> prompts_of(const Workload& w) {
  std::vector<std::vector<int32_t>> prompts;
  for (const WorkloadRequest& r : w.requests) prompts.push_back(r.spec.prompt);
  return prompts;
}

Status BackendChoice::resolve_scales(const std::string& checkpoint, const Model& model,
                                     const std::vector<std::vector<int32_t>>& prompts, verify::EngineOptions& v) const {
  const auto source = verify::kv_scale_source_from_name(kv_scales);
  if (!source) return Status::error("--kv-scales " + kv_scales + ": not one of auto, checkpoint, calibrate, one");
  auto scales = verify::resolve_kv_scales(
      *source,
      kv_scale_granularity == "tensor" ? verify::KvScaleGranularity::kTensor : verify::KvScaleGranularity::kHead,
      v.kv_dtype, model, checkpoint, prompts, threads);
  if (!scales) return scales.status();
  v.kv_k_scales = std::move(scales->k);
  v.kv_v_scales = std::move(scales->v);
  v.kv_scales_source = std::move(scales->source);
  return Status::ok();
}

}  // namespace kvp::tools
