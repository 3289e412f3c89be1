// The smallest model the engine tests run: 2 layers, hidden 32, 4 query and 2 KV heads of
// dimension 8, vocabulary 64, random weights from seed 5. Small enough for hundreds of
// property cases; GQA, so the head mapping is exercised. One instance per program.
#pragma once

#include "model/model_config.h"
#include "model/presets.h"
#include "model/weights.h"

namespace kvp::test_models {

// The micro model's shape; a test that needs a variant (another vocabulary) starts here.
inline ModelConfig micro_config() {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 256;
  return c;
}

inline const Model& micro_model() {
  static const Model m = make_random_model(micro_config(), 5);
  return m;
}

}  // namespace kvp::test_models
