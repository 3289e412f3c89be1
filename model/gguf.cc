#include "model/gguf.h"

#include <cmath>
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

Result<int64_t> gguf_gemma_swa_pattern(const ModelConfig& c) {
  bool any = false;
  for (int64_t l = 0; l < c.num_layers; ++l) any |= c.layer_window(l) > 0;
  if (!any) return int64_t{0};
  // llama.cpp's set_swa_pattern: layer il is sliding when il % P < P - 1 (P > num_layers: all).
  for (int64_t p = 2; p <= c.num_layers + 1; ++p) {
    bool fits = true;
    for (int64_t l = 0; l < c.num_layers && fits; ++l) fits = (c.layer_window(l) > 0) == (l % p < p - 1);
    if (fits) return p;
  }
  std::string types;
  for (int64_t l = 0; l < c.num_layers; ++l) types += c.layer_window(l) > 0 ? 's' : 'f';
  return Status::error("gguf: the layers' attention types (" + types +
                       ", s sliding, f full) are not P - 1 sliding layers then a full one, repeated: llama.cpp's "
                       "gemma2/gemma3 read one sliding_window_pattern");
}

float gguf_gemma_llama_cpp_scale(const ModelConfig& c) {
  // llama.cpp's f_attention_scale: 1/sqrt(n_embd / n_head) for its "27B" type (gemma2: 46
  // layers; gemma3: 62), else 1/sqrt(head_dim); query_pre_attn_scalar is not read.
  const bool is_27b = c.num_layers == (c.architecture == Architecture::kGemma3 ? 62 : 46);
  const int64_t n = is_27b ? c.hidden_size / c.num_heads : c.head_dim;
  return 1.0f / std::sqrt(static_cast<float>(n));
}

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

namespace {

// A GGUF file being put together: tensors, metadata, then written whole.
class GgufWriter {
 public:
  explicit GgufWriter(DType dtype) : dtype_(dtype) {}
  void matrix(const std::string& name, const MatrixF& m) {
    tensors_.push_back(make_tensor(name, m.data(), m.rows(), m.cols(), dtype_));
  }
  void matrix(const std::string& name, const float* data, int64_t rows, int64_t cols) {
    tensors_.push_back(make_tensor(name, data, rows, cols, dtype_));
  }
  void vector(const std::string& name, const VectorF& v) {
    tensors_.push_back(make_tensor(name, v.data(), 1, v.size(), DType::kF32));
  }
  void vector(const std::string& name, const float* data, int64_t n) {
    tensors_.push_back(make_tensor(name, data, 1, n, DType::kF32));
  }
  void put_u32(const std::string& k, uint64_t v) {
    key(k, kU32);
    meta_.u32(static_cast<uint32_t>(v));
  }
  void put_f32(const std::string& k, double v) {
    key(k, kF32);
    meta_.f32(static_cast<float>(v));
  }
  void put_str(const std::string& k, const std::string& v) {
    key(k, kString);
    meta_.str(v);
  }
  void put_bool(const std::string& k, bool v) {
    key(k, kBool);
    const uint8_t b = v ? 1 : 0;
    meta_.raw(&b, 1);
  }
  // The header keys and the hyperparameters every architecture here shares, under `arch`.
  void put_common(const ModelConfig& c, const std::string& arch, const GgufOptions& options) {
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
  }
  // The vocabulary: one token per id ("<kvp:i>", type normal), a SentencePiece-style model so
  // that llama.cpp needs no merges; nothing here tokenizes text.
  void put_vocab(const ModelConfig& c) {
    put_str("tokenizer.ggml.model", "llama");
    key("tokenizer.ggml.tokens", kArray);
    meta_.u32(kString);
    meta_.u64(static_cast<uint64_t>(c.vocab_size));
    for (int64_t i = 0; i < c.vocab_size; ++i) meta_.str(gguf_token_text(i, c.vocab_size));
    key("tokenizer.ggml.scores", kArray);
    meta_.u32(kF32);
    meta_.u64(static_cast<uint64_t>(c.vocab_size));
    for (int64_t i = 0; i < c.vocab_size; ++i) meta_.f32(0.0f);
    key("tokenizer.ggml.token_type", kArray);
    meta_.u32(kI32);
    meta_.u64(static_cast<uint64_t>(c.vocab_size));
    for (int64_t i = 0; i < c.vocab_size; ++i) meta_.i32(byte_tokens(c.vocab_size) && i < 256 ? 6 : 1);  // BYTE, NORMAL
    const int32_t eos = c.eos_token_ids.empty() ? static_cast<int32_t>(c.vocab_size - 1) : c.eos_token_ids.front();
    put_u32("tokenizer.ggml.bos_token_id", 0);
    put_u32("tokenizer.ggml.eos_token_id", static_cast<uint64_t>(eos));
    put_bool("tokenizer.ggml.add_bos_token", false);
    put_bool("tokenizer.ggml.add_eos_token", false);
  }
  // Header, metadata, tensor infos, padding, data; to PATH.tmp, then renamed.
  Status write(const std::string& path) const {
    Bytes out;
    out.raw("GGUF", 4);
    out.u32(3);
    out.u64(tensors_.size());
    out.u64(count_);
    out.raw(meta_.data().data(), meta_.size());
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      out.str(t.name);
      out.u32(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) out.u64(d);
      out.u32(t.type);
      out.u64(offset);
      offset = (offset + t.bytes.size() + kAlignment - 1) / kAlignment * kAlignment;
    }
    out.pad_to(kAlignment);
    for (const Tensor& t : tensors_) {
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

 private:
  void key(const std::string& k, uint32_t type) {
    meta_.str(k);
    meta_.u32(type);
    ++count_;
  }
  DType dtype_;
  std::vector<Tensor> tensors_;
  Bytes meta_;
  uint64_t count_ = 0;
};

Status check_dtype(const GgufOptions& options) {
  if (options.dtype != DType::kF32 && options.dtype != DType::kF16 && options.dtype != DType::kBF16)
    return Status::error("gguf: dtype " +
                         std::string(dtype_name(options.dtype).data(), dtype_name(options.dtype).size()) +
                         " not written (f32, f16 or bf16)");
  return Status::ok();
}

// Gemma 2 and 3 as llama.cpp's gemma2 and gemma3 (read from the llama.cpp node-llama-cpp 3.21.1
// bundles, release v0.4.0 of 2026-09-12: src/models/gemma2.cpp and gemma3.cpp, load_arch_hparams,
// llama_hparams::set_swa_pattern, conversion/gemma.py):
//   - every RMSNorm weight stored as its gain 1 + w (llama.cpp multiplies by the weight; its
//     converter adds the one), the MLP's input norm as ffn_norm, its output norm post_ffw_norm;
//   - q and k unpermuted (NeoX RoPE), no output.weight when tied (gemma2 refuses one);
//   - the layers' types as sliding_window_pattern P (layer il slides when il % P < P - 1);
//   - the local RoPE base as rope.freq_base_swa (llama.cpp's gemma3 defaults it to 10000);
//   - the caps (gemma2 reads both, defaulting to 50 and 30, and divides by them: a model without
//     them is refused; gemma3 reads the final cap only);
//   - llama.cpp scales q by 1/sqrt(head_dim) (gguf_gemma_llama_cpp_scale) and ignores
//     query_pre_attn_scalar: where the model's scale differs, the ratio is folded into the
//     weights that make q (gemma2: attn_q; gemma3: the q norm's gain, after which nothing
//     rescales q), so the scores are the model's.
Status save_gemma_gguf(const Model& model, const std::string& path, const GgufOptions& options) {
  const ModelConfig& c = model.config;
  const bool gemma3 = c.architecture == Architecture::kGemma3;
  const std::string arch = gemma3 ? "gemma3" : "gemma2";
  const std::string why = "gguf: " + arch + ": ";
  if (c.qkv_bias || c.o_bias) return Status::error(why + "attention biases are not written (Gemma has none)");
  if (!gemma3 && !c.tie_word_embeddings)
    return Status::error(why + "untied lm_head: llama.cpp's gemma2 reads no output.weight");
  if (!gemma3 && (c.attn_logit_softcapping <= 0.0 || c.final_logit_softcapping <= 0.0))
    return Status::error(why +
                         "llama.cpp's gemma2 soft-caps scores and logits always (defaults 50 and 30): a model "
                         "without both caps is not expressible");
  if (gemma3 && c.attn_logit_softcapping > 0.0)
    return Status::error(why + "llama.cpp's gemma3 has no attention soft-cap (attn_logit_softcapping " +
                         std::to_string(c.attn_logit_softcapping) + ")");
  auto pattern = gguf_gemma_swa_pattern(c);
  if (!pattern) return pattern.status();
  if (!gemma3 && *pattern == 0)
    return Status::error(why + "a model with no sliding layer: llama.cpp's gemma2 always slides (window 0 masks all)");
  const float fold = c.attention_scale() / gguf_gemma_llama_cpp_scale(c);
  const ModelWeights& w = model.weights;
  GgufWriter g(options.dtype);
  g.matrix("token_embd.weight", w.embed_tokens);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w.layers[static_cast<std::size_t>(l)];
    const std::string b = "blk." + std::to_string(l) + ".";
    g.vector(b + "attn_norm.weight", norm_gain(c, L.input_layernorm));
    if (!gemma3 && fold != 1.0f) {
      const MatrixF q = L.q_proj * fold;
      g.matrix(b + "attn_q.weight", q);
    } else {
      g.matrix(b + "attn_q.weight", L.q_proj);
    }
    g.matrix(b + "attn_k.weight", L.k_proj);
    g.matrix(b + "attn_v.weight", L.v_proj);
    if (gemma3) {
      const VectorF q_gain = norm_gain(c, L.q_norm) * fold;
      g.vector(b + "attn_q_norm.weight", q_gain);
      g.vector(b + "attn_k_norm.weight", norm_gain(c, L.k_norm));
    }
    g.matrix(b + "attn_output.weight", L.o_proj);
    g.vector(b + "post_attention_norm.weight", norm_gain(c, L.post_attention_layernorm));
    g.vector(b + "ffn_norm.weight", norm_gain(c, L.pre_feedforward_layernorm));
    g.matrix(b + "ffn_gate.weight", L.gate_proj);
    g.matrix(b + "ffn_up.weight", L.up_proj);
    g.matrix(b + "ffn_down.weight", L.down_proj);
    g.vector(b + "post_ffw_norm.weight", norm_gain(c, L.post_feedforward_layernorm));
  }
  g.vector("output_norm.weight", norm_gain(c, w.norm));
  if (!c.tie_word_embeddings) g.matrix("output.weight", w.lm_head);

  g.put_common(c, arch, options);
  if (*pattern > 0) {
    g.put_u32(arch + ".attention.sliding_window", static_cast<uint64_t>(c.sliding_window));
    g.put_u32(arch + ".attention.sliding_window_pattern", static_cast<uint64_t>(*pattern));
  }
  g.put_f32(arch + ".rope.freq_base_swa", c.rope_local_base_freq > 0.0 ? c.rope_local_base_freq : c.rope_theta);
  if (!gemma3) g.put_f32(arch + ".attn_logit_softcapping", c.attn_logit_softcapping);
  if (c.final_logit_softcapping > 0.0) g.put_f32(arch + ".final_logit_softcapping", c.final_logit_softcapping);
  g.put_vocab(c);
  return g.write(path);
}

}  // namespace

Status save_gguf(const Model& model, const std::string& path, const GgufOptions& options) {
  const ModelConfig& c = model.config;
  if (Status s = c.validate(); !s) return s;
  KVP_RETURN_IF_ERROR(check_dtype(options));
  if (c.rope_scaling.type != RopeScaling::Type::kNone)
    return Status::error(
        "gguf: rope_scaling is not written (llama.cpp takes Llama 3's as a rope_freqs tensor, linear as "
        "rope.scaling.*; neither is exported yet): export a preset without it");
  if (c.mlp_bias) return Status::error("gguf: mlp_bias (gate/up/down biases) has no llama.cpp tensor");
  if (c.gemma()) return save_gemma_gguf(model, path, options);
  if (c.sliding_window > 0)
    return Status::error("gguf: sliding_window " + std::to_string(c.sliding_window) +
                         " is not written (llama.cpp's llama architecture would attend to the whole past)");
  const bool qwen2 = c.architecture == Architecture::kQwen2;
  const std::string arch = qwen2 ? "qwen2" : "llama";
  const ModelWeights& w = model.weights;
  GgufWriter g(options.dtype);
  // q/k rows permuted for llama.cpp's adjacent-pair rotation (Llama and Mistral only).
  auto rope_matrix = [&](const std::string& name, const MatrixF& m, int64_t heads) {
    if (qwen2) return g.matrix(name, m);
    const std::vector<float> p = permute_rope_rows(m.data(), heads, c.head_dim, m.cols());
    g.matrix(name, p.data(), m.rows(), m.cols());
  };
  auto rope_vector = [&](const std::string& name, const VectorF& v, int64_t heads) {
    if (qwen2) return g.vector(name, v);
    const std::vector<float> p = permute_rope_rows(v.data(), heads, c.head_dim, 1);
    g.vector(name, p.data(), v.size());
  };
  g.matrix("token_embd.weight", w.embed_tokens);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w.layers[static_cast<std::size_t>(l)];
    const std::string b = "blk." + std::to_string(l) + ".";
    g.vector(b + "attn_norm.weight", L.input_layernorm);
    rope_matrix(b + "attn_q.weight", L.q_proj, c.num_heads);
    rope_matrix(b + "attn_k.weight", L.k_proj, c.num_kv_heads);
    g.matrix(b + "attn_v.weight", L.v_proj);
    if (c.qkv_bias) {
      rope_vector(b + "attn_q.bias", L.q_bias, c.num_heads);
      rope_vector(b + "attn_k.bias", L.k_bias, c.num_kv_heads);
      g.vector(b + "attn_v.bias", L.v_bias);
    }
    g.matrix(b + "attn_output.weight", L.o_proj);
    if (c.o_bias) g.vector(b + "attn_output.bias", L.o_bias);
    g.vector(b + "ffn_norm.weight", L.post_attention_layernorm);
    g.matrix(b + "ffn_gate.weight", L.gate_proj);
    g.matrix(b + "ffn_up.weight", L.up_proj);
    g.matrix(b + "ffn_down.weight", L.down_proj);
  }
  g.vector("output_norm.weight", w.norm);
  if (!c.tie_word_embeddings) g.matrix("output.weight", w.lm_head);
  g.put_common(c, arch, options);
  g.put_vocab(c);
  return g.write(path);
}

}  // namespace kvp
