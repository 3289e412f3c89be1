// `--preset NAME | --checkpoint DIR | --config FILE`, shared by every subcommand that needs a
// model.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "model/weights.h"

namespace kvp::tools {

struct ModelSource {
  std::string preset;
  std::string checkpoint;
  // A Hugging Face config.json (or a directory holding one) with seeded random weights: any
  // shape kvproof implements, without downloading a checkpoint.
  std::string config;
  uint64_t weight_seed = 0;

  // Adds the three mutually exclusive options (one of them required) to `cmd`.
  void add_options(CLI::App& cmd);
  // Loads the model: the checkpoint, else the config, else the preset (random weights drawn
  // on `threads` threads); errors name the preset or the file. A config whose random fp32
  // weights would take more than 16 GiB is refused, naming its parameter count.
  Result<Model> load(int threads = 1) const;
  std::string describe() const;
};

}  // namespace kvp::tools
