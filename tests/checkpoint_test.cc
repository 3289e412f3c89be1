#include "model/checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/dtype.h"
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
      EXPECT_EQ(file->header().entries.front().dtype, dtype);
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
  EXPECT_EQ(file->header().header_bytes % 8, 0u);
  EXPECT_EQ(file->header().metadata.at("format"), "pt");
}

// ---- real architectures and sharded checkpoints ----

// A Qwen2 mini model (q/k/v biases, tied) and a Llama one with llama3 rope, biases and stop
// tokens: every field the loader reads, round-tripped.
std::vector<Model> real_layout_models() {
  ModelConfig q = mini_config(true);
  q.architecture = Architecture::kQwen2;
  q.qkv_bias = true;
  q.rope_theta = 1e6;
  q.eos_token_ids = {3};
  ModelConfig l = mini_config(false);
  l.rope_scaling = {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 16};
  l.qkv_bias = l.o_bias = l.mlp_bias = true;
  l.eos_token_ids = {1, 2};
  return {make_random_model(q, 8), make_random_model(l, 9)};
}

TEST(Checkpoint, ShardedExportEqualsSingleFileExportBitForBit) {
  for (Model& m : real_layout_models()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      TempDir single, sharded;
      ASSERT_TRUE(save_checkpoint(m, single.path(), dtype).is_ok());
      ASSERT_TRUE(save_checkpoint(m, sharded.path(), dtype, 3).is_ok());
      EXPECT_TRUE(fs::exists(sharded.path() / "model-00003-of-00003.safetensors"));
      EXPECT_FALSE(fs::exists(sharded.path() / "model.safetensors"));
      auto a = load_checkpoint(single.path());
      auto b = load_checkpoint(sharded.path());
      ASSERT_TRUE(a.is_ok()) << a.status().message();
      ASSERT_TRUE(b.is_ok()) << b.status().message();
      EXPECT_EQ(a->config, m.config);
      EXPECT_EQ(b->config, m.config);
      EXPECT_TRUE(same_weights(*a, *b));
      if (dtype == DType::kF32) {
        EXPECT_TRUE(same_weights(m, *b));
      }
    }
  }
}

TEST(Checkpoint, ExportingOneLayoutOverAnotherLeavesOneCheckpoint) {
  TempDir dir;
  Model m = real_layout_models()[1];
  ASSERT_TRUE(save_checkpoint(m, dir.path(), DType::kF32, 4).is_ok());
  ASSERT_TRUE(save_checkpoint(m, dir.path(), DType::kF32, 2).is_ok());
  EXPECT_FALSE(fs::exists(dir.path() / "model-00004-of-00004.safetensors"));
  ASSERT_TRUE(save_checkpoint(m, dir.path(), DType::kF32, 1).is_ok());
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir.path() / "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(load_checkpoint(dir.path()).is_ok());
  EXPECT_FALSE(save_checkpoint(m, dir.path(), DType::kF32, 0).is_ok());
  EXPECT_FALSE(save_checkpoint(m, dir.path(), DType::kF32, 10000).is_ok());
}

TEST(ShardIndex, ParserRejectsEachMalformedIndexWithItsReason) {
  const std::pair<const char*, const char*> cases[] = {
      {"{ nope", "not valid JSON"},
      {"[1]", "not a JSON object"},
      {R"({"metadata": {}})", "no 'weight_map' object"},
      {R"({"weight_map": {}})", "'weight_map' is empty"},
      {R"({"weight_map": {"a": 3}})", "must be a shard file name"},
      {R"({"weight_map": {"a": "../secret.safetensors"}})", "is not a file name in the checkpoint directory"},
      {R"({"weight_map": {"a": ".."}})", "is not a file name"},
      // A shard name that escapes the directory anywhere in its path, or is absolute.
      {R"({"weight_map": {"a": "sub/../../secret.safetensors"}})", "is not a file name"},
      {R"({"weight_map": {"a": "shards/model.safetensors"}})", "is not a file name"},
      {R"({"weight_map": {"a": "/etc/model.safetensors"}})", "is not a file name"},
      {R"({"weight_map": {"a": "..\\secret.safetensors"}})", "is not a file name"},
      {R"({"weight_map": {"a": "x.safetensors", "b": "../y.safetensors"}})", "is not a file name"},
      {R"({"weight_map": {"a": "."}})", "is not a file name"},
      {R"({"weight_map": {"a": ""}})", "is not a file name"},
      {R"({"weight_map": {"a": "x", "a": "y"}})", "names a tensor twice"},
      {R"({"metadata": {"total_size": -1}, "weight_map": {"a": "x"}})", "total_size"},
      {R"({"metadata": 7, "weight_map": {"a": "x"}})", "'metadata' must be an object"},
  };
  for (const auto& [text, reason] : cases) {
    auto r = parse_shard_index(text);
    ASSERT_FALSE(r.is_ok()) << text;
    EXPECT_NE(r.status().message().find(reason), std::string::npos) << text << " -> " << r.status().message();
  }
  auto ok = parse_shard_index(R"({"metadata": {"total_size": 12}, "weight_map": {"a": "s1", "b": "s2"}})");
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok->weight_map.at("b"), "s2");
  EXPECT_EQ(ok->total_size, 12u);
}

// The conversion to fp32 (and the writer's from it) goes a chunk at a time (4M elements when
// reading, 1M when writing): a tensor of a few chunks plus one element comes back whole, every
// element in its place, in every dtype, and so does the small tensor after it.
TEST(Safetensors, ATensorLargerThanAChunkConvertsEveryElement) {
  constexpr std::size_t kElements = (std::size_t{2} << 22) + 1;
  std::vector<float> big(kElements), small = {1.5f, -2.25f, 3.0f};
  for (std::size_t i = 0; i < kElements; ++i) big[i] = static_cast<float>(i % 65521) - 32760.5f;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    TempDir dir;
    const auto path = dir.path() / "big.safetensors";
    ASSERT_TRUE(write_safetensors(path, {{"big", {static_cast<int64_t>(kElements)}, big}, {"small", {3}, small}}, dtype)
                    .is_ok());
    auto f = read_safetensors(path);
    ASSERT_TRUE(f.is_ok()) << f.status().message();
    for (const SafetensorsEntry& e : f->header().entries) {
      const std::vector<float>& want = e.name == "big" ? big : small;
      std::vector<float> got(e.num_elements(), std::nanf(""));
      f->read_f32(e, got);
      ASSERT_EQ(got.size(), want.size());
      std::size_t wrong = 0, first_wrong = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const float w = dtype == DType::kF32   ? want[i]
                        : dtype == DType::kF16 ? f16_to_float(float_to_f16(want[i]))
                                               : bf16_to_float(float_to_bf16(want[i]));
        if (float_bits(got[i]) != float_bits(w) && wrong++ == 0) first_wrong = i;
      }
      EXPECT_EQ(wrong, 0u) << e.name << ": first wrong element " << first_wrong;
    }
  }
}

class MalformedShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = real_layout_models()[0];
    ASSERT_TRUE(save_checkpoint(model_, dir_.path(), DType::kF32, 2).is_ok());
    std::ifstream in(dir_.path() / "model.safetensors.index.json");
    index_ = nlohmann::json::parse(in);
  }
  std::string load_error() {
    auto m = load_checkpoint(dir_.path());
    return m.is_ok() ? std::string("<accepted>") : m.status().message();
  }
  void write_index() { std::ofstream(dir_.path() / "model.safetensors.index.json", std::ios::trunc) << index_.dump(); }
  fs::path shard(int i) const { return dir_.path() / ("model-0000" + std::to_string(i) + "-of-00002.safetensors"); }
  // Rewrites shard i with the given tensors (zeros), in the given dtype name.
  void write_shard(int i, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
    std::vector<std::vector<float>> storage;
    for (const auto& [name, shape] : tensors) {
      std::size_t n = 1;
      for (int64_t d : shape) n *= static_cast<std::size_t>(d);
      storage.emplace_back(n, 0.0f);
    }
    std::vector<SafetensorsTensorToWrite> out;
    for (std::size_t k = 0; k < tensors.size(); ++k) out.push_back({tensors[k].first, tensors[k].second, storage[k]});
    ASSERT_TRUE(write_safetensors(shard(i), out, DType::kF32).is_ok());
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> shard_tensors(int i) {
    auto f = read_safetensors(shard(i));
    std::vector<std::pair<std::string, std::vector<int64_t>>> out;
    for (const auto& e : f->header().entries) out.push_back({e.name, e.shape});
    return out;
  }
  TempDir dir_;
  Model model_;
  nlohmann::json index_;
};

TEST_F(MalformedShardedCheckpoint, ValidShardedCheckpointLoads) { EXPECT_EQ(load_error(), "<accepted>"); }

TEST_F(MalformedShardedCheckpoint, MissingShardIsNamed) {
  fs::remove(shard(2));
  const std::string e = load_error();
  EXPECT_NE(e.find("model-00002-of-00002.safetensors: missing shard"), std::string::npos) << e;
}

TEST_F(MalformedShardedCheckpoint, TensorListedButAbsentFromItsShard) {
  auto t = shard_tensors(2);
  const std::string dropped = t.back().first;
  t.pop_back();
  write_shard(2, t);
  const std::string e = load_error();
  EXPECT_NE(e.find("model-00002-of-00002.safetensors: tensor '" + dropped +
                   "': listed in model.safetensors.index.json for this shard but absent from it"),
            std::string::npos)
      << e;
}

TEST_F(MalformedShardedCheckpoint, TensorInTwoShards) {
  auto t2 = shard_tensors(2);
  t2.push_back(shard_tensors(1).front());
  write_shard(2, t2);
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor 'model.embed_tokens.weight' is in two shards"), std::string::npos) << e;
}

TEST_F(MalformedShardedCheckpoint, IndexNamingTheWrongShard) {
  index_["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  write_index();
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor 'model.norm.weight': model.safetensors.index.json puts it in model-00001-of-00002"),
            std::string::npos)
      << e;
}

TEST_F(MalformedShardedCheckpoint, TensorNotInTheIndex) {
  index_["weight_map"].erase("model.norm.weight");
  write_index();
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor 'model.norm.weight': not listed in model.safetensors.index.json"), std::string::npos) << e;
}

TEST_F(MalformedShardedCheckpoint, IndexThatIsNotJson) {
  std::ofstream(dir_.path() / "model.safetensors.index.json", std::ios::trunc) << "{\"weight_map\": ";
  const std::string e = load_error();
  EXPECT_NE(e.find("model.safetensors.index.json: not valid JSON"), std::string::npos) << e;
}

TEST_F(MalformedShardedCheckpoint, ShapeNotMatchingTheConfigNamesShardAndTensor) {
  auto t = shard_tensors(2);
  t.back().second.back() += 1;
  write_shard(2, t);
  const std::string e = load_error();
  EXPECT_NE(e.find("model-00002-of-00002.safetensors: tensor '" + t.back().first + "': shape"), std::string::npos) << e;
  EXPECT_NE(e.find("does not match config.json"), std::string::npos) << e;
}

TEST_F(MalformedShardedCheckpoint, UnsupportedDtypesAreNamed) {
  // A shard whose one tensor is F8_E4M3 or I8 (quantized weights), written by hand.
  for (const char* dtype : {"F8_E4M3", "I8"}) {
    const std::string header =
        std::string(R"({"model.norm.weight":{"dtype":")") + dtype + R"(","shape":[8],"data_offsets":[0,8]}})";
    write_bytes(shard(2), raw_file(header, 8));
    const std::string e = load_error();
    EXPECT_NE(e.find("model-00002-of-00002.safetensors: tensor 'model.norm.weight': dtype '" + std::string(dtype) +
                     "' is not supported"),
              std::string::npos)
        << e;
  }
}

TEST_F(MalformedShardedCheckpoint, TruncatedShardIsNamed) {
  auto bytes = read_bytes(shard(1));
  ASSERT_GT(bytes.size(), 5u);
  bytes.erase(bytes.end() - 5, bytes.end());
  write_bytes(shard(1), bytes);
  const std::string e = load_error();
  EXPECT_NE(e.find("model-00001-of-00002.safetensors: data is truncated"), std::string::npos) << e;
}

TEST_F(MalformedShardedCheckpoint, ConfigKeyThatChangesTheMathNamesFileAndKey) {
  std::ifstream in(dir_.path() / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["attn_logit_softcapping"] = 50;  // Gemma 2's, not implemented yet
  std::ofstream(dir_.path() / "config.json", std::ios::trunc) << j.dump();
  const std::string e = load_error();
  EXPECT_NE(e.find("config.json: key 'attn_logit_softcapping' = 50 is not implemented"), std::string::npos) << e;
}

}  // namespace
}  // namespace kvp

namespace kvp {
namespace {

// fp8 KV scales in a checkpoint (vLLM's names): read per layer and per head, accepted beside
// the weights by load_checkpoint, and every malformed set refused naming the tensor.
class CheckpointKvScalesTest : public ::testing::Test {
 protected:
  // Two layers of two KV heads: per-head and per-layer values are told apart.
  void SetUp() override {
    ModelConfig c = mini_config(false);
    c.num_layers = 2;
    c.num_kv_heads = 2;
    model_ = make_random_model(c, 9);
  }
  // The model's weights plus the given extra tensors, as one model.safetensors.
  void write(const std::vector<std::pair<std::string, std::vector<float>>>& extra,
             const std::vector<std::vector<int64_t>>& shapes) {
    ASSERT_TRUE(save_checkpoint(model_, dir_.path(), DType::kF32).is_ok());
    std::vector<SafetensorsTensorToWrite> out;
    for (const auto& t : named_tensors(model_.config, model_.weights)) {
      std::size_t n = 1;
      for (int64_t d : t.shape) n *= static_cast<std::size_t>(d);
      out.push_back({t.name, t.shape, std::span<const float>(t.data, n)});
    }
    for (std::size_t i = 0; i < extra.size(); ++i) out.push_back({extra[i].first, shapes[i], extra[i].second});
    ASSERT_TRUE(write_safetensors(dir_.path() / "model.safetensors", out, DType::kF32).is_ok());
  }
  std::string error() {
    auto s = load_kv_scales(dir_.path());
    return s.is_ok() ? std::string("<accepted>") : s.status().message();
  }
  TempDir dir_;
  Model model_;
};

TEST_F(CheckpointKvScalesTest, ScalarAndPerHeadScalesAreReadAndTheWeightsStillLoad) {
  const int64_t layers = model_.config.num_layers, heads = model_.config.num_kv_heads;
  std::vector<std::pair<std::string, std::vector<float>>> scalar;
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t l = 0; l < layers; ++l) {
    scalar.push_back({kv_scale_tensor_name(l, true), {0.5f + static_cast<float>(l)}});
    scalar.push_back({kv_scale_tensor_name(l, false), {0.25f}});
    shapes.push_back({});
    shapes.push_back({1});
  }
  write(scalar, shapes);
  auto m = load_checkpoint(dir_.path());
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(m->weights.embed_tokens, model_.weights.embed_tokens);
  auto s = load_kv_scales(dir_.path());
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  ASSERT_TRUE(s->has_value());
  EXPECT_FALSE((*s)->per_head);
  ASSERT_EQ((*s)->k.size(), static_cast<std::size_t>(layers * heads));
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t h = 0; h < heads; ++h) {
      EXPECT_EQ((*s)->k[static_cast<std::size_t>(l * heads + h)], 0.5f + static_cast<float>(l));
      EXPECT_EQ((*s)->v[static_cast<std::size_t>(l * heads + h)], 0.25f);
    }

  std::vector<std::pair<std::string, std::vector<float>>> per_head;
  shapes.clear();
  for (int64_t l = 0; l < layers; ++l)
    for (bool k : {true, false}) {
      std::vector<float> v;
      for (int64_t h = 0; h < heads; ++h) v.push_back(static_cast<float>(1 + l * heads + h) * (k ? 1.0f : 2.0f));
      per_head.push_back({kv_scale_tensor_name(l, k), v});
      shapes.push_back({heads});
    }
  write(per_head, shapes);
  s = load_kv_scales(dir_.path());
  ASSERT_TRUE(s.is_ok() && s->has_value()) << error();
  EXPECT_TRUE((*s)->per_head);
  ASSERT_EQ((*s)->v.size(), 4u);
  EXPECT_EQ((*s)->k[3], 4.0f);  // layer 1, head 1: 1 + 1 * 2 + 1
  EXPECT_EQ((*s)->v[1], 4.0f);  // layer 0, head 1: (1 + 0 + 1) * 2
}

TEST_F(CheckpointKvScalesTest, NoScalesIsNoneAndEachMalformedSetIsRefusedNamingTheTensor) {
  write({}, {});
  auto none = load_kv_scales(dir_.path());
  ASSERT_TRUE(none.is_ok()) << none.status().message();
  EXPECT_FALSE(none->has_value());
  // Only layer 0's K scale.
  write({{kv_scale_tensor_name(0, true), {1.0f}}}, {{}});
  EXPECT_NE(error().find("'model.layers.0.self_attn.v_scale': missing"), std::string::npos) << error();
  // A wrong shape, and a zero scale.
  std::vector<std::pair<std::string, std::vector<float>>> all;
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t l = 0; l < model_.config.num_layers; ++l)
    for (bool k : {true, false}) {
      all.push_back({kv_scale_tensor_name(l, k), {1.0f, 1.0f, 1.0f}});
      shapes.push_back({3});
    }
  write(all, shapes);
  EXPECT_NE(error().find("is neither a scalar nor [num_kv_heads]"), std::string::npos) << error();
  for (auto& [name, v] : all) v = {1.0f};
  for (auto& s : shapes) s = {};
  all[1].second = {0.0f};
  write(all, shapes);
  EXPECT_NE(error().find("'model.layers.0.self_attn.v_scale': scale 0.000000 is not finite and > 0"), std::string::npos)
      << error();
}

}  // namespace
}  // namespace kvp
