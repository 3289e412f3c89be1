// Golden outputs any engine can be compared with (docs/golden.md, docs/golden.schema.json).
//
// A log-probability file is JSONL, schema "kvproof.logprobs" version 1: a header line, then
// one line per request. `kvproof reference` writes a golden file (role "golden": the fp64
// oracle's log-probabilities at every position, with the top-k); another engine's outputs
// are a candidate file (role "candidate": the same shape, any subset of positions, top-k
// optional), and `kvproof compare` checks the candidate against the golden.
//
// Position p (1 <= p < tokens.size()) scores tokens[p] given tokens[0..p-1]: position 0 has
// no score, as in an OpenAI `echo` response whose first token_logprob is null.
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kvp::golden {

inline constexpr const char* kSchemaName = "kvproof.logprobs";
inline constexpr int kSchemaVersion = 1;

struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;
};

struct ScoredPosition {
  int64_t pos = 0;    // index into the request's tokens of the token scored
  int32_t token = 0;  // tokens[pos]
  double logprob = 0;
  std::vector<TokenLogprob> top;  // by descending logprob (golden: ties lowest token first)
};

struct ScoredRequest {
  int64_t id = 0;  // golden: the request's index in the workload
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;            // the whole sequence scored: the prompt, then the continuation
  bool greedy = false;                    // the continuation is the producer's greedy one
  std::vector<ScoredPosition> positions;  // strictly increasing pos
  int64_t line = 0;                       // where it was read (1-based); 0 when built in memory
};

struct LogprobHeader {
  std::string role;      // "golden" or "candidate"
  std::string producer;  // free text: what wrote the file
  // Golden: {"source", "config_sha256", "weights_sha256", "vocab_size"}; candidate: free.
  nlohmann::json model = nlohmann::json::object();
  int32_t top_k = 0;  // golden: the length of every top list (>= 2); candidate: at most
  // The engine's KV cache element type, from model.kv_dtype (optional: f64 for the oracle's
  // dense cache, f32, f16, bf16, fp8-e4m3 or fp8-e5m2); empty when the file does not say.
  std::string kv_dtype;
};

struct LogprobFile {
  std::string source;  // the file name, for messages
  LogprobHeader header;
  std::vector<ScoredRequest> requests;  // in file order, ids unique
};

// Parses a log-probability file. Errors name the source, the line and the field:
// "golden.jsonl:3: positions[2].logprob: not a number". Checks every structural rule of
// docs/golden.md: the schema name and version, fields and types, tokens starting with the
// prompt, positions in range and increasing with token == tokens[pos], unique ids, and for a
// golden file a score at every position with a top list of exactly top_k entries.
Result<LogprobFile> parse_logprob_jsonl(std::istream& in, const std::string& source);
Result<LogprobFile> load_logprob_jsonl(const std::filesystem::path& path);

// The file as JSONL (the header, then one line per request; doubles round-trip exactly).
std::string to_jsonl(const LogprobFile& f);

// A candidate checked against a golden file. Positions are compared where the candidate's
// context and token equal the golden's (before the first token where the continuations
// differ): |candidate - golden| <= tolerance for the token's logprob and for every top-list
// token both name. Where greedy continuations differ, the divergence is explained when the
// golden's logprob of the candidate's token is within the tolerance of the golden's best (a
// near tie in the oracle: its top-2 margin is below the tolerance); otherwise it is real.
struct RequestComparison {
  int64_t id = 0;
  int64_t positions_compared = 0;
  int64_t positions_not_compared = 0;  // the candidate's, after the continuations differ
  double worst_diff = 0;
  // The first position whose logprobs differ beyond the tolerance, and why.
  std::optional<int64_t> logprob_divergence;
  std::string logprob_detail;
  // The first index where the continuations differ (candidate token != golden token).
  std::optional<int64_t> token_divergence;
  bool token_divergence_checked = false;  // greedy in both: a divergence must be explained
  bool token_divergence_explained = false;
  std::string token_detail;
  std::string note;  // lengths differ, nothing compared, ...
  bool passed() const;
};

struct CompareReport {
  std::string golden_source, candidate_source;
  nlohmann::json model;            // the golden's model identity
  std::string golden_kv_dtype;     // the golden's model.kv_dtype; empty when it does not say
  std::string candidate_kv_dtype;  // the candidate's model.kv_dtype; empty when it does not say
  double tolerance = 0;
  std::vector<RequestComparison> requests;  // in the golden's order
  int64_t positions_compared() const;
  // Fails on a real divergence, and when no position at all was compared.
  bool passed() const;
  std::string table() const;
  nlohmann::json to_json() const;
  // A warning when the candidate's KV dtype rounds more than fp32 and the tolerance is fp32's
  // (compare's default, 1e-3 nats or less); empty otherwise. In table() and to_json().
  std::string tolerance_note() const;
  std::string to_junit() const;
};

// Errors (not failures): a golden request missing from the candidate or a candidate request
// the golden does not have, a prompt that differs, a golden file whose role is not golden.
// They name the request id and the file and line.
Result<CompareReport> compare_logprobs(const LogprobFile& golden, const LogprobFile& candidate, double tolerance);

}  // namespace kvp::golden
