#include <cstdio>

#include "common/dtype.h"
#include "model/checkpoint.h"
#include "model/gguf.h"
#include "model/presets.h"
#include "tools/commands.h"

namespace kvp::tools {

namespace {
std::string preset_list() {
  std::string out;
  for (const auto& n : preset_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}
}  // namespace

void add_export_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::string preset, out, dtype = "f32", format = "hf";
    uint64_t weight_seed = 0;
    int shards = 1;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd =
      app.add_subcommand("export",
                         "Write a preset as a Hugging Face checkpoint (config.json + model.safetensors) or a GGUF file "
                         "llama.cpp loads (--format gguf)");
  cmd->add_option("--preset", opt->preset, "built-in model: " + preset_list())->required();
  cmd->add_option("--out", opt->out, "output directory (created if needed); with --format gguf, the .gguf file")
      ->required();
  cmd->add_option("--format", opt->format,
                  "hf: a Hugging Face checkpoint directory; gguf: one GGUF file for llama.cpp (Llama, Mistral and "
                  "Qwen2 architectures, token i named <kvp:i>; docs/checkpoints.md)")
      ->check(CLI::IsMember({"hf", "gguf"}));
  cmd->add_option("--dtype", opt->dtype, "tensor dtype: f32, f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_option("--weight-seed", opt->weight_seed, "seed of the preset's random weights");
  cmd->add_option("--shards", opt->shards,
                  "1: one model.safetensors; N > 1: N shards model-0000i-of-0000N.safetensors and "
                  "model.safetensors.index.json");
  cmd->callback([opt, &exit_code] {
    auto model = make_preset(opt->preset, opt->weight_seed);
    if (!model) {
      std::fprintf(stderr, "kvproof export: %s\n", model.status().message().c_str());
      exit_code = kExitBadInput;
      return;
    }
    if (opt->format == "gguf") {
      if (opt->shards != 1) {
        std::fprintf(stderr, "kvproof export: --shards %d: a GGUF file is one file (--shards 1)\n", opt->shards);
        exit_code = kExitBadInput;
        return;
      }
      GgufOptions g;
      g.dtype = *dtype_from_flag(opt->dtype);
      g.name = "kvproof " + opt->preset;
      if (Status s = save_gguf(*model, opt->out, g); !s) {
        std::fprintf(stderr, "kvproof export: %s\n", s.message().c_str());
        exit_code = kExitBadInput;
        return;
      }
      std::printf("wrote %s (GGUF, %s, %s)\n", opt->out.c_str(), opt->preset.c_str(), opt->dtype.c_str());
      return;
    }
    Status s = save_checkpoint(*model, opt->out, *dtype_from_flag(opt->dtype), opt->shards);
    if (!s) {
      std::fprintf(stderr, "kvproof export: %s\n", s.message().c_str());
      exit_code = kExitBadInput;
      return;
    }
    if (opt->shards == 1) {
      std::printf("wrote %s/config.json and %s/model.safetensors (%s, %s)\n", opt->out.c_str(), opt->out.c_str(),
                  opt->preset.c_str(), opt->dtype.c_str());
    } else {
      std::printf("wrote %s/config.json, %s/model.safetensors.index.json and %d shards (%s, %s)\n", opt->out.c_str(),
                  opt->out.c_str(), opt->shards, opt->preset.c_str(), opt->dtype.c_str());
    }
  });
}

}  // namespace kvp::tools
