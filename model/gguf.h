// Writing a model as a GGUF file (version 3) that llama.cpp loads: `kvproof export --format gguf`.
//
// The layout, from the GGUF specification (github.com/ggml-org/ggml, docs/gguf.md), all little
// endian: the magic "GGUF", version 3 (uint32), the tensor count and the metadata count
// (uint64 each); each metadata pair (a string key, a uint32 value type, the value); each
// tensor's info (its name, n_dims (uint32), the dimensions innermost first (uint64 each), its
// ggml type (uint32), its data offset (uint64) from the start of the data section); padding to
// general.alignment (32); the tensor data, each tensor at an offset that is a multiple of the
// alignment. A string is a uint64 length and its bytes (no NUL).
//
// What llama.cpp reads (its convert_hf_to_gguf.py writes the same keys for these models):
// general.architecture ("llama" for Llama and Mistral, "qwen2" for Qwen2, "gemma2" and "gemma3"
// for Gemma: see save_gemma_gguf in gguf.cc), the hyperparameters
// under that prefix, and a vocabulary (tokenizer.ggml.*) of one token per id: kvproof works in
// token ids, so token i is the text "<kvp:i>" and nothing tokenizes text. Tensor names are
// llama.cpp's (token_embd.weight, blk.N.attn_q.weight, ...). A matrix of Hugging Face shape
// [out, in] has GGUF dimensions [in, out] with the same bytes. Llama's q and k rows are
// permuted within each head from Hugging Face's rotate-half pairing (i, i + D/2) to llama.cpp's
// adjacent pairs (2i, 2i + 1), as the converter does; Qwen2's are not (llama.cpp rotates its
// halves, NeoX-style).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "model/weights.h"

namespace kvp {

// The ggml type ids of the tensor dtypes written (ggml.h: GGML_TYPE_F32, _F16, _BF16).
constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlBf16 = 30;

struct GgufOptions {
  DType dtype = DType::kF32;     // the 2-D tensors' type: f32, f16 or bf16; norms and biases stay f32
  std::string name = "kvproof";  // general.name
};

// Writes `model` to `path` (the file is written whole to PATH.tmp, then renamed: no
// half-written file). Errors name what is not expressible in GGUF for llama.cpp: rope_scaling
// (llama.cpp takes Llama 3's as a computed rope_freqs tensor, not written here), MLP biases,
// an f64 dtype; and I/O failures with the path.
Status save_gguf(const Model& model, const std::string& path, const GgufOptions& options);

// Token `id`'s text in the vocabulary written: "<0xHH>" for the first 256 when the vocabulary
// has at least 512 tokens (llama.cpp's byte tokens, type BYTE), else "<kvp:ID>" (type NORMAL).
std::string gguf_token_text(int64_t id, int64_t vocab);

// Gemma's layers as llama.cpp's sliding_window_pattern P (layer il slides when il % P < P - 1;
// P = num_layers + 1: every layer), 0 when no layer slides; an error when the layers' types are
// not such a pattern.
Result<int64_t> gguf_gemma_swa_pattern(const ModelConfig& c);
// The score scale llama.cpp's gemma2/gemma3 apply (1/sqrt(head_dim); 1/sqrt(hidden / heads) for
// the layer counts it takes for 27B), whatever query_pre_attn_scalar says.
float gguf_gemma_llama_cpp_scale(const ModelConfig& c);

// The q/k row permutation from Hugging Face's rotate-half layout to llama.cpp's adjacent
// pairs, for a [heads * head_dim, cols] matrix (cols 1 for a bias): output row
// h*D + 2i + j = input row h*D + j*D/2 + i (j in {0, 1}, i < D/2).
std::vector<float> permute_rope_rows(const float* rows, int64_t heads, int64_t head_dim, int64_t cols);

}  // namespace kvp
