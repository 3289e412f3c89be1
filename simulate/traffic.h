// Traffic for capacity simulations (kvproof simulate): requests described by arrival time
// and lengths only, from seeded synthetic generators or from traces.
//
// Trace formats:
//   CSV, the Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024): a header
//     line naming TIMESTAMP, ContextTokens and GeneratedTokens (any order, other columns
//     ignored), then one request per line; TIMESTAMP is "YYYY-MM-DD HH:MM:SS[.fraction]"
//     (or plain seconds), arrival times are taken relative to the first line's.
//   JSONL, one object per line (blank lines skipped):
//     {"arrival_s": 0.25, "prompt_tokens": 812, "output_tokens": 120,
//      "tenant": 0, "shared_prefix_tokens": 0}          // the last two optional
//     shared_prefix_tokens: the prompt's first tokens are the tenant's system prompt.
// Errors name the file, the line and the field: "trace.csv:17: field ContextTokens: not an
// integer: '12x'". Parsers never throw.
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvp {

struct TrafficRequest {
  double arrival_s = 0;
  int64_t prompt_tokens = 1;
  int64_t output_tokens = 1;
  int64_t tenant = 0;
  int64_t shared_prefix_tokens = 0;  // <= prompt_tokens: the tenant's system prompt
};

struct Traffic {
  std::string name;
  std::vector<TrafficRequest> requests;  // arrival order (non-decreasing arrival_s)
  double duration_s() const { return requests.empty() ? 0 : requests.back().arrival_s - requests.front().arrival_s; }
  // Requests per second over the trace's span (0 for fewer than two requests).
  double mean_rate() const;
};

// Parsers. `source` names the input in errors. Lengths must be >= 1 (prompt) and >= 0
// (output; a request with 0 output tokens is read as 1), arrival times finite; lines out of
// arrival order are sorted (stable).
Result<Traffic> parse_azure_csv(std::istream& in, const std::string& source);
Result<Traffic> parse_traffic_jsonl(std::istream& in, const std::string& source);
// By extension: .csv (Azure format) or .jsonl / .json (JSONL). Error: unreadable file,
// unknown extension.
Result<Traffic> load_traffic(const std::filesystem::path& path);

enum class ArrivalProcess { kPoisson, kGamma };
enum class LengthDistribution { kFixed, kLognormal };

struct LengthSpec {
  LengthDistribution dist = LengthDistribution::kLognormal;
  double mean = 512;   // of the lengths (for lognormal, the distribution's mean)
  double sigma = 0.8;  // lognormal shape (standard deviation of log length)
  int64_t min = 1;
  int64_t max = 8192;
};

struct SyntheticTrafficSpec {
  std::string name = "synthetic";
  ArrivalProcess arrivals = ArrivalProcess::kPoisson;
  double rate = 4;           // requests per second
  double burstiness_cv = 2;  // gamma arrivals: coefficient of variation of the gaps
  int64_t num_requests = 1000;
  LengthSpec prompt;
  LengthSpec output{LengthDistribution::kLognormal, 128, 0.8, 1, 2048};
  int64_t system_prompt_tokens = 0;  // shared by every request of a tenant (counts in prompt)
  int64_t num_tenants = 1;           // requests are spread round-robin over tenants
  uint64_t seed = 0;
  // Every number in range; an error names the field.
  Status validate() const;
};

// Same spec and seed: the same traffic on every machine.
Traffic generate_traffic(const SyntheticTrafficSpec& spec);

// Built-in shapes: chat (lognormal prompts ~1000 and outputs ~200, Poisson), long-docs
// (prompts ~3000, short outputs), shared-prefix (chat behind a 512-token system prompt,
// 4 tenants), bursty (chat with gamma arrivals, CV 3), max-len (every request exactly
// max_len tokens: prompt max_len/2, output max_len/2). `rate` and `num_requests` override
// the shape's.
std::vector<std::string> builtin_traffic_names();
Result<SyntheticTrafficSpec> builtin_traffic(const std::string& name, double rate, int64_t num_requests,
                                             int64_t max_len, uint64_t seed);

// Replay speed factor: arrival times divided by `speed` (2 = twice as fast). Rate
// rescaling: arrival times scaled so the mean rate becomes `rate` requests/s. Keeps only
// requests arriving within the first `max_duration_s` seconds (<= 0: all) and at most
// `max_requests` (<= 0: all). Arrival times restart at 0.
// REQUIRES: speed > 0; rate >= 0 (0: keep).
void reshape_traffic(Traffic& t, double speed, double rate, double max_duration_s, int64_t max_requests);

}  // namespace kvp
