// Fuzzer for the trace parsers (simulate/traffic.h): any bytes, read as Azure CSV
// (first byte even) or JSONL (odd), must give traffic or an error naming the source and a
// line ("fuzz:LINE: ..."), never a crash, hang or sanitizer report; parsed traffic is in
// arrival order from 0 with lengths >= 1.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "simulate/traffic.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  const bool csv = (data[0] & 1) == 0;
  auto t = csv ? kvp::parse_azure_csv(in, "fuzz") : kvp::parse_traffic_jsonl(in, "fuzz");
  if (!t) {
    const std::string& m = t.status().message();
    if (m.rfind("fuzz:", 0) != 0) {
      std::fprintf(stderr, "trace error without the source: %s\n", m.c_str());
      std::abort();
    }
    return 0;
  }
  double last = 0;
  for (const kvp::TrafficRequest& r : t->requests) {
    if (r.arrival_s < last || r.prompt_tokens < 1 || r.output_tokens < 1 || r.shared_prefix_tokens > r.prompt_tokens) {
      std::fprintf(stderr, "parsed traffic breaks its contract\n");
      std::abort();
    }
    last = r.arrival_s;
  }
  return 0;
}
