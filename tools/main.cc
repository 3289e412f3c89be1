// kvproof: verification-first paged KV-cache management for LLM inference.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "common/summary.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvproof: tells you whether an LLM serving engine's KV cache is right, against an fp64 oracle",
               "kvproof"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  int exit_code = kvp::tools::kExitOk;
  const std::string command_line = kvp::verify::shell_command_line(argc, argv);
  // `kvproof --help` lists the commands by what a user comes to do, in this order (CLI11
  // prints groups in the order their first command was added).
  const auto group = [&app](const char* name, const char* title) { app.get_subcommand(name)->group(title); };
  kvp::tools::add_verify_command(app, exit_code, command_line);
  group("verify", "Gate correctness in CI (the paged engine against the oracle)");
  kvp::tools::add_audit_command(app, exit_code, command_line);
  kvp::tools::add_replay_command(app, exit_code);
  group("audit", "Audit cache isolation (kvproof's engine, or another engine's KV-event stream)");
  group("replay", "Audit cache isolation (kvproof's engine, or another engine's KV-event stream)");
  kvp::tools::add_kernel_check_command(app, exit_code, command_line);
  kvp::tools::add_reference_command(app, exit_code);
  kvp::tools::add_compare_command(app, exit_code);
  for (const char* name : {"kernel-check", "reference", "compare"})
    group(name, "Check another engine or kernel (attention plug-ins, golden log-probabilities)");
  kvp::tools::add_simulate_command(app, exit_code, command_line);
  group("simulate", "Size a deployment");
  kvp::tools::add_info_command(app, exit_code);
  kvp::tools::add_generate_command(app, exit_code);
  kvp::tools::add_export_command(app, exit_code);
  for (const char* name : {"info", "generate", "export"}) group(name, "Models: inspect, generate, export");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help or the usage error
    return rc == 0 ? kvp::tools::kExitOk : kvp::tools::kExitBadInput;
  }
  return exit_code;
}
