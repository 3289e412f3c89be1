// Fuzzes the two checkpoint parsers: the safetensors header and config.json.
// The first input byte picks the parser; the rest is the file. Any input must give either
// a valid result or an error Status: never a crash, a hang or a sanitizer report.
#include <cstdint>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto h = kvp::parse_safetensors_header(rest, rest.size());
    if (h.is_ok()) {
      // Accepted headers satisfy the format's rules.
      uint64_t end = 0;
      for (const auto& e : h->entries) {
        if (e.begin != end) __builtin_trap();
        end = e.end;
      }
      if (h->data_start + end != rest.size()) __builtin_trap();
    }
  } else {
    auto j = nlohmann::json::parse(rest.begin(), rest.end(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) {
      auto c = kvp::ModelConfig::from_json(j);
      if (c.is_ok() && !c->validate().is_ok()) __builtin_trap();
      if (c.is_ok()) (void)c->kv_bytes_per_token(kvp::DType::kBF16);
      // The same text as a generation_config.json applied to the config it made.
      if (c.is_ok() && c->apply_generation_config(j).is_ok() && !c->validate().is_ok()) __builtin_trap();
    }
  }
  return 0;
}
