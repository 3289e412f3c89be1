// Fuzzes the parser of model.safetensors.index.json (the sharded checkpoint's index). Any
// input must give either an index that keeps the parser's promises or an error Status:
// never a crash, a hang or a sanitizer report.
#include <cstdint>
#include <string_view>

#include "model/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto index = kvp::parse_shard_index(text);
  if (!index.is_ok()) {
    if (index.status().message().empty()) __builtin_trap();  // every error says why
    return 0;
  }
  if (index->weight_map.empty()) __builtin_trap();
  for (const auto& [tensor, shard] : index->weight_map) {
    // A shard is a plain file name inside the checkpoint directory, never a path out of it.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
      __builtin_trap();
  }
  return 0;
}
