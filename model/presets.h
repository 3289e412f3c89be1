// Built-in models with seeded random weights, for tests, the default job and benchmarks.
//
//   tiny   vocab 512, hidden 128, 4 layers, 8 heads, 2 KV heads, head_dim 16  (~0.5M params)
//   small  vocab 2048, hidden 256, 6 layers, 8 heads, 4 KV heads, head_dim 32 (~5.7M params)
//   tiny-draft, small-draft
//          draft models for speculative decoding: the first quarter of the target's layers
//          (one, for both) with its embedding, final norm and LM head, so the vocabulary is
//          the target's and the draft often agrees with it (make_draft_model)
//   smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, tinyllama-1.1b
//          the published config.json of HuggingFaceTB/SmolLM2-135M, Qwen/Qwen2.5-0.5B,
//          meta-llama/Llama-3.2-1B and TinyLlama/TinyLlama-1.1B-Chat-v1.0 (snapshots cited in
//          presets.cc) with seeded random weights: the engine checked at real shapes (GQA
//          group 3, 7, 4 and 8; Qwen2 biases; llama3 rope scaling; vocabularies up to 151,936)
//          without a download
//   gemma-3-270m, gemma-3-1b
//          google/gemma-3-270m's and google/gemma-3-1b-it's published configs (Gemma3ForCausalLM:
//          five sliding layers of window 512 to one full, head_dim 256, MQA, vocab 262,144)
//   tiny-mistral-sw, tiny-qwen2-hybrid, tiny-gemma2, tiny-gemma3
//          tiny as each windowed architecture (window 20): every layer (Mistral), the last two
//          (Qwen2), alternating with caps 2 and 3 (Gemma 2), five to one with q/k norms and two
//          RoPE bases (Gemma 3)
//
// Weights are scaled so that each projection keeps unit variance and the logits have a
// standard deviation of about 2.5: next-token distributions that are neither one-hot nor
// uniform (tests/reference_model_test.cc checks the entropy).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/weights.h"

namespace kvp {

std::vector<std::string> preset_names();
Result<ModelConfig> preset_config(std::string_view name);
// The weights are drawn on `threads` threads: the same bits at any count.
Result<Model> make_preset(std::string_view name, uint64_t seed = 0, int threads = 1);

// Fills a model of any valid config with seeded random weights (the presets' recipe).
// REQUIRES: config.validate().is_ok().
Model make_random_model(const ModelConfig& config, uint64_t seed, int threads = 1);

// A draft model for `target`: its first `num_layers` layers, with its embedding, final norm
// and LM head (a layer-skipping draft: same vocabulary, a fraction of the cost).
// REQUIRES: 1 <= num_layers <= target.config.num_layers.
Model make_draft_model(const Model& target, int32_t num_layers);
// The draft's layers for a target: a quarter of them, at least one.
int32_t default_draft_layers(const ModelConfig& target);

}  // namespace kvp
