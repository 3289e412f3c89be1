#include "model/checkpoint.h"

#include <cmath>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"

namespace kvp {

namespace {

namespace fs = std::filesystem;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

Result<std::string> read_text(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return Status::error(path.string() + ": no such file");
  std::ifstream in(path);
  if (!in) return Status::error(path.string() + ": cannot open for reading");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<nlohmann::json> read_json(const fs::path& path) {
  auto text = read_text(path);
  if (!text) return text.status();
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(path.string() + ": not valid JSON");
  return j;
}

Result<ModelConfig> load_config(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  auto j = read_json(path);
  if (!j) return j.status();
  auto c = ModelConfig::from_json(*j);
  if (!c) return c.status().with_context(path.string());
  const fs::path gen_path = dir / "generation_config.json";
  std::error_code ec;
  if (fs::exists(gen_path, ec)) {
    auto g = read_json(gen_path);
    if (!g) return g.status();
    KVP_RETURN_IF_ERROR(c->apply_generation_config(*g).with_context(gen_path.string()));
  }
  return c;
}

}  // namespace

Result<ModelConfig> load_model_config(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return load_config(path);
  auto j = read_json(path);
  if (!j) return j.status();
  auto c = ModelConfig::from_json(*j);
  if (!c) return c.status().with_context(path.string());
  return c;
}

namespace {

Status write_text_atomically(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.close();
    if (!f) return Status::error("cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::error("cannot rename " + tmp.string() + " into place: " + ec.message());
  return Status::ok();
}

// Where one tensor of the checkpoint is: its file (mapped) and its header entry.
struct TensorSource {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
  fs::path path;
};

// The open files of a checkpoint and every tensor they hold, by name.
struct OpenCheckpoint {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, TensorSource> tensors;
};

Status open_single(const fs::path& path, OpenCheckpoint& out) {
  auto file = read_safetensors(path);
  if (!file) return file.status().with_context(path.string());
  out.files.push_back(std::make_unique<SafetensorsFile>(std::move(*file)));
  const SafetensorsFile* f = out.files.back().get();
  for (const auto& e : f->header().entries) out.tensors[e.name] = {f, &e, path};
  return Status::ok();
}

Status open_sharded(const fs::path& dir, OpenCheckpoint& out) {
  const fs::path index_path = dir / kShardIndexName;
  auto text = read_text(index_path);
  if (!text) return text.status();
  auto index = parse_shard_index(*text);
  if (!index) return index.status().with_context(index_path.string());
  std::map<std::string, std::vector<std::string>> listed;  // shard -> tensors the index puts there
  for (const auto& [tensor, shard] : index->weight_map) listed[shard].push_back(tensor);
  for (const auto& [shard, names] : listed) {
    const fs::path path = dir / shard;
    std::error_code ec;
    if (!fs::exists(path, ec))
      return Status::error(path.string() + ": missing shard (" + kShardIndexName + " lists " +
                           std::to_string(names.size()) + " tensors in it, the first " + quoted(names.front()) + ")");
    auto file = read_safetensors(path);
    if (!file) return file.status().with_context(path.string());
    out.files.push_back(std::make_unique<SafetensorsFile>(std::move(*file)));
    const SafetensorsFile* f = out.files.back().get();
    for (const auto& e : f->header().entries) {
      auto [it, inserted] = out.tensors.try_emplace(e.name, TensorSource{f, &e, path});
      if (!inserted)
        return Status::error("tensor " + quoted(e.name) + " is in two shards: " + it->second.path.string() + " and " +
                             path.string());
    }
  }
  for (const auto& [tensor, shard] : index->weight_map) {
    auto it = out.tensors.find(tensor);
    if (it == out.tensors.end())
      return Status::error((dir / shard).string() + ": tensor " + quoted(tensor) + ": listed in " + kShardIndexName +
                           " for this shard but absent from it");
    if (it->second.path.filename() != shard)
      return Status::error("tensor " + quoted(tensor) + ": " + kShardIndexName + " puts it in " + shard +
                           ", but it is in " + it->second.path.string());
  }
  for (const auto& [tensor, source] : out.tensors) {
    if (!index->weight_map.count(tensor))
      return Status::error(source.path.string() + ": tensor " + quoted(tensor) + ": not listed in " + kShardIndexName);
  }
  return Status::ok();
}

// A checkpoint directory's config and its open safetensors files: model.safetensors when it is
// there (or when there is no index either, so that the error names it), else the shards.
Result<ModelConfig> open_checkpoint(const fs::path& dir, OpenCheckpoint& open) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::error(dir.string() + ": not a directory");
  auto config = load_config(dir);
  if (!config) return config.status();
  const fs::path single = dir / kSingleFileName;
  if (fs::exists(single, ec) || !fs::exists(dir / kShardIndexName, ec)) {
    KVP_RETURN_IF_ERROR(open_single(single, open));
  } else {
    KVP_RETURN_IF_ERROR(open_sharded(dir, open));
  }
  return config;
}

}  // namespace

Result<ShardIndex> parse_shard_index(std::string_view text) {
  // nlohmann keeps the last of duplicate keys silently; a parser callback sees each one.
  std::set<std::string> seen;  // "top-level key\nkey" of every key one level down
  std::string top;
  bool duplicate = false;
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (event != nlohmann::json::parse_event_t::key) return true;
    if (depth == 1) top = parsed.get<std::string>();
    if (depth == 2 && !duplicate) duplicate = !seen.insert(top + "\n" + parsed.get<std::string>()).second;
    return true;
  };
  auto j = nlohmann::json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error("not valid JSON");
  if (!j.is_object()) return Status::error("not a JSON object");
  if (duplicate) return Status::error("'weight_map' names a tensor twice");
  ShardIndex index;
  if (auto m = j.find("metadata"); m != j.end() && !m->is_null()) {
    if (!m->is_object()) return Status::error("'metadata' must be an object, got " + m->dump());
    if (auto t = m->find("total_size"); t != m->end() && !t->is_null()) {
      if (!t->is_number_unsigned())
        return Status::error("'metadata.total_size' must be a non-negative integer, got " + t->dump());
      index.total_size = t->get<uint64_t>();
    }
  }
  auto w = j.find("weight_map");
  if (w == j.end() || !w->is_object()) return Status::error("no 'weight_map' object (tensor name -> shard file)");
  for (auto it = w->begin(); it != w->end(); ++it) {
    if (!it->is_string())
      return Status::error("'weight_map' entry " + quoted(it.key()) + " must be a shard file name, got " + it->dump());
    const std::string shard = it->get<std::string>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
      return Status::error("'weight_map' entry " + quoted(it.key()) + ": shard " + quoted(shard) +
                           " is not a file name in the checkpoint directory");
    index.weight_map[it.key()] = shard;
  }
  if (index.weight_map.empty()) return Status::error("'weight_map' is empty");
  return index;
}

Result<Model> load_checkpoint(const fs::path& dir) {
  OpenCheckpoint open;
  auto config = open_checkpoint(dir, open);
  if (!config) return config.status();
  const fs::path single = dir / kSingleFileName;

  Model m{*config, allocate_weights(*config)};
  std::vector<NamedTensor> expected = named_tensors(m.config, m.weights);
  std::set<std::string> expected_names;
  for (const auto& t : expected) expected_names.insert(t.name);
  const std::string kind = std::string(architecture_class_name(m.config.architecture)) +
                           (m.config.tie_word_embeddings ? " model with tied embeddings" : " model") +
                           " with this config";
  for (int64_t l = 0; l < m.config.num_layers; ++l)
    for (bool k : {true, false}) expected_names.insert(kv_scale_tensor_name(l, k));  // read by load_kv_scales
  for (const auto& [name, source] : open.tensors) {
    if (!expected_names.count(name))
      return Status::error(source.path.string() + ": tensor " + quoted(name) + ": unexpected (not part of a " + kind +
                           ")");
  }
  const std::string where = open.files.size() == 1 ? single.string() : (dir / kShardIndexName).string();
  for (const auto& t : expected) {
    auto it = open.tensors.find(t.name);
    if (it == open.tensors.end()) return Status::error(where + ": tensor " + quoted(t.name) + ": missing");
    if (it->second.entry->shape != t.shape)
      return Status::error(it->second.path.string() + ": tensor " + quoted(t.name) + ": shape " +
                           shape_str(it->second.entry->shape) + " does not match config.json, which implies " +
                           shape_str(t.shape));
  }
  for (const auto& t : expected) {
    const TensorSource& s = open.tensors.at(t.name);
    s.file->read_f32(*s.entry, std::span<float>(t.data, s.entry->num_elements()));
  }
  return m;
}

std::string kv_scale_tensor_name(int64_t layer, bool k) {
  return "model.layers." + std::to_string(layer) + (k ? ".self_attn.k_scale" : ".self_attn.v_scale");
}

Result<std::optional<CheckpointKvScales>> load_kv_scales(const fs::path& dir) {
  OpenCheckpoint open;
  auto config = open_checkpoint(dir, open);
  if (!config) return config.status();
  const int64_t layers = config->num_layers;
  const int64_t heads = config->num_kv_heads;
  int64_t found = 0;
  for (int64_t l = 0; l < layers; ++l)
    for (bool k : {true, false}) found += open.tensors.count(kv_scale_tensor_name(l, k)) > 0 ? 1 : 0;
  if (found == 0) return std::optional<CheckpointKvScales>();
  CheckpointKvScales out;
  out.k.resize(static_cast<std::size_t>(layers * heads));
  out.v.resize(out.k.size());
  std::optional<bool> per_head;
  for (int64_t l = 0; l < layers; ++l) {
    for (bool k : {true, false}) {
      const std::string name = kv_scale_tensor_name(l, k);
      auto it = open.tensors.find(name);
      if (it == open.tensors.end())
        return Status::error(dir.string() + ": tensor " + quoted(name) + ": missing (the checkpoint has " +
                             std::to_string(found) + " of the " + std::to_string(2 * layers) +
                             " KV scales: every layer needs k_scale and v_scale)");
      const SafetensorsEntry& e = *it->second.entry;
      const auto n = static_cast<int64_t>(e.num_elements());
      const bool scalar = n == 1 && e.shape.size() <= 1;
      const bool head = e.shape == std::vector<int64_t>{heads};
      if (!scalar && !head)
        return Status::error(it->second.path.string() + ": tensor " + quoted(name) + ": shape " + shape_str(e.shape) +
                             " is neither a scalar nor [num_kv_heads] = [" + std::to_string(heads) + "]");
      if (per_head && *per_head != (head && heads > 1))
        return Status::error(it->second.path.string() + ": tensor " + quoted(name) +
                             ": mixes per-tensor and per-head KV scales");
      per_head = head && heads > 1;
      std::vector<float> v(static_cast<std::size_t>(n));
      it->second.file->read_f32(e, std::span<float>(v));
      for (int64_t h = 0; h < heads; ++h) {
        const float x = v[static_cast<std::size_t>(scalar ? 0 : h)];
        if (!(x > 0.0f) || !std::isfinite(x))
          return Status::error(it->second.path.string() + ": tensor " + quoted(name) + ": scale " + std::to_string(x) +
                               " is not finite and > 0");
        (k ? out.k : out.v)[static_cast<std::size_t>(l * heads + h)] = x;
      }
    }
  }
  out.per_head = per_head.value_or(false);
  return std::optional<CheckpointKvScales>(std::move(out));
}

Status save_checkpoint(const Model& model, const fs::path& dir, DType dtype, int shards) {
  KVP_RETURN_IF_ERROR(model.config.validate().with_context("config"));
  if (dtype == DType::kF64 || is_fp8(dtype)) return Status::error("checkpoint dtype must be f32, f16 or bf16");
  // named_tensors hands out mutable views; they are only read here (a copy of a 1B model's
  // weights would double the export's memory).
  Model& weights_view = const_cast<Model&>(model);
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const auto& t : named_tensors(weights_view.config, weights_view.weights)) {
    std::size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<std::size_t>(d);
    tensors.push_back({t.name, t.shape, std::span<const float>(t.data, n)});
  }
  if (shards < 1 || static_cast<std::size_t>(shards) > tensors.size())
    return Status::error("shards must be in [1, " + std::to_string(tensors.size()) +
                         "] (the model's tensor count), got " + std::to_string(shards));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::error(dir.string() + ": cannot create directory: " + ec.message());

  // The other layout's files from an earlier export would make the directory ambiguous.
  const auto is_shard_file = [](const std::string& name) {
    return name.starts_with("model-") && name.ends_with(".safetensors") && name.find("-of-") != std::string::npos;
  };
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_shard_file(name) || name == kShardIndexName || name == kSingleFileName) stale.push_back(e.path());
  }

  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::set<fs::path> written;
  if (shards == 1) {
    const fs::path path = dir / kSingleFileName;
    KVP_RETURN_IF_ERROR(write_safetensors(path, tensors, dtype, metadata).with_context(path.string()));
    written.insert(path);
  } else {
    uint64_t total = 0;
    for (const auto& t : tensors) total += t.data.size() * dtype_size(dtype);
    // Contiguous groups in named_tensors order, each closed once it reaches its share of
    // the bytes, keeping at least one tensor for every shard still to come.
    std::vector<std::vector<SafetensorsTensorToWrite>> groups(static_cast<std::size_t>(shards));
    uint64_t done = 0;
    std::size_t g = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const std::size_t left_tensors = tensors.size() - i;
      const std::size_t left_groups = groups.size() - g;
      if (!groups[g].empty() &&
          (left_tensors < left_groups + 1 ||
           done >= total / static_cast<uint64_t>(shards) * static_cast<uint64_t>(g + 1)) &&
          g + 1 < groups.size())
        ++g;
      groups[g].push_back(tensors[i]);
      done += tensors[i].data.size() * dtype_size(dtype);
    }
    nlohmann::json weight_map = nlohmann::json::object();
    for (std::size_t k = 0; k < groups.size(); ++k) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05d.safetensors", k + 1, shards);
      const fs::path path = dir / name;
      KVP_RETURN_IF_ERROR(write_safetensors(path, groups[k], dtype, metadata).with_context(path.string()));
      written.insert(path);
      for (const auto& t : groups[k]) weight_map[t.name] = name;
    }
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    KVP_RETURN_IF_ERROR(write_text_atomically(dir / kShardIndexName, index.dump(2) + "\n"));
    written.insert(dir / kShardIndexName);
  }
  for (const fs::path& p : stale) {
    if (!written.count(p)) fs::remove(p, ec);
  }

  nlohmann::json cj = model.config.to_json();
  cj["torch_dtype"] = dtype == DType::kF32 ? "float32" : dtype == DType::kF16 ? "float16" : "bfloat16";
  KVP_RETURN_IF_ERROR(write_text_atomically(dir / "config.json", cj.dump(2) + "\n"));
  const nlohmann::json gen = model.config.generation_config_json();
  if (gen.is_null()) {
    fs::remove(dir / "generation_config.json", ec);
    return Status::ok();
  }
  return write_text_atomically(dir / "generation_config.json", gen.dump(2) + "\n");
}

}  // namespace kvp
