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

// Adds --block-size, --num-blocks and --host-blocks.
void add_pool_options(CLI::App& cmd, verify::EngineOptions& v);

// The model executor: --backend (cpu, cuda-emu, cuda; `extra` adds choices such as
// generate's "reference"), --kv-dtype (f32, f16, bf16) and --threads.
struct BackendChoice {
  std::string backend = "cpu";
  std::string kv_dtype = "f32";
  int threads = 2;
  void add_options(CLI::App& cmd, const std::vector<std::string>& extra = {});
  // Into the engine options; an error names the flag and value (an f16 or bf16 pool on the
  // cpu backend, which keeps f32 pools only).
  Status apply(verify::EngineOptions& v) const;
};

}  // namespace kvp::tools
