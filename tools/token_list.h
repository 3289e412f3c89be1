// Parses "1,2,3" into token ids: decimal integers in [0, 2^31), comma-separated,
// optional spaces; errors name the offending item and its position.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvp::tools {

inline Result<std::vector<int32_t>> parse_token_list(std::string_view text) {
  std::vector<int32_t> out;
  std::size_t index = 0;
  std::size_t pos = 0;
  while (true) {
    std::size_t comma = text.find(',', pos);
    std::string_view item = text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) return Status::error("item " + std::to_string(index) + " is empty");
    int64_t v = 0;
    for (char ch : item) {
      if (ch < '0' || ch > '9')
        return Status::error("item " + std::to_string(index) + " ('" + std::string(item) +
                             "') is not a non-negative integer");
      v = v * 10 + (ch - '0');
      if (v > INT32_MAX)
        return Status::error("item " + std::to_string(index) + " ('" + std::string(item) + "') is too large");
    }
    out.push_back(static_cast<int32_t>(v));
    ++index;
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace kvp::tools
