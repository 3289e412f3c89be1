// What `verify` and `audit` run: a model (--preset | --checkpoint), a workload
// (--workload FILE | --shape NAME, --seed) and a KV pool (--block-size, --num-blocks,
// --host-blocks). One definition of those options and of their loading.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "model/weights.h"
#include "optimized/engine/workload.h"
#include "tools/model_source.h"
#include "verify/verify.h"

namespace kvp::tools {

struct RunInputs {
  ModelSource source;
  std::string workload_file;
  std::string shape;
  uint64_t seed = 0;

  // Adds the model and workload options; the model defaults to the tiny preset.
  void add_options(CLI::App& cmd, const std::string& default_shape);
  // Loads both; errors name the preset, checkpoint or workload file.
  Result<std::pair<Model, Workload>> load(int threads = 1) const;
  std::string describe(const Workload& w) const;
};

// The workload's prompts, in request order (what fp8 scales are calibrated on).
std::vector<std::vector<int32_t>> prompts_of(const Workload& w);

// Adds --block-size, --num-blocks and --host-blocks.
void add_pool_options(CLI::App& cmd, verify::EngineOptions& v);

// The model executor: --backend (cpu, cuda-emu, cuda; `extra` adds choices such as
// generate's "reference"), --kv-dtype (f32, f16, bf16, fp8-e4m3, fp8-e5m2), --kv-scales and
// --kv-scale-granularity (fp8), --weight-dtype and --max-graph-tokens (the CUDA backends),
// --threads, and the hidden --plant (a planted attention bug,
// for the checks that must catch it).
struct BackendChoice {
  std::string backend = "cpu";
  std::string kv_dtype = "f32";
  std::string kv_scales = "auto";
  std::string kv_scale_granularity = "head";
  std::string plant = "none";
  std::string weight_dtype = "auto";
  int64_t max_graph_tokens = 64;
  std::string kv_groups = "auto";
  int threads = 2;
  void add_options(CLI::App& cmd, const std::vector<std::string>& extra = {});
  // Into the engine options; an error names the flag and value (an f16 or bf16 pool on the
  // cpu backend, which keeps f32 pools only).
  Status apply(verify::EngineOptions& v) const;
  // An fp8 pool's scales into v (verify/kv_scales.h), from the checkpoint (may be empty: a
  // preset) or calibrated on the prompts; nothing for other pools. REQUIRES: apply(v) ok.
  Status resolve_scales(const std::string& checkpoint, const Model& model,
                        const std::vector<std::vector<int32_t>>& prompts, verify::EngineOptions& v) const;
  // --weight-dtype into v.weight_dtype, before anything uses the model: bf16 rounds the model's
  // matrices to bf16 values (round_matrices_to_bf16: the oracle then computes with exactly what
  // the CUDA backends' bf16 weights hold); auto is bf16 on a CUDA backend when the matrices
  // already are bf16 values (a bf16 checkpoint), else f32; f32 changes nothing. Returns what
  // the report prints ("bf16 (rounded from fp32)", ...). REQUIRES: apply(v) ok.
  Result<std::string> apply_weight_dtype(Model& model, verify::EngineOptions& v) const;
};

}  // namespace kvp::tools
