// `--preset NAME | --checkpoint DIR`, shared by every subcommand that needs a model.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "model/weights.h"

namespace kvp::tools {

struct ModelSource {
  std::string preset;
  std::string checkpoint;
  uint64_t weight_seed = 0;

  // Adds the two mutually exclusive options (one of them required) to `cmd`.
  void add_options(CLI::App& cmd);
  // Loads the model (a preset's weights drawn on `threads` threads); errors name the preset
  // or the checkpoint file.
  Result<Model> load(int threads = 1) const;
  std::string describe() const { return preset.empty() ? "checkpoint " + checkpoint : "preset " + preset; }
};

}  // namespace kvp::tools
