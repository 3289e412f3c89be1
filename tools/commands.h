// Each kvproof subcommand lives in its own tools/cmd_NAME.cc and registers itself on the
// top-level CLI11 app. Its callback stores the process exit code in `exit_code`:
// 0 success, 1 a check failed (verification, replay), 2 bad usage or bad input.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace kvp::tools {

// `command_line` (verify, audit, kernel-check, simulate): the process's argv as one shell
// line, the reproducer their --summary prints.

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitBadInput = 2;

void add_info_command(CLI::App& app, int& exit_code);
void add_generate_command(CLI::App& app, int& exit_code);
void add_export_command(CLI::App& app, int& exit_code);
void add_replay_command(CLI::App& app, int& exit_code);
void add_verify_command(CLI::App& app, int& exit_code, const std::string& command_line);
void add_audit_command(CLI::App& app, int& exit_code, const std::string& command_line);
void add_simulate_command(CLI::App& app, int& exit_code, const std::string& command_line);
void add_reference_command(CLI::App& app, int& exit_code);
void add_compare_command(CLI::App& app, int& exit_code);
void add_kernel_check_command(CLI::App& app, int& exit_code, const std::string& command_line);

}  // namespace kvp::tools
