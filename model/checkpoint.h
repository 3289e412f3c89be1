// Checkpoints in the Hugging Face layout: a directory holding config.json and
// model.safetensors with the standard Llama tensor names.
#pragma once

#include <filesystem>

#include "common/dtype.h"
#include "common/status.h"
#include "model/weights.h"

namespace kvp {

// Loads and validates a checkpoint. Every error names the file and, where there is one,
// the key or tensor: "D/model.safetensors: tensor 'lm_head.weight': missing". Tensors are
// converted to fp32. The checkpoint must hold exactly the tensors the config calls for.
Result<Model> load_checkpoint(const std::filesystem::path& dir);

// Writes config.json and model.safetensors into `dir` (created if needed), the weights
// rounded to `dtype` (F32, F16 or BF16). Each file is written atomically.
Status save_checkpoint(const Model& model, const std::filesystem::path& dir, DType dtype);

}  // namespace kvp
