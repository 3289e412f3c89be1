// Golden files (golden/golden.h): `kvproof reference` agrees with the oracle run on its own,
// `kvproof compare` passes what agrees, fails a real divergence naming request and position,
// explains a near tie, and malformed files are errors naming the file and line.
#include <cmath>
#include <sstream>

#include <gtest/gtest.h>

#include "golden/golden.h"
#include "golden/golden_reference.h"
#include "model/presets.h"
#include "reference/reference_model.h"

namespace kvp::golden {
namespace {

Workload small_workload() {
  Workload w;
  w.name = "golden-test";
  auto add = [&](std::vector<int32_t> prompt, int64_t max_tokens, float temperature) {
    WorkloadRequest r;
    r.spec.prompt = std::move(prompt);
    r.spec.max_tokens = max_tokens;
    r.spec.sampling.temperature = temperature;
    r.spec.sampling.seed = 7;
    w.requests.push_back(r);
  };
  add({1, 17, 300, 42, 5}, 6, 0.0f);        // greedy
  add({9, 9, 9, 100, 511, 3, 8}, 4, 0.8f);  // sampled
  add({250}, 3, 0.0f);                      // a one-token prompt
  return w;
}

const Model& tiny() {
  static const Model m = make_preset("tiny").value();
  return m;
}

LogprobFile reparse(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  auto f = parse_logprob_jsonl(in, source);
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  return f.is_ok() ? *f : LogprobFile{};
}

const LogprobFile& tiny_golden() {
  static const LogprobFile g = [] {
    ReferenceOptions o;
    o.top_k = 5;
    o.source = "preset tiny";
    auto made = make_golden(tiny(), small_workload(), o);
    EXPECT_TRUE(made.is_ok()) << made.status().message();
    return reparse(to_jsonl(*made), "golden.jsonl");
  }();
  return g;
}

LogprobFile as_candidate(LogprobFile f) {
  f.header.role = "candidate";
  f.source = "candidate.jsonl";
  return f;
}

// The oracle run independently of make_golden: one position at a time (forward_sequential,
// not the batched products) and a log-softmax written out here in long double.
TEST(Golden, ReferenceAgreesWithTheOracleRunIndependently) {
  const LogprobFile& g = tiny_golden();
  ASSERT_EQ(g.requests.size(), 3u);
  EXPECT_EQ(g.header.top_k, 5);
  EXPECT_EQ(g.header.model.at("config_sha256").get<std::string>().size(), 64u);
  const ReferenceModel<double> oracle(tiny());
  const Workload w = small_workload();
  double worst = 0;
  for (std::size_t i = 0; i < g.requests.size(); ++i) {
    const ScoredRequest& r = g.requests[i];
    EXPECT_EQ(r.id, static_cast<int64_t>(i));
    EXPECT_EQ(r.prompt, w.requests[i].spec.prompt);
    EXPECT_EQ(r.greedy, w.requests[i].spec.sampling.greedy());
    ASSERT_EQ(r.tokens.size(), r.prompt.size() + static_cast<std::size_t>(w.requests[i].spec.max_tokens));
    ASSERT_EQ(r.positions.size(), r.tokens.size() - 1);
    auto cache = oracle.make_cache(static_cast<int64_t>(r.tokens.size()));
    auto logits = oracle.forward_sequential(std::span<const int32_t>(r.tokens.data(), r.tokens.size() - 1), cache);
    ASSERT_TRUE(logits.is_ok()) << logits.status().message();
    for (const ScoredPosition& s : r.positions) {
      const auto row = logits->row(s.pos - 1);
      long double sum = 0;
      const double m = row.maxCoeff();
      for (Eigen::Index v = 0; v < row.size(); ++v) sum += std::exp(static_cast<long double>(row(v) - m));
      const auto lp = [&](int32_t t) { return static_cast<double>(row(t) - m - std::log(sum)); };
      worst = std::max(worst, std::abs(s.logprob - lp(s.token)));
      ASSERT_EQ(s.top.size(), 5u);
      Eigen::Index best = 0;
      row.maxCoeff(&best);
      EXPECT_EQ(s.top[0].token, best) << "request " << r.id << " position " << s.pos;
      for (std::size_t k = 0; k < s.top.size(); ++k) {
        worst = std::max(worst, std::abs(s.top[k].logprob - lp(s.top[k].token)));
        if (k > 0) {
          EXPECT_GE(s.top[k - 1].logprob, s.top[k].logprob);
        }
      }
      // A greedy continuation is the oracle's arg-max at every generated position.
      if (r.greedy && s.pos >= static_cast<int64_t>(r.prompt.size())) {
        EXPECT_EQ(s.token, best) << "position " << s.pos;
      }
    }
  }
  EXPECT_LT(worst, 1e-9);
}

TEST(Golden, CompareWithItselfPasses) {
  auto report = compare_logprobs(tiny_golden(), as_candidate(tiny_golden()), 1e-3);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_TRUE(report->passed()) << report->table();
  EXPECT_EQ(report->positions_compared(), 10 + 10 + 3);
  EXPECT_EQ(report->to_json().at("passed"), true);
}

TEST(Golden, OnePerturbedLogprobFailsNamingRequestAndPosition) {
  LogprobFile c = as_candidate(tiny_golden());
  c.requests[1].positions[2].logprob += 0.01;  // position 3 of request 1
  c = reparse(to_jsonl(c), "candidate.jsonl");
  auto report = compare_logprobs(tiny_golden(), c, 1e-3);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_FALSE(report->passed());
  const RequestComparison& r = report->requests[1];
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.logprob_divergence, 3);
  EXPECT_NE(r.logprob_detail.find("position 3"), std::string::npos) << r.logprob_detail;
  EXPECT_TRUE(report->requests[0].passed());
  EXPECT_TRUE(report->requests[2].passed());
  EXPECT_NE(report->to_junit().find("name=\"request 1\"><failure message=\"position 3"), std::string::npos)
      << report->to_junit();
  // Within the tolerance it passes.
  EXPECT_TRUE(compare_logprobs(tiny_golden(), c, 0.02)->passed());
}

// A hand-made golden file with a near tie at position 2: tokens 5 and 7 within 5e-4.
LogprobFile tie_golden(double second) {
  LogprobFile g;
  g.source = "tie.jsonl";
  g.header = {"golden", "test", {{"source", "t"}, {"config_sha256", "c"}, {"weights_sha256", "w"}}, 2, ""};
  ScoredRequest r;
  r.prompt = {1, 2};
  r.tokens = {1, 2, 5, 6};
  r.greedy = true;
  r.positions = {{1, 2, -1.0, {{2, -1.0}, {3, -2.0}}},
                 {2, 5, -0.69, {{5, -0.69}, {7, second}}},
                 {3, 6, -0.5, {{6, -0.5}, {8, -1.5}}}};
  g.requests.push_back(r);
  return reparse(to_jsonl(g), "tie.jsonl");
}

LogprobFile diverging_candidate() {
  LogprobFile c;
  c.source = "cand.jsonl";
  c.header.role = "candidate";
  ScoredRequest r;
  r.prompt = {1, 2};
  r.tokens = {1, 2, 7, 8};  // chose 7 at position 2
  r.greedy = true;
  r.positions = {{1, 2, -1.0, {}}, {2, 7, -0.6905, {}}, {3, 8, -0.1, {}}};
  c.requests.push_back(r);
  return reparse(to_jsonl(c), "cand.jsonl");
}

TEST(Golden, GreedyDivergenceAtANearTieIsExplained) {
  auto report = compare_logprobs(tie_golden(-0.6905), diverging_candidate(), 1e-3);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  const RequestComparison& r = report->requests[0];
  EXPECT_EQ(r.token_divergence, 2);
  EXPECT_TRUE(r.token_divergence_checked);
  EXPECT_TRUE(r.token_divergence_explained) << r.token_detail;
  EXPECT_EQ(r.positions_compared, 1);  // position 1; 2 and 3 follow the divergence
  EXPECT_EQ(r.positions_not_compared, 2);
  EXPECT_TRUE(report->passed()) << report->table();
  EXPECT_NE(report->table().find("explained"), std::string::npos);
}

TEST(Golden, GreedyDivergenceWithoutATieFails) {
  auto report = compare_logprobs(tie_golden(-1.2), diverging_candidate(), 1e-3);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_FALSE(report->requests[0].token_divergence_explained);
  EXPECT_FALSE(report->passed());
  EXPECT_NE(report->requests[0].token_detail.find("position 2: candidate token 7, golden 5"), std::string::npos)
      << report->requests[0].token_detail;
}

std::string parse_error(const std::string& text) {
  std::istringstream in(text);
  auto f = parse_logprob_jsonl(in, "f.jsonl");
  return f.is_ok() ? "(parsed)" : f.status().message();
}

TEST(Golden, MalformedFilesAreErrorsNamingFileLineAndField) {
  const std::string golden = to_jsonl(tie_golden(-1.2));
  const std::string header = golden.substr(0, golden.find('\n') + 1);
  const std::string request = golden.substr(golden.find('\n') + 1);
  EXPECT_EQ(parse_error(golden), "(parsed)");
  EXPECT_EQ(parse_error(header + "\n{\"id\": 0, \"prompt\": [1,\n"), "f.jsonl:3: not valid JSON");
  std::string v2 = header;
  v2.replace(v2.find("\"version\":1"), 11, "\"version\":2");
  EXPECT_EQ(parse_error(v2 + request), "f.jsonl:1: version: 2 not supported (this kvproof reads version 1)");
  std::string no_logprob = request;
  no_logprob.erase(no_logprob.find("\"logprob\":-0.69,"), 16);
  EXPECT_EQ(parse_error(header + no_logprob), "f.jsonl:2: request: positions[1].logprob: missing");
  std::string no_greedy = request;
  no_greedy.erase(no_greedy.find("\"greedy\":true,"), 14);
  EXPECT_EQ(parse_error(header + no_greedy), "f.jsonl:2: request: greedy: missing");
  EXPECT_EQ(parse_error(""), "f.jsonl: empty (no header line)");
  EXPECT_EQ(parse_error("{\"version\":1}\n"), "f.jsonl:1: schema: missing (the first line is the header)");
  EXPECT_EQ(parse_error(header + request + request), "f.jsonl:3: request id 0 already on line 2");
}

// Each rule of the schema the parser enforces, broken once: refused, naming the file, the line
// and the field.
TEST(Golden, EachSchemaRuleBrokenIsRefusedByName) {
  const std::string golden = to_jsonl(tie_golden(-1.2));
  const std::string header = golden.substr(0, golden.find('\n') + 1);
  const std::string request = golden.substr(golden.find('\n') + 1);
  const auto edited = [&](const std::string& from, const std::string& to) {
    std::string r = request;
    const auto at = r.find(from);
    EXPECT_NE(at, std::string::npos) << from << " not in " << r;
    if (at != std::string::npos) r.replace(at, from.size(), to);
    return header + r;
  };
  // A logprob that is not finite cannot be written in JSON (no NaN or Infinity literal; a
  // number past the double range is refused by the JSON parser itself).
  EXPECT_EQ(parse_error(edited("\"logprob\":-0.69,", "\"logprob\":-1e999,")), "f.jsonl:2: not valid JSON");
  // Positions strictly increasing: a repeated pos.
  EXPECT_EQ(parse_error(edited("\"pos\":2,", "\"pos\":1,")),
            "f.jsonl:2: request: positions[1].pos: 1 not after the previous position");
  // A golden file scores every position.
  std::string fewer = request;
  const auto third = fewer.find(",{\"logprob\":-0.5");
  ASSERT_NE(third, std::string::npos) << fewer;
  fewer.erase(third, fewer.find('}', fewer.find("]]", third)) + 1 - third);
  EXPECT_EQ(parse_error(header + fewer),
            "f.jsonl:2: request: positions: 2 entries, a golden file scores every position 1..3");
  // A position's token is tokens[pos].
  EXPECT_EQ(parse_error(edited("\"token\":5,", "\"token\":9,")),
            "f.jsonl:2: request: positions[1].token: 9 but tokens[2] is 5");
  // A candidate's top list is at most top_k long (its header's).
  std::string candidate_header = header;
  candidate_header.replace(candidate_header.find("\"role\":\"golden\""), 15, "\"role\":\"candidate\"");
  std::string longer = request;
  longer.replace(longer.find("[[5,-0.69],[7,-1.2]]"), 20, "[[5,-0.69],[7,-1.2],[9,-3.0]]");
  EXPECT_EQ(parse_error(candidate_header + longer),
            "f.jsonl:2: request: positions[1].top: 3 entries, more than top_k 2");
  EXPECT_EQ(parse_error(candidate_header + request), "(parsed)");
  // compare refuses a negative tolerance.
  auto negative = compare_logprobs(tie_golden(-1.2), diverging_candidate(), -1e-3);
  ASSERT_FALSE(negative.is_ok());
  EXPECT_EQ(negative.status().message(), "tolerance: must be >= 0");
}

TEST(Golden, MissingRequestsAndMismatchedPromptsAreErrors) {
  LogprobFile c = as_candidate(tiny_golden());
  c.requests.pop_back();
  auto missing = compare_logprobs(tiny_golden(), c, 1e-3);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().message(), "golden.jsonl:4: request 2: missing from the candidate candidate.jsonl");
  c = as_candidate(tiny_golden());
  c.requests[1].prompt[4] = 6;
  c.requests[1].tokens[4] = 6;
  c.requests[1].positions[3].token = 6;
  c = reparse(to_jsonl(c), "candidate.jsonl");
  auto prompt = compare_logprobs(tiny_golden(), c, 1e-3);
  ASSERT_FALSE(prompt.is_ok());
  EXPECT_EQ(prompt.status().message(),
            "candidate.jsonl:3: request 1: prompt differs from the golden's (golden.jsonl:3) at index 4: candidate 6, "
            "golden 511");
  c = as_candidate(tiny_golden());
  c.requests[0].id = 9;
  EXPECT_FALSE(compare_logprobs(tiny_golden(), c, 1e-3).is_ok());
}

// The tolerance is symmetric: a candidate as far below the golden fails as surely as one
// above it, and within it either way passes.
TEST(Golden, ToleranceIsSymmetric) {
  for (const double delta : {0.01, -0.01}) {
    LogprobFile c = as_candidate(tiny_golden());
    c.requests[1].positions[2].logprob += delta;
    c = reparse(to_jsonl(c), "candidate.jsonl");
    auto report = compare_logprobs(tiny_golden(), c, 1e-3);
    ASSERT_TRUE(report.is_ok()) << report.status().message();
    EXPECT_FALSE(report->passed()) << "delta " << delta;
    EXPECT_EQ(report->requests[1].logprob_divergence, 3) << "delta " << delta;
    EXPECT_TRUE(compare_logprobs(tiny_golden(), c, 0.02)->passed()) << "delta " << delta;
  }
  // The same for a top-k entry's logprob.
  LogprobFile c = as_candidate(tiny_golden());
  ASSERT_FALSE(c.requests[0].positions[1].top.empty());
  c.requests[0].positions[1].top.back().logprob -= 0.01;
  c = reparse(to_jsonl(c), "candidate.jsonl");
  EXPECT_FALSE(compare_logprobs(tiny_golden(), c, 1e-3)->passed());
}

// A candidate that scores no position at all is no evidence: the compare does not pass.
TEST(Golden, ACandidateWithNoPositionComparedDoesNotPass) {
  LogprobFile c = as_candidate(tiny_golden());
  for (ScoredRequest& r : c.requests) r.positions.clear();
  c = reparse(to_jsonl(c), "candidate.jsonl");
  auto report = compare_logprobs(tiny_golden(), c, 1e-3);
  ASSERT_TRUE(report.is_ok()) << report.status().message();
  EXPECT_EQ(report->positions_compared(), 0);
  EXPECT_FALSE(report->passed()) << report->table();
  EXPECT_NE(report->requests[0].note.find("no position compared"), std::string::npos) << report->requests[0].note;
}

// A difference of exactly the tolerance passes; one ulp of tolerance less, and it fails.
TEST(Golden, ADifferenceOfExactlyTheTolerancePasses) {
  constexpr double kTol = 1.0 / 1024;  // a power of two: the candidate's difference is exact
  LogprobFile c = as_candidate(tiny_golden());
  c.requests[1].positions[2].logprob += kTol;
  c = reparse(to_jsonl(c), "candidate.jsonl");
  ASSERT_EQ(c.requests[1].positions[2].logprob - tiny_golden().requests[1].positions[2].logprob, kTol);
  auto at = compare_logprobs(tiny_golden(), c, kTol);
  ASSERT_TRUE(at.is_ok()) << at.status().message();
  EXPECT_TRUE(at->passed()) << at->table();
  EXPECT_EQ(at->requests[1].worst_diff, kTol);
  auto under = compare_logprobs(tiny_golden(), c, std::nextafter(kTol, 0.0));
  ASSERT_TRUE(under.is_ok()) << under.status().message();
  EXPECT_FALSE(under->passed()) << under->table();
  EXPECT_EQ(under->requests[1].logprob_divergence, 3);
}

// A greedy divergence is a near tie when the golden's margin between its best token and the
// candidate's is at most the tolerance: at it, explained; one ulp under it, not.
TEST(Golden, NearTieIsExplainedUpToTheToleranceAndNoFurther) {
  const LogprobFile g = tie_golden(-0.6905);
  const auto& top = g.requests[0].positions[1].top;
  ASSERT_EQ(top[1].token, 7);
  const double margin = top[0].logprob - top[1].logprob;
  ASSERT_GT(margin, 0.0);
  auto at = compare_logprobs(g, diverging_candidate(), margin);
  ASSERT_TRUE(at.is_ok()) << at.status().message();
  EXPECT_TRUE(at->requests[0].token_divergence_explained) << at->requests[0].token_detail;
  EXPECT_TRUE(at->passed()) << at->table();
  auto past = compare_logprobs(g, diverging_candidate(), std::nextafter(margin, 0.0));
  ASSERT_TRUE(past.is_ok()) << past.status().message();
  EXPECT_FALSE(past->requests[0].token_divergence_explained) << past->requests[0].token_detail;
  EXPECT_FALSE(past->passed()) << past->table();
}

// A candidate request the golden file does not have is an error naming it, as a golden
// request the candidate lacks is.
TEST(Golden, ACandidateRequestTheGoldenLacksIsAnErrorNamingIt) {
  LogprobFile c = as_candidate(tiny_golden());
  ScoredRequest extra = c.requests[0];
  extra.id = 9;
  c.requests.push_back(extra);
  c = reparse(to_jsonl(c), "candidate.jsonl");
  auto r = compare_logprobs(tiny_golden(), c, 1e-3);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "candidate.jsonl:5: request 9: not in the golden file golden.jsonl");
}

// Golden files record the KV dtype (model.kv_dtype): the oracle's golden says f64, a candidate
// says its engine's, compare prints both and warns when a rounding KV dtype meets the fp32
// tolerance; a value that is not a KV dtype is refused by name.
TEST(Golden, FilesRecordTheKvDtypeAndCompareReportsIt) {
  EXPECT_EQ(tiny_golden().header.kv_dtype, "f64");
  EXPECT_EQ(tiny_golden().header.model.at("kv_dtype"), "f64");
  for (const char* dtype : {"f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"}) {
    LogprobFile c = as_candidate(tiny_golden());
    c.header.kv_dtype = dtype;
    const LogprobFile back = reparse(to_jsonl(c), "candidate.jsonl");
    EXPECT_EQ(back.header.kv_dtype, dtype);
    auto report = compare_logprobs(tiny_golden(), back, 1e-3);
    ASSERT_TRUE(report.is_ok()) << report.status().message();
    EXPECT_TRUE(report->passed()) << report->table();
    EXPECT_NE(report->table().find(std::string("KV dtype: golden f64, candidate ") + dtype + "\n"), std::string::npos)
        << report->table();
    EXPECT_EQ(report->to_json().at("candidate_kv_dtype"), dtype);
    EXPECT_EQ(report->to_json().at("golden_kv_dtype"), "f64");
    const bool rounds = std::string(dtype) != "f32";
    EXPECT_EQ(report->table().find("note: the candidate's KV cache is") != std::string::npos, rounds)
        << report->table();
    EXPECT_EQ(report->to_json().at("tolerance_note").is_string(), rounds);
    // A tolerance set above fp32's: no warning.
    auto wider = compare_logprobs(tiny_golden(), back, 2e-2);
    ASSERT_TRUE(wider.is_ok());
    EXPECT_EQ(wider->tolerance_note(), "");
  }
  // Not recorded: said so, no warning.
  auto unrecorded = compare_logprobs(tiny_golden(), as_candidate(tiny_golden()), 1e-3);
  ASSERT_TRUE(unrecorded.is_ok());
  LogprobFile plain = as_candidate(tiny_golden());
  plain.header.kv_dtype.clear();
  plain.header.model.erase("kv_dtype");
  auto none = compare_logprobs(tiny_golden(), reparse(to_jsonl(plain), "c.jsonl"), 1e-3);
  ASSERT_TRUE(none.is_ok());
  EXPECT_NE(none->table().find("KV dtype: golden f64, candidate not recorded\n"), std::string::npos) << none->table();
  EXPECT_TRUE(none->to_json().at("candidate_kv_dtype").is_null());
  // Bad values: refused naming the field.
  const std::string golden = to_jsonl(tiny_golden());
  for (const char* bad : {"\"fp8\"", "\"F16\"", "16", "null"}) {
    std::string text = golden;
    const std::string from = "\"kv_dtype\":\"f64\"";
    ASSERT_NE(text.find(from), std::string::npos) << text.substr(0, 300);
    text.replace(text.find(from), from.size(), std::string("\"kv_dtype\":") + bad);
    EXPECT_EQ(parse_error(text), std::string("f.jsonl:1: model.kv_dtype: ") + bad +
                                     ", expected f64, f32, f16, bf16, fp8-e4m3 or fp8-e5m2");
  }
}

}  // namespace
}  // namespace kvp::golden
