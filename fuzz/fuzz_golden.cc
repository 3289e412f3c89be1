// Fuzzer for the golden/candidate log-probability parser and compare (golden/golden.h). The
// first byte chooses: even, the rest is one file; odd, two files split at the first NUL byte
// (golden, candidate), compared when both parse, with a tolerance from the byte's high bits.
// Never a crash, hang or sanitizer report; an error names the source and, past the header, a
// line ("fuzz:LINE: ..."); a parsed file keeps the structural rules and survives a round trip
// (writing it and parsing it again gives the same text).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "golden/golden.h"

namespace {

void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: %s\n", what, detail.c_str());
  std::abort();
}

kvp::Result<kvp::golden::LogprobFile> parse(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  auto f = kvp::golden::parse_logprob_jsonl(in, source);
  if (!f) {
    if (f.status().message().rfind(source + ":", 0) != 0) fail("error without the source", f.status().message());
    return f;
  }
  for (const auto& r : f->requests) {
    int64_t last = 0;
    if (r.tokens.size() < r.prompt.size() || r.prompt.empty()) fail("tokens shorter than the prompt", source);
    for (const auto& p : r.positions) {
      if (p.pos <= last || p.pos >= static_cast<int64_t>(r.tokens.size()) ||
          r.tokens[static_cast<std::size_t>(p.pos)] != p.token)
        fail("parsed positions break their contract", source);
      last = p.pos;
    }
  }
  const std::string text1 = kvp::golden::to_jsonl(*f);
  std::istringstream again(text1);
  auto f2 = kvp::golden::parse_logprob_jsonl(again, source);
  if (!f2) fail("written file does not parse", f2.status().message());
  if (kvp::golden::to_jsonl(*f2) != text1) fail("round trip changed the file", source);
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    (void)parse(rest, "fuzz");
    return 0;
  }
  const std::size_t split = rest.find('\0');
  if (split == std::string::npos) return 0;
  auto golden = parse(rest.substr(0, split), "fuzz");
  auto candidate = parse(rest.substr(split + 1), "fuzz2");
  if (!golden || !candidate) return 0;
  const double tolerance = (data[0] >> 1) * 1e-3;
  auto report = kvp::golden::compare_logprobs(*golden, *candidate, tolerance);
  if (!report) return 0;
  (void)report->table();
  (void)report->to_json().dump();
  (void)report->to_junit();
  return 0;
}
