// Fuzzer for the event-log replayer: any bytes must give a verdict (ok, malformed or
// violation) with a message naming a line, never a crash, hang or sanitizer report.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "optimized/checkers/event_log_replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kvp::ReplayResult r = kvp::replay_event_log(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!r.ok() && r.message.rfind("line ", 0) != 0 && r.message.rfind("end of log", 0) != 0) {
    std::fprintf(stderr, "replay error without a line number: %s\n", r.message.c_str());
    std::abort();
  }
  return 0;
}
