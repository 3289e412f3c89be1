// Checkpoints in the Hugging Face layout: a directory holding config.json (and optionally
// generation_config.json) and the weights as either
//   model.safetensors                                   one file, or
//   model.safetensors.index.json + the shards it names  ({"metadata": {"total_size": N},
//                                                        "weight_map": {tensor: shard file}})
// with the standard Llama / Qwen2 / Mistral tensor names. When both are present the single
// file is read, as transformers does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/dtype.h"
#include "common/status.h"
#include "model/weights.h"

namespace kvp {

inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr const char* kShardIndexName = "model.safetensors.index.json";

// A parsed model.safetensors.index.json.
struct ShardIndex {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
  std::optional<uint64_t> total_size;             // metadata.total_size, when given
};

// Parses an index. Errors are plain reasons (the caller adds the file name): not JSON, not
// an object, no weight_map object, a shard name that is not a string or not a plain file
// name in the checkpoint directory (no '/', not '.' or '..'), a tensor named twice, a
// total_size that is not a non-negative integer.
Result<ShardIndex> parse_shard_index(std::string_view text);

// Loads and validates a checkpoint. Every error names the file and, where there is one,
// the key or tensor: "D/model.safetensors: tensor 'lm_head.weight': missing". Each tensor
// is converted to fp32 from a memory mapping of its file (nothing is read whole into a
// buffer). The checkpoint must hold exactly the tensors the config calls for; a sharded
// one, each in the shard its index names and in no other.
Result<Model> load_checkpoint(const std::filesystem::path& dir);

// A model's config alone: `path` a config.json file, or a directory holding one (with its
// generation_config.json, if any, as load_checkpoint reads them). Errors name the file and key.
Result<ModelConfig> load_model_config(const std::filesystem::path& path);

// An fp8 KV cache's scales as vLLM's FP8 checkpoints carry them: per layer
// `model.layers.N.self_attn.k_scale` and `...v_scale`, each a scalar (shape [] or [1]: one
// per tensor) or one per KV head ([num_kv_heads]); F32, F16 or BF16. load_checkpoint accepts
// these tensors beside the weights (and ignores them); load_kv_scales reads them.
std::string kv_scale_tensor_name(int64_t layer, bool k);
struct CheckpointKvScales {
  std::vector<float> k, v;  // [num_layers][num_kv_heads], a scalar repeated over the heads
  bool per_head = false;    // whether the checkpoint gave one per KV head
};
// nullopt when the checkpoint has no KV scales; an error when it has some but not all of
// them (every layer needs both), or one of a wrong shape, or one that is not finite and > 0,
// naming the file and tensor.
Result<std::optional<CheckpointKvScales>> load_kv_scales(const std::filesystem::path& dir);

// Writes config.json (generation_config.json when the config has stop tokens) and the
// weights rounded to `dtype` (F32, F16 or BF16) into `dir` (created if needed): one
// model.safetensors when shards == 1, else shards model-0000i-of-0000N.safetensors of about
// equal size plus their index, with tensors in named_tensors() order. Each file is written
// atomically, and the other layout's files left from an earlier export are removed so the
// directory holds one checkpoint. REQUIRES nothing; shards < 1 or more shards than tensors
// is an error.
Status save_checkpoint(const Model& model, const std::filesystem::path& dir, DType dtype, int shards = 1);

}  // namespace kvp
