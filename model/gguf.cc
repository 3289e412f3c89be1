#include "model/gguf.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace kvp {
namespace {

constexpr uint64_t kAlignment = 32;
// GGUF metadata value types (gguf.md: gguf_metadata_value_type).
constexpr uint32_t kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9;
// llama.cpp's llama_ftype: all f32, mostly f16, mostly bf16.
uint32_t file_type(DType d) { return d == DType::kF16 ? 1 : d == DType::kBF16 ? 32 : 0; }

class Bytes {
 public:
  void u32(uint32_t v) { raw(&v, 4); }
  void i32(int32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f32(float v) { raw(&v, 4); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const char*>(p);
    data_.insert(data_.end(), b, b + n);
  }
  void pad_to(uint64_t alignment) { data_.resize((data_.size() + alignment - 1) / alignment * alignment, '\0'); }
  std::size_t size() const { return data_.size(); }
  const std::vector<char>& data() const { return data_; }

 private:
  std::vector<char> data_;
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;  // GGUF order: innermost first
  uint32_t type = kGgmlF32;
  std::vector<char> bytes;
};

Tensor make_tensor(const std::string& name, const float* data, int64_t rows, int64_t cols, DType dtype) {
  Tensor t;
  t.name = name;
  if (rows == 1) {
    t.dims = {static_cast<uint64_t>(cols)};
  } else {
    t.dims = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
  }
  const int64_t n = rows * cols;
  // Vectors (norms, biases) stay f32, as llama.cpp's converter keeps them.
  const DType d = rows == 1 ? DType::kF32 : dtype;
  t.type = d == DType::kF16 ? kGgmlF16 : d == DType::kBF16 ? kGgmlBf16 : kGgmlF32;
  t.bytes.resize(static_cast<std::size_t>(n) * (d == DType::kF32 ? 4 : 2));
  for (int64_t i = 0; i < n; ++i) {
    if (d == DType::kF32) {
      std::memcpy(t.bytes.data() + i * 4, &data[i], 4);
    } else {
      const uint16_t bits = d == DType::kF16 ? float_to_f16(data[i]) : float_to_bf16(data[i]);
      std::memcpy(t.bytes.data() + i * 2, &bits, 2);
    }
  }
  return t;
}

// The 256 byte tokens "<0x00>".."<0xFF>" first when the vocabulary holds them and more:
// llama.cpp's SentencePiece vocabulary looks up "<0x0A>" (its newline), and text that reaches
// its tokenizer falls back to them. Ids stay one to one whatever the names.
bool byte_tokens(int64_t vocab) { return vocab >= 512; }

}  // namespace

std::string gguf_token_text(int64_t id, int64_t vocab) {
  if (byte_tokens(vocab) && id < 256) {
    char b[8];
    std::snprintf(b, sizeof b, "<0x%02X>", static_cast<unsigned>(id));
    return b;
  }
  return "<kvp:" + std::to_string(id) + ">";
}

std::vector<float> permute_rope_rows(const float* rows, int64_t heads, int64_t head_dim, int64_t cols) {
  std::vector<float> out(static_cast<std::size_t>(heads * head_dim * cols));
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(out.data() + ((h * head_dim + 2 * i + j) * cols), rows + ((h * head_dim + j * half + i) * cols),
                    static_cast<std::size_t>(cols) * sizeof(float));
  return out;
}

Status save_gguf(const Model& model, const std::string& path, const GgufOptions& options) {
  const ModelConfig& c = model.config;
  if (Status s = c.validate(); !s) return s;
  if (options.dtype != DType::kF32 && options.dtype != DType::kF16 && options.dtype != DType::kBF16)
    return Status::error("gguf: dtype " +
                         std::string(dtype_name(options.dtype).data(), dtype_name(options.dtype).size()) +
                         " not written (f32, f16 or bf16)");
  if (c.rope_scaling.type != RopeScaling::Type::kNone)
    return Status::error(
        "gguf: rope_scaling is not written (llama.cpp takes Llama 3's as a rope_freqs tensor, linear as "
        "rope.scaling.*; neither is exported yet): export a preset without it");
  if (c.mlp_bias) return Status::error("gguf: mlp_bias (gate/up/down biases) has no llama.cpp tensor");
  if (c.gemma())
    return Status::error(std::string("gguf: ") + architecture_class_name(c.architecture) +
                         " is not written (llama.cpp's gemma2/gemma3 architectures are not exported yet; as llama it "
                         "would lose Gemma's norms, GeGLU and scaling)");
  if (c.sliding_window > 0)
    return Status::error("gguf: sliding_window " + std::to_string(c.sliding_window) +
                         " is not written (llama.cpp's llama architecture would attend to the whole past)");
  const bool qwen2 = c.architecture == Architecture::kQwen2;
  const std::string arch = qwen2 ? "qwen2" : "llama";
  const ModelWeights& w = model.weights;

  std::vector<Tensor> tensors;
  auto matrix = [&](const std::string& name, const MatrixF& m) {
    tensors.push_back(make_tensor(name, m.data(), m.rows(), m.cols(), options.dtype));
  };
  auto vector = [&](const std::string& name, const VectorF& v) {
    tensors.push_back(make_tensor(name, v.data(), 1, v.size(), DType::kF32));
  };
  // q/k rows permuted for llama.cpp's adjacent-pair rotation (Llama and Mistral only).
  auto rope_matrix = [&](const std::string& name, const MatrixF& m, int64_t heads) {
    if (qwen2) return matrix(name, m);
    const std::vector<float> p = permute_rope_rows(m.data(), heads, c.head_dim, m.cols());
    tensors.push_back(make_tensor(name, p.data(), m.rows(), m.cols(), options.dtype));
  };
  auto rope_vector = [&](const std::string& name, const VectorF& v, int64_t heads) {
    if (qwen2) return vector(name, v);
    const std::vector<float> p = permute_rope_rows(v.data(), heads, c.head_dim, 1);
    tensors.push_back(make_tensor(name, p.data(), 1, v.size(), DType::kF32));
  };
  matrix("token_embd.weight", w.embed_tokens);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w.layers[static_cast<std::size_t>(l)];
    const std::string b = "blk." + std::to_string(l) + ".";
    vector(b + "attn_norm.weight", L.input_layernorm);
    rope_matrix(b + "attn_q.weight", L.q_proj, c.num_heads);
    rope_matrix(b + "attn_k.weight", L.k_proj, c.num_kv_heads);
    matrix(b + "attn_v.weight", L.v_proj);
    if (c.qkv_bias) {
      rope_vector(b + "attn_q.bias", L.q_bias, c.num_heads);
      rope_vector(b + "attn_k.bias", L.k_bias, c.num_kv_heads);
      vector(b + "attn_v.bias", L.v_bias);
    }
    matrix(b + "attn_output.weight", L.o_proj);
    if (c.o_bias) vector(b + "attn_output.bias", L.o_bias);
    vector(b + "ffn_norm.weight", L.post_attention_layernorm);
    matrix(b + "ffn_gate.weight", L.gate_proj);
    matrix(b + "ffn_up.weight", L.up_proj);
    matrix(b + "ffn_down.weight", L.down_proj);
  }
  vector("output_norm.weight", w.norm);
  if (!c.tie_word_embeddings) matrix("output.weight", w.lm_head);

  // Metadata.
  Bytes meta;
  uint64_t count = 0;
  auto key = [&](const std::string& k, uint32_t type) {
    meta.str(k);
    meta.u32(type);
    ++count;
  };
  auto put_u32 = [&](const std::string& k, uint64_t v) {
    key(k, kU32);
    meta.u32(static_cast<uint32_t>(v));
  };
  auto put_f32 = [&](const std::string& k, double v) {
    key(k, kF32);
    meta.f32(static_cast<float>(v));
  };
  auto put_str = [&](const std::string& k, const std::string& v) {
    key(k, kString);
    meta.str(v);
  };
  auto put_bool = [&](const std::string& k, bool v) {
    key(k, kBool);
    const uint8_t b = v ? 1 : 0;
    meta.raw(&b, 1);
  };
  put_str("general.architecture", arch);
  put_str("general.name", options.name);
  put_u32("general.alignment", kAlignment);
  put_u32("general.file_type", file_type(options.dtype));
  put_u32(arch + ".vocab_size", c.vocab_size);
  put_u32(arch + ".context_length", c.max_position_embeddings);
  put_u32(arch + ".embedding_length", c.hidden_size);
  put_u32(arch + ".block_count", c.num_layers);
  put_u32(arch + ".feed_forward_length", c.intermediate_size);
  put_u32(arch + ".attention.head_count", c.num_heads);
  put_u32(arch + ".attention.head_count_kv", c.num_kv_heads);
  put_u32(arch + ".attention.key_length", c.head_dim);
  put_u32(arch + ".attention.value_length", c.head_dim);
  put_f32(arch + ".attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  put_f32(arch + ".rope.freq_base", c.rope_theta);
  put_u32(arch + ".rope.dimension_count", c.head_dim);
  // The vocabulary: one token per id ("<kvp:i>", type normal), a SentencePiece-style model so
  // that llama.cpp needs no merges; nothing here tokenizes text.
  put_str("tokenizer.ggml.model", "llama");
  key("tokenizer.ggml.tokens", kArray);
  meta.u32(kString);
  meta.u64(static_cast<uint64_t>(c.vocab_size));
  for (int64_t i = 0; i < c.vocab_size; ++i) meta.str(gguf_token_text(i, c.vocab_size));
  key("tokenizer.ggml.scores", kArray);
  meta.u32(kF32);
  meta.u64(static_cast<uint64_t>(c.vocab_size));
  for (int64_t i = 0; i < c.vocab_size; ++i) meta.f32(0.0f);
  key("tokenizer.ggml.token_type", kArray);
  meta.u32(kI32);
  meta.u64(static_cast<uint64_t>(c.vocab_size));
  for (int64_t i = 0; i < c.vocab_size; ++i) meta.i32(byte_tokens(c.vocab_size) && i < 256 ? 6 : 1);  // BYTE, NORMAL
  const int32_t eos = c.eos_token_ids.empty() ? static_cast<int32_t>(c.vocab_size - 1) : c.eos_token_ids.front();
  put_u32("tokenizer.ggml.bos_token_id", 0);
  put_u32("tokenizer.ggml.eos_token_id", static_cast<uint64_t>(eos));
  put_bool("tokenizer.ggml.add_bos_token", false);
  put_bool("tokenizer.ggml.add_eos_token", false);

  // Header, metadata, tensor infos, padding, data.
  Bytes out;
  out.raw("GGUF", 4);
  out.u32(3);
  out.u64(tensors.size());
  out.u64(count);
  out.raw(meta.data().data(), meta.size());
  uint64_t offset = 0;
  for (const Tensor& t : tensors) {
    out.str(t.name);
    out.u32(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) out.u64(d);
    out.u32(t.type);
    out.u64(offset);
    offset = (offset + t.bytes.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  out.pad_to(kAlignment);
  for (const Tensor& t : tensors) {
    out.raw(t.bytes.data(), t.bytes.size());
    out.pad_to(kAlignment);
  }

  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status::error(tmp + ": cannot open for writing");
    f.write(out.data().data(), static_cast<std::streamsize>(out.size()));
    if (!f) {
      std::remove(tmp.c_str());
      return Status::error(tmp + ": write failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return Status::error(path + ": cannot rename " + tmp + ": " + ec.message());
  }
  return Status::ok();
}

}  // namespace kvp
