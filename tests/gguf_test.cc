// The GGUF writer (model/gguf.h) against the GGUF specification's layout, read back here by a
// walker written from the specification (not by the writer's code): header, metadata, tensor
// infos, alignment, and every tensor's bytes against the model's weights; the q/k row
// permutation against the rotary embedding's own math; and the refusals.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <variant>

#include "common/rng.h"
#include "model/presets.h"

namespace kvp {
namespace {

struct Reader {
  std::vector<char> bytes;
  std::size_t at = 0;
  bool ok = true;
  template <typename T>
  T get() {
    T v{};
    if (at + sizeof(T) > bytes.size()) {
      ok = false;
      return v;
    }
    std::memcpy(&v, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    if (!ok || at + n > bytes.size()) {
      ok = false;
      return "";
    }
    std::string s(bytes.data() + at, n);
    at += n;
    return s;
  }
};

using Value = std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<std::string>, std::vector<double>,
                           std::vector<int64_t>>;

struct TensorInfo {
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  uint64_t offset = 0;
};

struct Parsed {
  uint32_t version = 0;
  std::map<std::string, Value> meta;
  std::vector<std::string> order;  // tensor names in file order
  std::map<std::string, TensorInfo> tensors;
  std::size_t data_start = 0;
  std::vector<char> bytes;
};

Value read_value(Reader& r, uint32_t type) {
  switch (type) {
    case 0: return static_cast<uint64_t>(r.get<uint8_t>());
    case 4: return static_cast<uint64_t>(r.get<uint32_t>());
    case 5: return static_cast<int64_t>(r.get<int32_t>());
    case 6: return static_cast<double>(r.get<float>());
    case 7: return r.get<uint8_t>() != 0;
    case 8: return r.str();
    case 10: return r.get<uint64_t>();
    case 9: {
      const uint32_t elem = r.get<uint32_t>();
      const uint64_t n = r.get<uint64_t>();
      if (elem == 8) {
        std::vector<std::string> v;
        for (uint64_t i = 0; i < n && r.ok; ++i) v.push_back(r.str());
        return v;
      }
      if (elem == 6) {
        std::vector<double> v;
        for (uint64_t i = 0; i < n && r.ok; ++i) v.push_back(r.get<float>());
        return v;
      }
      if (elem == 5) {
        std::vector<int64_t> v;
        for (uint64_t i = 0; i < n && r.ok; ++i) v.push_back(r.get<int32_t>());
        return v;
      }
      ADD_FAILURE() << "array of type " << elem;
      r.ok = false;
      return uint64_t{0};
    }
    default: ADD_FAILURE() << "metadata type " << type; r.ok = false;
  }
  return uint64_t{0};
}

Parsed parse(const std::string& path) {
  Parsed p;
  std::ifstream f(path, std::ios::binary);
  Reader r{std::vector<char>(std::istreambuf_iterator<char>(f), {})};
  EXPECT_EQ(std::string(r.bytes.data(), 4), "GGUF");
  r.at = 4;
  p.version = r.get<uint32_t>();
  const uint64_t tensors = r.get<uint64_t>(), meta = r.get<uint64_t>();
  for (uint64_t i = 0; i < meta && r.ok; ++i) {
    const std::string key = r.str();
    const uint32_t type = r.get<uint32_t>();
    EXPECT_EQ(p.meta.count(key), 0u) << "duplicate key " << key;
    p.meta[key] = read_value(r, type);
  }
  for (uint64_t i = 0; i < tensors && r.ok; ++i) {
    const std::string name = r.str();
    TensorInfo t;
    const uint32_t n = r.get<uint32_t>();
    for (uint32_t d = 0; d < n; ++d) t.dims.push_back(r.get<uint64_t>());
    t.type = r.get<uint32_t>();
    t.offset = r.get<uint64_t>();
    p.order.push_back(name);
    p.tensors[name] = t;
  }
  EXPECT_TRUE(r.ok) << "truncated header";
  const uint64_t alignment = std::get<uint64_t>(p.meta.at("general.alignment"));
  p.data_start = (r.at + alignment - 1) / alignment * alignment;
  p.bytes = std::move(r.bytes);
  return p;
}

uint64_t u(const Parsed& p, const std::string& k) { return std::get<uint64_t>(p.meta.at(k)); }

// The tensor's elements as floats (from f32, f16 or bf16 bytes).
std::vector<float> tensor_floats(const Parsed& p, const std::string& name) {
  const TensorInfo& t = p.tensors.at(name);
  uint64_t n = 1;
  for (uint64_t d : t.dims) n *= d;
  const char* base = p.bytes.data() + p.data_start + t.offset;
  std::vector<float> out(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (t.type == kGgmlF32) {
      std::memcpy(&out[i], base + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, base + 2 * i, 2);
      out[i] = t.type == kGgmlF16 ? f16_to_float(bits) : bf16_to_float(bits);
    }
  }
  return out;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kvp_gguf_test_" + name)).string();
}

ModelConfig small_config(Architecture arch) {
  ModelConfig c = make_preset("tiny").value().config;
  c.architecture = arch;
  c.qkv_bias = arch == Architecture::kQwen2;
  c.num_kv_heads = 2;
  return c;
}

TEST(Gguf, TheFileFollowsTheSpecificationsLayoutAndHoldsEveryWeight) {
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2}) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      Model model;
      model.config = small_config(arch);
      model.weights = allocate_weights(model.config);
      Rng rng(5);
      for (NamedTensor& t : named_tensors(model.config, model.weights)) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        for (int64_t i = 0; i < n; ++i) t.data[i] = static_cast<float>(rng.uniform() - 0.5);
      }
      const std::string path = temp_path("layout.gguf");
      GgufOptions o;
      o.dtype = dtype;
      ASSERT_TRUE(save_gguf(model, path, o).is_ok());
      const Parsed p = parse(path);
      const ModelConfig& c = model.config;
      const std::string a = arch == Architecture::kQwen2 ? "qwen2" : "llama";
      EXPECT_EQ(p.version, 3u);
      EXPECT_EQ(std::get<std::string>(p.meta.at("general.architecture")), a);
      EXPECT_EQ(u(p, a + ".block_count"), static_cast<uint64_t>(c.num_layers));
      EXPECT_EQ(u(p, a + ".embedding_length"), static_cast<uint64_t>(c.hidden_size));
      EXPECT_EQ(u(p, a + ".feed_forward_length"), static_cast<uint64_t>(c.intermediate_size));
      EXPECT_EQ(u(p, a + ".attention.head_count"), static_cast<uint64_t>(c.num_heads));
      EXPECT_EQ(u(p, a + ".attention.head_count_kv"), static_cast<uint64_t>(c.num_kv_heads));
      EXPECT_EQ(u(p, a + ".rope.dimension_count"), static_cast<uint64_t>(c.head_dim));
      EXPECT_EQ(u(p, a + ".context_length"), static_cast<uint64_t>(c.max_position_embeddings));
      EXPECT_EQ(std::get<double>(p.meta.at(a + ".rope.freq_base")), static_cast<float>(c.rope_theta));
      EXPECT_EQ(std::get<double>(p.meta.at(a + ".attention.layer_norm_rms_epsilon")),
                static_cast<float>(c.rms_norm_eps));
      EXPECT_EQ(u(p, "general.file_type"), dtype == DType::kF32 ? 0u : dtype == DType::kF16 ? 1u : 32u);
      const auto& tokens = std::get<std::vector<std::string>>(p.meta.at("tokenizer.ggml.tokens"));
      ASSERT_EQ(tokens.size(), static_cast<std::size_t>(c.vocab_size));
      EXPECT_EQ(std::set<std::string>(tokens.begin(), tokens.end()).size(), tokens.size()) << "token texts unique";
      EXPECT_EQ(tokens[10], "<0x0A>");
      EXPECT_EQ(tokens[300], "<kvp:300>");
      EXPECT_EQ(std::get<std::vector<double>>(p.meta.at("tokenizer.ggml.scores")).size(), tokens.size());
      EXPECT_EQ(std::get<std::vector<int64_t>>(p.meta.at("tokenizer.ggml.token_type")).size(), tokens.size());
      // Every tensor: aligned, inside the file, in order without overlap; matrices [in, out].
      uint64_t end = 0;
      for (const std::string& name : p.order) {
        const TensorInfo& t = p.tensors.at(name);
        EXPECT_EQ(t.offset % 32, 0u) << name;
        EXPECT_GE(t.offset, end) << name;
        uint64_t n = 1;
        for (uint64_t d : t.dims) n *= d;
        end = t.offset + n * (t.type == kGgmlF32 ? 4 : 2);
        EXPECT_EQ(t.type, t.dims.size() == 1     ? kGgmlF32
                          : dtype == DType::kF32 ? kGgmlF32
                          : dtype == DType::kF16 ? kGgmlF16
                                                 : kGgmlBf16)
            << name;
      }
      EXPECT_LE(p.data_start + end, p.bytes.size());
      const int expected_tensors =
          1 + 1 + static_cast<int>(c.num_layers) * (9 + (c.qkv_bias ? 3 : 0)) + (c.tie_word_embeddings ? 0 : 1);
      EXPECT_EQ(static_cast<int>(p.order.size()), expected_tensors);
      EXPECT_EQ(p.tensors.at("blk.0.attn_q.weight").dims,
                (std::vector<uint64_t>{static_cast<uint64_t>(c.hidden_size), static_cast<uint64_t>(c.q_dim())}));
      // Values: through the dtype's rounding; q and k rows permuted for llama only.
      const auto rounded = [&](float x) {
        return dtype == DType::kF16    ? f16_to_float(float_to_f16(x))
               : dtype == DType::kBF16 ? bf16_to_float(float_to_bf16(x))
                                       : x;
      };
      const LayerWeights& L = model.weights.layers[1];
      const std::vector<float> v = tensor_floats(p, "blk.1.attn_v.weight");
      for (int64_t i = 0; i < L.v_proj.size(); ++i) ASSERT_EQ(v[i], rounded(L.v_proj.data()[i])) << i;
      const std::vector<float> k = tensor_floats(p, "blk.1.attn_k.weight");
      const std::vector<float> k_expected =
          arch == Architecture::kQwen2 ? std::vector<float>(L.k_proj.data(), L.k_proj.data() + L.k_proj.size())
                                       : permute_rope_rows(L.k_proj.data(), c.num_kv_heads, c.head_dim, c.hidden_size);
      for (std::size_t i = 0; i < k.size(); ++i) ASSERT_EQ(k[i], rounded(k_expected[i])) << i;
      const std::vector<float> norm = tensor_floats(p, "output_norm.weight");
      for (int64_t i = 0; i < model.weights.norm.size(); ++i) ASSERT_EQ(norm[i], model.weights.norm[i]);
      if (c.qkv_bias) {
        const std::vector<float> qb = tensor_floats(p, "blk.1.attn_q.bias");
        for (int64_t i = 0; i < L.q_bias.size(); ++i) ASSERT_EQ(qb[i], L.q_bias[i]) << "qwen2: not permuted";
      }
      std::filesystem::remove(path);
    }
  }
}

// The permutation's point: llama.cpp rotates adjacent pairs (2i, 2i+1), Hugging Face (and the
// oracle) pairs i with i + D/2. Rotating the permuted projection's output the first way must
// give the permuted rotation of the original's output the second way.
TEST(Gguf, PermutedRowsRotatedAsAdjacentPairsEqualRotateHalf) {
  const int64_t heads = 3, d = 8, cols = 5;
  Rng rng(11);
  std::vector<float> w(static_cast<std::size_t>(heads * d * cols)), x(cols);
  for (float& e : w) e = static_cast<float>(rng.uniform() - 0.5);
  for (float& e : x) e = static_cast<float>(rng.uniform() - 0.5);
  const std::vector<float> pw = permute_rope_rows(w.data(), heads, d, cols);
  auto project = [&](const std::vector<float>& m) {
    std::vector<double> y(static_cast<std::size_t>(heads * d), 0.0);
    for (int64_t r = 0; r < heads * d; ++r)
      for (int64_t k = 0; k < cols; ++k) y[r] += static_cast<double>(m[r * cols + k]) * x[k];
    return y;
  };
  const std::vector<double> y = project(w), py = project(pw);
  const double pos = 7, theta = 10000;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const double angle = pos * std::pow(theta, -2.0 * i / d), c = std::cos(angle), s = std::sin(angle);
      // Hugging Face: (x_i, x_{i+D/2}).
      const double a = y[h * d + i], b = y[h * d + i + d / 2];
      const double hf_first = a * c - b * s, hf_second = b * c + a * s;
      // llama.cpp on the permuted rows: (x_{2i}, x_{2i+1}).
      const double pa = py[h * d + 2 * i], pb = py[h * d + 2 * i + 1];
      EXPECT_NEAR(pa * c - pb * s, hf_first, 1e-12);
      EXPECT_NEAR(pb * c + pa * s, hf_second, 1e-12);
    }
  }
}

TEST(Gguf, WhatLlamaCppCannotTakeIsRefusedByNameAndNoFileIsLeft) {
  const std::string path = temp_path("refused.gguf");
  std::filesystem::remove(path);
  Model scaled = make_preset("tiny").value();
  scaled.config.rope_scaling.type = RopeScaling::Type::kLlama3;  // as llama-3.2-1b's
  scaled.config.rope_scaling.factor = 32;
  scaled.config.rope_scaling.original_max_position_embeddings = 8192;
  Status s = save_gguf(scaled, path, {});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("gguf: rope_scaling is not written"), std::string::npos) << s.message();
  // Gemma where llama.cpp's gemma2/gemma3 cannot follow: Gemma 2 without its caps (llama.cpp
  // applies 50 and 30 whatever), Gemma 3 with an attention cap (llama.cpp has none), Gemma 2
  // untied, and layer types that are not a sliding_window_pattern.
  Model gemma2 = make_preset("tiny-gemma2").value();
  gemma2.config.final_logit_softcapping = 0;
  s = save_gguf(gemma2, path, {});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("gguf: gemma2: llama.cpp's gemma2 soft-caps scores and logits always"), std::string::npos)
      << s.message();
  Model gemma3 = make_preset("tiny-gemma3").value();
  gemma3.config.attn_logit_softcapping = 10;
  s = save_gguf(gemma3, path, {});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("gguf: gemma3: llama.cpp's gemma3 has no attention soft-cap"), std::string::npos)
      << s.message();
  gemma3 = make_preset("tiny-gemma3").value();
  gemma3.config.sliding_layers = {true, false, true, true, true, false};  // s f s s s f
  s = save_gguf(gemma3, path, {});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("(sfsssf, s sliding, f full) are not P - 1 sliding layers then a full one"),
            std::string::npos)
      << s.message();
  Model tiny = make_preset("tiny").value();
  GgufOptions f64;
  f64.dtype = DType::kF64;
  s = save_gguf(tiny, path, f64);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("dtype F64 not written"), std::string::npos) << s.message();
  tiny.config.mlp_bias = true;
  tiny.weights = allocate_weights(tiny.config);
  s = save_gguf(tiny, path, {});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("mlp_bias"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(path));
  s = save_gguf(make_preset("tiny").value(), "/nonexistent-dir/x.gguf", {});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("/nonexistent-dir/x.gguf.tmp: cannot open"), std::string::npos) << s.message();
}

// Gemma 2 and 3 as llama.cpp's gemma2 and gemma3: its keys, its tensor names (the MLP's input
// norm as ffn_norm, its output norm post_ffw_norm, no output.weight when tied), every RMSNorm
// weight stored as its gain 1 + w (llama.cpp multiplies by the weight), q and k not permuted
// (NeoX RoPE), the layers as sliding_window_pattern, and a score scale llama.cpp does not read
// (query_pre_attn_scalar) folded into what makes q: attn_q for gemma2, the q norm's gain for
// gemma3 (whose q norm would undo a scaled attn_q).
TEST(Gguf, GemmaIsWrittenAsLlamaCppsGemma2AndGemma3) {
  for (const char* preset : {"tiny-gemma2", "tiny-gemma3"}) {
    SCOPED_TRACE(preset);
    const Model model = make_preset(preset).value();
    const ModelConfig& c = model.config;
    const bool gemma3 = c.architecture == Architecture::kGemma3;
    const std::string a = gemma3 ? "gemma3" : "gemma2";
    const std::string path = temp_path(a + ".gguf");
    ASSERT_TRUE(save_gguf(model, path, {}).is_ok());
    const Parsed p = parse(path);
    EXPECT_EQ(std::get<std::string>(p.meta.at("general.architecture")), a);
    EXPECT_EQ(u(p, a + ".attention.sliding_window"), static_cast<uint64_t>(c.sliding_window));
    // tiny-gemma2 alternates from a sliding layer 0 (pattern 2); tiny-gemma3 has five sliding
    // layers and then a full one (pattern 6): llama.cpp's il % P < P - 1.
    EXPECT_EQ(u(p, a + ".attention.sliding_window_pattern"), gemma3 ? 6u : 2u);
    for (int64_t l = 0; l < c.num_layers; ++l)
      EXPECT_EQ(c.layer_window(l) > 0, l % static_cast<int64_t>(gemma3 ? 6 : 2) < (gemma3 ? 5 : 1)) << l;
    EXPECT_EQ(std::get<double>(p.meta.at(a + ".rope.freq_base")), static_cast<float>(c.rope_theta));
    EXPECT_EQ(std::get<double>(p.meta.at(a + ".rope.freq_base_swa")),
              static_cast<float>(gemma3 ? c.rope_local_base_freq : c.rope_theta));
    if (gemma3) {
      EXPECT_EQ(p.meta.count(a + ".attn_logit_softcapping"), 0u);
    } else {
      EXPECT_EQ(std::get<double>(p.meta.at(a + ".attn_logit_softcapping")),
                static_cast<float>(c.attn_logit_softcapping));
      EXPECT_EQ(std::get<double>(p.meta.at(a + ".final_logit_softcapping")),
                static_cast<float>(c.final_logit_softcapping));
    }
    EXPECT_EQ(p.tensors.count("output.weight"), 0u);  // tied
    const LayerWeights& L = model.weights.layers[1];
    // Norms as 1 + w, in fp32 (transformers' 1.0 + weight.float()).
    const std::vector<float> ffn_norm = tensor_floats(p, "blk.1.ffn_norm.weight");
    const std::vector<float> post_ffw = tensor_floats(p, "blk.1.post_ffw_norm.weight");
    const std::vector<float> attn_norm = tensor_floats(p, "blk.1.attn_norm.weight");
    for (int64_t i = 0; i < c.hidden_size; ++i) {
      EXPECT_EQ(ffn_norm[static_cast<std::size_t>(i)], 1.0f + L.pre_feedforward_layernorm[i]);
      EXPECT_EQ(post_ffw[static_cast<std::size_t>(i)], 1.0f + L.post_feedforward_layernorm[i]);
      EXPECT_EQ(attn_norm[static_cast<std::size_t>(i)], 1.0f + L.input_layernorm[i]);
    }
    // The scale: the model's against llama.cpp's 1/sqrt(head_dim).
    const double fold = std::pow(c.query_pre_attn_scalar, -0.5) * std::sqrt(static_cast<double>(c.head_dim));
    ASSERT_NE(fold, 1.0);  // both presets scale by query_pre_attn_scalar != head_dim
    const std::vector<float> q = tensor_floats(p, "blk.1.attn_q.weight");
    const std::vector<float> k = tensor_floats(p, "blk.1.attn_k.weight");
    for (int64_t i = 0; i < L.k_proj.size(); ++i) EXPECT_EQ(k[static_cast<std::size_t>(i)], L.k_proj.data()[i]);
    for (int64_t i = 0; i < L.q_proj.size(); ++i) {
      const double expect = gemma3 ? L.q_proj.data()[i] : L.q_proj.data()[i] * fold;
      EXPECT_NEAR(q[static_cast<std::size_t>(i)], expect, 1e-6 * std::abs(expect)) << i;
    }
    if (gemma3) {
      const std::vector<float> q_norm = tensor_floats(p, "blk.1.attn_q_norm.weight");
      const std::vector<float> k_norm = tensor_floats(p, "blk.1.attn_k_norm.weight");
      for (int64_t i = 0; i < c.head_dim; ++i) {
        EXPECT_NEAR(q_norm[static_cast<std::size_t>(i)], (1.0 + L.q_norm[i]) * fold, 1e-6);
        EXPECT_EQ(k_norm[static_cast<std::size_t>(i)], 1.0f + L.k_norm[i]);
      }
    }
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace kvp
