// The bad-input path every command's callback shares (exit code 2, see commands.h).
#pragma once

#include <cstdio>
#include <string>

#include "tools/commands.h"

namespace kvp::tools {

// What a command's callback calls on bad input: prints "kvproof COMMAND: MESSAGE" to stderr
// and sets the exit code to kExitBadInput.
inline auto bad_input_reporter(const char* command, int& exit_code) {
  return [command, &exit_code](const std::string& message) {
    std::fprintf(stderr, "kvproof %s: %s\n", command, message.c_str());
    exit_code = kExitBadInput;
  };
}

}  // namespace kvp::tools
