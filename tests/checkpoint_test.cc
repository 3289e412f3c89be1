#include "model/checkpoint.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "model/safetensors.h"
#include "reference/reference_model.h"

namespace kvp {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ =
        fs::temp_directory_path() / ("kvproof-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

ModelConfig mini_config(bool tied) {
  ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  return c;
}

std::vector<uint8_t> raw_file(const std::string& header, std::size_t data_bytes) {
  std::vector<uint8_t> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string header_error(const std::vector<uint8_t>& bytes) {
  auto h = parse_safetensors_header(bytes, bytes.size());
  return h.is_ok() ? std::string("<accepted>") : h.status().message();
}

bool same_weights(Model& a, Model& b) {
  auto ta = named_tensors(a.config, a.weights);
  auto tb = named_tensors(b.config, b.weights);
  if (ta.size() != tb.size()) return false;
  for (std::size_t i = 0; i < ta.size(); ++i) {
    std::size_t n = 1;
    for (int64_t d : ta[i].shape) n *= static_cast<std::size_t>(d);
    if (ta[i].name != tb[i].name || ta[i].shape != tb[i].shape) return false;
    if (std::memcmp(ta[i].data, tb[i].data, n * sizeof(float)) != 0) return false;
  }
  return true;
}

TEST(Checkpoint, F32RoundTripIsBitwiseForTiedAndUntied) {
  for (bool tied : {false, true}) {
    TempDir dir;
    Model m = make_random_model(mini_config(tied), 3);
    ASSERT_TRUE(save_checkpoint(m, dir.path(), DType::kF32).is_ok());
    auto loaded = load_checkpoint(dir.path());
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
    EXPECT_EQ(loaded->config, m.config);
    EXPECT_TRUE(same_weights(m, *loaded)) << "tied=" << tied;
    EXPECT_EQ(loaded->weights.lm_head.size(), tied ? 0 : m.weights.lm_head.size());
  }
}

TEST(Checkpoint, TinyPresetExportedAndLoadedGivesBitwiseSameLogits) {
  TempDir dir;
  const Model m = *make_preset("tiny");
  ASSERT_TRUE(save_checkpoint(m, dir.path(), DType::kF32).is_ok());
  const Model loaded = *load_checkpoint(dir.path());
  const ReferenceModel<float> a(m), b(loaded);
  auto ca = a.make_cache(8), cb = b.make_cache(8);
  const std::vector<int32_t> t = {5, 100, 7, 311};
  auto la = a.forward(t, ca), lb = b.forward(t, cb);
  EXPECT_TRUE((la->array() == lb->array()).all());
}

TEST(Checkpoint, HalfPrecisionRoundTripsHoldTheRoundedWeights) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (bool tied : {false, true}) {
      TempDir dir;
      Model m = make_random_model(mini_config(tied), 4);
      ASSERT_TRUE(save_checkpoint(m, dir.path(), dtype).is_ok());
      auto loaded = load_checkpoint(dir.path());
      ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
      // Expected: each weight rounded to the dtype (the conversion itself is checked
      // bit-exactly in dtype_test.cc).
      Model expected = m;
      for (const auto& t : named_tensors(expected.config, expected.weights)) {
        std::size_t n = 1;
        for (int64_t d : t.shape) n *= static_cast<std::size_t>(d);
        for (std::size_t i = 0; i < n; ++i)
          t.data[i] =
              dtype == DType::kF16 ? f16_to_float(float_to_f16(t.data[i])) : bf16_to_float(float_to_bf16(t.data[i]));
      }
      EXPECT_TRUE(same_weights(expected, *loaded));
      EXPECT_FALSE(same_weights(m, *loaded));  // rounding really happened
      auto file = read_safetensors(dir.path() / "model.safetensors");
      ASSERT_TRUE(file.is_ok());
      EXPECT_EQ(file->header.entries.front().dtype, dtype);
    }
  }
}

// Twelve-plus malformed safetensors files, each with its own reason.
TEST(Checkpoint, MalformedSafetensorsHeadersEachGiveTheirOwnError) {
  const std::string one = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(header_error(raw_file(one, 8)), "<accepted>");

  std::vector<uint8_t> short_file = {1, 2, 3, 4, 5};
  EXPECT_NE(header_error(short_file).find("too short for the 8-byte header length"), std::string::npos);

  auto past_end = raw_file(one, 8);
  past_end[0] = 0xff;
  past_end[1] = 0x01;
  EXPECT_NE(header_error(past_end).find("runs past the end of the file"), std::string::npos);

  auto huge = raw_file(one, 8);
  huge[5] = 0x01;  // 2^40
  EXPECT_NE(header_error(huge).find("exceeds the limit"), std::string::npos);

  EXPECT_NE(header_error(raw_file("{\"a\": nope}", 0)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(header_error(raw_file("[1,2]", 0)).find("not a JSON object"), std::string::npos);

  EXPECT_NE(header_error(raw_file(one, 4)).find("data is truncated"), std::string::npos);
  EXPECT_NE(header_error(raw_file(one, 12)).find("4 trailing bytes"), std::string::npos);

  const std::string overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_NE(header_error(raw_file(overlap, 12)).find("overlaps tensor 'a'"), std::string::npos);

  const std::string gap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})";
  EXPECT_NE(header_error(raw_file(gap, 20)).find("gap of 4 bytes before tensor 'b'"), std::string::npos);

  const std::string late_start = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_NE(header_error(raw_file(late_start, 12)).find("must start at offset 0"), std::string::npos);

  const std::string wrong_size = R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NE(header_error(raw_file(wrong_size, 8)).find("needs 4"), std::string::npos);

  const std::string unknown = R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NE(header_error(raw_file(unknown, 8)).find("unknown dtype 'F33'"), std::string::npos);

  const std::string unsupported = R"({"a":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})";
  EXPECT_NE(header_error(raw_file(unsupported, 8)).find("'I8' is not supported"), std::string::npos);

  const std::string dup = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_NE(header_error(raw_file(dup, 8)).find("'a' appears twice"), std::string::npos);

  const std::string reversed = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})";
  EXPECT_NE(header_error(raw_file(reversed, 8)).find("is before begin"), std::string::npos);

  const std::string overflow = R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})";
  EXPECT_NE(header_error(raw_file(overflow, 8)).find("overflows"), std::string::npos);

  const std::string extra_field = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})";
  EXPECT_NE(header_error(raw_file(extra_field, 8)).find("unexpected field 'x'"), std::string::npos);

  const std::string bad_meta = R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NE(header_error(raw_file(bad_meta, 8)).find("__metadata__"), std::string::npos);

  const std::string negative = R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})";
  EXPECT_NE(header_error(raw_file(negative, 8)).find("non-negative"), std::string::npos);
}

class MalformedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = make_random_model(mini_config(false), 5);
    ASSERT_TRUE(save_checkpoint(model_, dir_.path(), DType::kF32).is_ok());
  }
  std::string load_error() {
    auto m = load_checkpoint(dir_.path());
    return m.is_ok() ? std::string("<accepted>") : m.status().message();
  }
  // Rewrites model.safetensors from tensors given as (name, shape) with zero data.
  void write_tensors(const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
    std::vector<std::vector<float>> storage;
    std::vector<SafetensorsTensorToWrite> out;
    for (const auto& [name, shape] : tensors) {
      std::size_t n = 1;
      for (int64_t d : shape) n *= static_cast<std::size_t>(d);
      storage.emplace_back(n, 0.0f);
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) out.push_back({tensors[i].first, tensors[i].second, storage[i]});
    ASSERT_TRUE(write_safetensors(dir_.path() / "model.safetensors", out, DType::kF32).is_ok());
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> good_tensors() {
    std::vector<std::pair<std::string, std::vector<int64_t>>> out;
    for (const auto& t : named_tensors(model_.config, model_.weights)) out.push_back({t.name, t.shape});
    return out;
  }
  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(dir_.path() / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(dir_.path() / "config.json", std::ios::trunc) << j.dump();
  }
  TempDir dir_;
  Model model_;
};

TEST_F(MalformedCheckpoint, ValidCheckpointLoads) { EXPECT_EQ(load_error(), "<accepted>"); }

TEST_F(MalformedCheckpoint, MissingTensorIsNamed) {
  auto t = good_tensors();
  t.erase(t.begin() + 3);
  write_tensors(t);
  const std::string e = load_error();
  EXPECT_NE(e.find("model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight': missing"), std::string::npos)
      << e;
}

TEST_F(MalformedCheckpoint, UnexpectedTensorIsNamed) {
  auto t = good_tensors();
  t.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {2}});
  write_tensors(t);
  EXPECT_NE(load_error().find("tensor 'model.layers.0.self_attn.rotary_emb.inv_freq': unexpected"), std::string::npos);
}

TEST_F(MalformedCheckpoint, ShapeNotMatchingConfigIsNamed) {
  auto t = good_tensors();
  t[0].second = {16, 9};
  write_tensors(t);
  const std::string e = load_error();
  EXPECT_NE(
      e.find("tensor 'model.embed_tokens.weight': shape [16, 9] does not match config.json, which implies [16, 8]"),
      std::string::npos)
      << e;
}

TEST_F(MalformedCheckpoint, BadConfigValueNamesFileAndKey) {
  edit_config([](nlohmann::json& j) { j["num_key_value_heads"] = 3; });
  const std::string e = load_error();
  EXPECT_NE(e.find("config.json: num_attention_heads (2) must be a multiple of num_key_value_heads (3)"),
            std::string::npos)
      << e;
}

TEST_F(MalformedCheckpoint, ConfigThatIsNotJson) {
  std::ofstream(dir_.path() / "config.json", std::ios::trunc) << "{ not json";
  EXPECT_NE(load_error().find("config.json: not valid JSON"), std::string::npos);
}

TEST_F(MalformedCheckpoint, MissingFiles) {
  fs::remove(dir_.path() / "model.safetensors");
  EXPECT_NE(load_error().find("model.safetensors: no such file"), std::string::npos);
  fs::remove(dir_.path() / "config.json");
  EXPECT_NE(load_error().find("config.json: no such file"), std::string::npos);
  EXPECT_NE(load_checkpoint(dir_.path() / "nope").status().message().find("not a directory"), std::string::npos);
}

TEST_F(MalformedCheckpoint, TruncatedDataNamesTheFile) {
  auto bytes = read_bytes(dir_.path() / "model.safetensors");
  ASSERT_GT(bytes.size(), 3u);
  bytes.erase(bytes.end() - 3, bytes.end());
  write_bytes(dir_.path() / "model.safetensors", bytes);
  const std::string e = load_error();
  EXPECT_NE(e.find("model.safetensors: data is truncated"), std::string::npos) << e;
}

TEST_F(MalformedCheckpoint, TrailingBytesNameTheFile) {
  auto bytes = read_bytes(dir_.path() / "model.safetensors");
  bytes.push_back(0);
  write_bytes(dir_.path() / "model.safetensors", bytes);
  EXPECT_NE(load_error().find("1 trailing bytes after the last tensor"), std::string::npos);
}

TEST_F(MalformedCheckpoint, EveryTruncationIsRejectedWithoutCrashing) {
  const auto bytes = read_bytes(dir_.path() / "model.safetensors");
  for (std::size_t len = 0; len < bytes.size(); len += 37) {
    write_bytes(dir_.path() / "model.safetensors",
                std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len)));
    EXPECT_NE(load_error(), "<accepted>") << len;
  }
}

TEST(Checkpoint, SaveIsAtomicAndNeverLeavesTemporaryFiles) {
  TempDir dir;
  Model m = make_random_model(mini_config(false), 3);
  ASSERT_TRUE(save_checkpoint(m, dir.path(), DType::kBF16).is_ok());
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().extension() == ".tmp", false) << e.path();
  }
  EXPECT_EQ(files, 2);
  // The header is padded to a multiple of 8 bytes, as safetensors writers do.
  auto file = read_safetensors(dir.path() / "model.safetensors");
  ASSERT_TRUE(file.is_ok());
  EXPECT_EQ(file->header.header_bytes % 8, 0u);
  EXPECT_EQ(file->header.metadata.at("format"), "pt");
}

}  // namespace
}  // namespace kvp
