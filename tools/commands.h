// Each kvproof subcommand lives in its own tools/cmd_NAME.cc and registers itself on the
// top-level CLI11 app. Its callback stores the process exit code in `exit_code`:
// 0 success, 1 a check failed (verification, replay), 2 bad usage or bad input.
#pragma once

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"

namespace kvp::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitBadInput = 2;

// A command's result as its exit code: the code it returned, or for an error its message on
// stderr ("kvproof NAME: ...") and kExitBadInput.
inline void set_exit_code(const char* name, const Result<int>& result, int& exit_code) {
  if (result) {
    exit_code = *result;
    return;
  }
  std::fprintf(stderr, "kvproof %s: %s\n", name, result.status().message().c_str());
  exit_code = kExitBadInput;
}

void add_info_command(CLI::App& app, int& exit_code);
void add_generate_command(CLI::App& app, int& exit_code);
void add_export_command(CLI::App& app, int& exit_code);
void add_replay_command(CLI::App& app, int& exit_code);
void add_verify_command(CLI::App& app, int& exit_code);
void add_audit_command(CLI::App& app, int& exit_code);
void add_simulate_command(CLI::App& app, int& exit_code);
void add_reference_command(CLI::App& app, int& exit_code);
void add_compare_command(CLI::App& app, int& exit_code);
void add_kernel_check_command(CLI::App& app, int& exit_code);

}  // namespace kvp::tools
