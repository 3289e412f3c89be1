// Small text helpers shared by the checkers' and backends' error messages.
#pragma once

#include <cstdint>
#include <string>

namespace kvp {

// A number in an error message ("block " + str(b) + ...).
inline std::string str(int64_t v) { return std::to_string(v); }

}  // namespace kvp
