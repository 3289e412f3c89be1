// kvproof replay LOG: re-checks a KV-cache event log (one JSON object per line) with the
// independent replayer (optimized/event_log_replay.h). Exit 0: the log is consistent;
// 1: an invariant is broken (the line and reason are printed); 2: the file cannot be read
// or is malformed.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "optimized/checkers/event_log_replay.h"
#include "tools/commands.h"

namespace kvp::tools {

void add_replay_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::string path;
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("replay", "Re-check a KV-cache event log (I1-I5) with the independent replayer");
  cmd->add_option("LOG", opt->path, "event log, one JSON object per line ('-' for stdin)")->required();
  cmd->add_flag("--json", opt->json, "print the verdict as JSON");
  cmd->callback([opt, &exit_code] {
    ReplayResult r;
    if (opt->path == "-") {
      r = replay_event_log(std::cin);
    } else {
      std::ifstream in(opt->path);
      if (!in) {
        std::fprintf(stderr, "kvproof replay: %s: cannot open\n", opt->path.c_str());
        exit_code = kExitBadInput;
        return;
      }
      r = replay_event_log(in);
    }
    const char* verdict = r.kind == ReplayResult::Kind::kOk          ? "ok"
                          : r.kind == ReplayResult::Kind::kMalformed ? "malformed"
                                                                     : "violation";
    if (opt->json) {
      nlohmann::json j = {{"log", opt->path},
                          {"verdict", verdict},
                          {"lines", r.lines},
                          {"sequences", r.sequences},
                          {"device_in_use", r.device_in_use},
                          {"device_cached", r.device_cached},
                          {"host_in_use", r.host_in_use}};
      if (!r.ok()) j["error"] = r.message;
      std::printf("%s\n", j.dump(2).c_str());
    } else if (r.ok()) {
      std::printf(
          "%s: ok: %lld lines; at the end %lld sequences, %lld device blocks in use, "
          "%lld cached, %lld host blocks in use\n",
          opt->path.c_str(), static_cast<long long>(r.lines), static_cast<long long>(r.sequences),
          static_cast<long long>(r.device_in_use), static_cast<long long>(r.device_cached),
          static_cast<long long>(r.host_in_use));
    }
    if (!r.ok()) {
      std::fprintf(stderr, "kvproof replay: %s: %s: %s\n", opt->path.c_str(), verdict, r.message.c_str());
    }
    exit_code = r.kind == ReplayResult::Kind::kOk          ? kExitOk
                : r.kind == ReplayResult::Kind::kMalformed ? kExitBadInput
                                                           : kExitCheckFailed;
  });
}

}  // namespace kvp::tools
