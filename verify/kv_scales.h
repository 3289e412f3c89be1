// Where an fp8 KV pool's scales come from (verify, audit, generate): the checkpoint's
// `k_scale`/`v_scale` tensors (vLLM's FP8 checkpoints), a calibration pass over prompts, or
// 1.0. The source goes into the report: a run with scale 1.0 says so.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "model/weights.h"

namespace kvp::verify {

enum class KvScaleSource { kAuto, kOne, kCalibrate, kCheckpoint };
enum class KvScaleGranularity { kHead, kTensor };

// "auto", "one", "calibrate", "checkpoint"; nullopt for anything else.
std::optional<KvScaleSource> kv_scale_source_from_name(std::string_view name);

struct KvScales {
  std::vector<float> k, v;  // [num_layers][num_kv_heads]
  std::string source;       // what the report prints, e.g. "calibrated per KV head on 12 prompts"
};

// Calibration: each layer's K and V (after RoPE, as the cache holds them) over `prompts` by
// the fp32 reference model; scale = max |x| over the prompts' positions / fp8_max(dtype), per
// KV head or per layer (the max over its heads); a head that saw only zeros gets 1.
// At most `max_prompts` prompts of at most `max_tokens` tokens each are run.
// REQUIRES: is_fp8(dtype).
KvScales calibrate_kv_scales(const Model& model, const std::vector<std::vector<int32_t>>& prompts, DType dtype,
                             KvScaleGranularity granularity, int threads, std::size_t max_prompts = 64,
                             std::size_t max_tokens = 512);

// The scales for an fp8 pool: kAuto is the checkpoint's when `checkpoint` (may be empty: a
// preset) holds them, else calibrated; kCheckpoint without any in the checkpoint is an error.
// For a pool that is not fp8: empty scales (and a source saying so).
Result<KvScales> resolve_kv_scales(KvScaleSource source, KvScaleGranularity granularity, DType dtype,
                                   const Model& model, const std::filesystem::path& checkpoint,
                                   const std::vector<std::vector<int32_t>>& prompts, int threads);

}  // namespace kvp::verify
