// The bad-input path every command's callback shares (exit code 2, see commands.h).
#pragma once

#include <cstdio>
#include <string>

#include "common/status.h"
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

// A command's result as its exit code: the code it returned, or for an error the bad-input
// path above.
inline void set_exit_code(const char* command, const Result<int>& result, int& exit_code) {
  if (result) {
    exit_code = *result;
    return;
  }
  bad_input_reporter(command, exit_code)(result.status().message());
}

}  // namespace kvp::tools
