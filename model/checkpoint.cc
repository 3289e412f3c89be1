#include "model/checkpoint.h"

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"

namespace kvp {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Result<ModelConfig> load_config(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return Status::error(path.string() + ": no such file");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(path.string() + ": not valid JSON");
  auto c = ModelConfig::from_json(j);
  if (!c) return c.status().with_context(path.string());
  return c;
}

Status write_text_atomically(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.close();
    if (!f) return Status::error("cannot write " + tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::error("cannot rename " + tmp.string() + " into place: " + ec.message());
  return Status::ok();
}

}  // namespace

Result<Model> load_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return Status::error(dir.string() + ": not a directory");
  auto config = load_config(dir / "config.json");
  if (!config) return config.status();

  const std::filesystem::path st_path = dir / "model.safetensors";
  auto file = read_safetensors(st_path);
  if (!file) return file.status().with_context(st_path.string());

  Model m{*config, allocate_weights(*config)};
  std::vector<NamedTensor> expected = named_tensors(m.config, m.weights);
  std::set<std::string> expected_names;
  for (const auto& t : expected) expected_names.insert(t.name);
  for (const auto& e : file->header.entries) {
    if (!expected_names.count(e.name))
      return Status::error(st_path.string() + ": tensor '" + e.name + "': unexpected (not part of a " +
                           (m.config.tie_word_embeddings ? "tied-embedding " : "") + "Llama model with this config)");
  }
  for (const auto& t : expected) {
    const SafetensorsEntry* e = file->header.find(t.name);
    if (!e) return Status::error(st_path.string() + ": tensor '" + t.name + "': missing");
    if (e->shape != t.shape)
      return Status::error(st_path.string() + ": tensor '" + t.name + "': shape " + shape_str(e->shape) +
                           " does not match config.json, which implies " + shape_str(t.shape));
  }
  for (const auto& t : expected) {
    const SafetensorsEntry* e = file->header.find(t.name);
    file->read_f32(*e, std::span<float>(t.data, e->num_elements()));
  }
  return m;
}

Status save_checkpoint(const Model& model, const std::filesystem::path& dir, DType dtype) {
  KVP_RETURN_IF_ERROR(model.config.validate().with_context("config"));
  if (dtype == DType::kF64) return Status::error("checkpoint dtype must be f32, f16 or bf16");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error(dir.string() + ": cannot create directory: " + ec.message());

  Model copy = model;  // named_tensors hands out mutable views
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const auto& t : named_tensors(copy.config, copy.weights)) {
    std::size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<std::size_t>(d);
    tensors.push_back({t.name, t.shape, std::span<const float>(t.data, n)});
  }
  KVP_RETURN_IF_ERROR(write_safetensors(dir / "model.safetensors", tensors, dtype, {{"format", "pt"}})
                          .with_context((dir / "model.safetensors").string()));
  nlohmann::json cj = model.config.to_json();
  cj["torch_dtype"] = dtype == DType::kF32 ? "float32" : dtype == DType::kF16 ? "float16" : "bfloat16";
  return write_text_atomically(dir / "config.json", cj.dump(2) + "\n");
}

}  // namespace kvp
