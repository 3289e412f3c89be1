// kvproof: verification-first paged KV-cache management for LLM inference.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvproof: a paged KV-cache engine checked against a dense reference transformer", "kvproof"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  int exit_code = kvp::tools::kExitOk;
  kvp::tools::add_info_command(app, exit_code);
  kvp::tools::add_generate_command(app, exit_code);
  kvp::tools::add_export_command(app, exit_code);
  kvp::tools::add_verify_command(app, exit_code);
  kvp::tools::add_audit_command(app, exit_code);
  kvp::tools::add_replay_command(app, exit_code);
  kvp::tools::add_simulate_command(app, exit_code);
  kvp::tools::add_reference_command(app, exit_code);
  kvp::tools::add_compare_command(app, exit_code);
  kvp::tools::add_kernel_check_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help or the usage error
    return rc == 0 ? kvp::tools::kExitOk : kvp::tools::kExitBadInput;
  }
  return exit_code;
}
