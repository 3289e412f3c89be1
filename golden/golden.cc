#include "golden/golden.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "common/report.h"

namespace kvp::golden {
namespace {

using nlohmann::json;

// Field readers: each error is "FIELD: reason"; the caller prefixes the source and line.
Result<int64_t> int_field(const json& j, const std::string& name, int64_t lo, int64_t hi) {
  const json* v = nullptr;
  if (auto it = j.find(name); it != j.end()) v = &*it;
  if (v == nullptr) return Status::error(name + ": missing");
  if (!v->is_number_integer()) return Status::error(name + ": not an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return Status::error(name + ": out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    return Status::error(name + ": " + std::to_string(x) + " out of range [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]");
  return x;
}

Result<double> logprob_value(const json& v, const std::string& name) {
  if (!v.is_number()) return Status::error(name + ": not a number");
  const double x = v.get<double>();
  if (!std::isfinite(x)) return Status::error(name + ": not finite");
  return x;
}

constexpr int64_t kMaxToken = std::numeric_limits<int32_t>::max();

Result<std::vector<int32_t>> token_array(const json& j, const std::string& name) {
  auto it = j.find(name);
  if (it == j.end()) return Status::error(name + ": missing");
  if (!it->is_array()) return Status::error(name + ": not an array");
  std::vector<int32_t> out;
  out.reserve(it->size());
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string at = name + "[" + std::to_string(i) + "]";
    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(kMaxToken)))
      return Status::error(at + ": not a token id (an integer in [0, 2^31))");
    const int64_t x = t.get<int64_t>();
    if (x < 0 || x > kMaxToken) return Status::error(at + ": not a token id (an integer in [0, 2^31))");
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

Result<std::vector<TokenLogprob>> top_list(const json& j, const std::string& name) {
  if (!j.is_array()) return Status::error(name + ": not an array of [token, logprob] pairs");
  std::vector<TokenLogprob> out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    const json& e = j[i];
    const std::string at = name + "[" + std::to_string(i) + "]";
    if (!e.is_array() || e.size() != 2) return Status::error(at + ": not a [token, logprob] pair");
    const json& t = e[0];
    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(kMaxToken)) ||
        t.get<int64_t>() < 0 || t.get<int64_t>() > kMaxToken)
      return Status::error(at + "[0]: not a token id (an integer in [0, 2^31))");
    auto lp = logprob_value(e[1], at + "[1]");
    if (!lp) return lp.status();
    for (const TokenLogprob& seen : out)
      if (seen.token == t.get<int32_t>()) return Status::error(at + ": token " + t.dump() + " listed twice");
    out.push_back({t.get<int32_t>(), *lp});
  }
  return out;
}

Result<LogprobHeader> parse_header(const json& j) {
  if (!j.is_object()) return Status::error("header: not a JSON object");
  auto schema = j.find("schema");
  if (schema == j.end()) return Status::error("schema: missing (the first line is the header)");
  if (!schema->is_string() || schema->get<std::string>() != kSchemaName)
    return Status::error("schema: " + schema->dump() + ", expected \"" + kSchemaName + "\"");
  auto version = int_field(j, "version", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  if (!version) return version.status();
  if (*version != kSchemaVersion)
    return Status::error("version: " + std::to_string(*version) + " not supported (this kvproof reads version " +
                         std::to_string(kSchemaVersion) + ")");
  LogprobHeader h;
  auto role = j.find("role");
  if (role == j.end()) return Status::error("role: missing");
  if (!role->is_string() || (role->get<std::string>() != "golden" && role->get<std::string>() != "candidate"))
    return Status::error("role: " + role->dump() + ", expected \"golden\" or \"candidate\"");
  h.role = role->get<std::string>();
  if (auto p = j.find("producer"); p != j.end()) {
    if (!p->is_string()) return Status::error("producer: not a string");
    h.producer = p->get<std::string>();
  }
  if (auto m = j.find("model"); m != j.end()) {
    if (!m->is_object()) return Status::error("model: not an object");
    h.model = *m;
    if (auto d = m->find("kv_dtype"); d != m->end()) {
      static const char* const kNames[] = {"f64", "f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"};
      const bool known =
          d->is_string() && std::find(std::begin(kNames), std::end(kNames), d->get<std::string>()) != std::end(kNames);
      if (!known)
        return Status::error("model.kv_dtype: " + d->dump() + ", expected f64, f32, f16, bf16, fp8-e4m3 or fp8-e5m2");
      h.kv_dtype = d->get<std::string>();
    }
  }
  const bool golden = h.role == "golden";
  if (golden) {
    if (!j.contains("model")) return Status::error("model: missing (a golden file names its model)");
    for (const char* key : {"source", "config_sha256", "weights_sha256"})
      if (!h.model.contains(key) || !h.model[key].is_string())
        return Status::error(std::string("model.") + key + ": missing or not a string");
  }
  if (golden || j.contains("top_k")) {
    auto k = int_field(j, "top_k", golden ? 2 : 0, 1 << 20);
    if (!k) return k.status();
    h.top_k = static_cast<int32_t>(*k);
  }
  return h;
}

Result<ScoredRequest> parse_request(const json& j, const LogprobHeader& h) {
  if (!j.is_object()) return Status::error("not a JSON object");
  ScoredRequest r;
  auto id = int_field(j, "id", 0, std::numeric_limits<int64_t>::max());
  if (!id) return id.status();
  r.id = *id;
  auto prompt = token_array(j, "prompt");
  if (!prompt) return prompt.status();
  r.prompt = std::move(*prompt);
  if (r.prompt.empty()) return Status::error("prompt: empty");
  auto tokens = token_array(j, "tokens");
  if (!tokens) return tokens.status();
  r.tokens = std::move(*tokens);
  if (r.tokens.size() < r.prompt.size() || !std::equal(r.prompt.begin(), r.prompt.end(), r.tokens.begin()))
    return Status::error("tokens: does not start with the prompt");
  auto greedy = j.find("greedy");
  if (greedy == j.end()) return Status::error("greedy: missing");
  if (!greedy->is_boolean()) return Status::error("greedy: not a boolean");
  r.greedy = greedy->get<bool>();
  auto positions = j.find("positions");
  if (positions == j.end()) return Status::error("positions: missing");
  if (!positions->is_array()) return Status::error("positions: not an array");
  const bool golden = h.role == "golden";
  if (golden && positions->size() + 1 != r.tokens.size())
    return Status::error("positions: " + std::to_string(positions->size()) + " entries, a golden file scores every " +
                         "position 1.." + std::to_string(r.tokens.size() - 1));
  int64_t last = 0;
  for (std::size_t i = 0; i < positions->size(); ++i) {
    const json& e = (*positions)[i];
    const std::string at = "positions[" + std::to_string(i) + "]";
    if (!e.is_object()) return Status::error(at + ": not an object");
    ScoredPosition s;
    auto pos = int_field(e, "pos", 1, static_cast<int64_t>(r.tokens.size()) - 1);
    if (!pos) return pos.status().with_context(at);
    if (*pos <= last) return Status::error(at + ".pos: " + std::to_string(*pos) + " not after the previous position");
    s.pos = last = *pos;
    auto token = int_field(e, "token", 0, kMaxToken);
    if (!token) return token.status().with_context(at);
    s.token = static_cast<int32_t>(*token);
    if (s.token != r.tokens[static_cast<std::size_t>(s.pos)])
      return Status::error(at + ".token: " + std::to_string(s.token) + " but tokens[" + std::to_string(s.pos) +
                           "] is " + std::to_string(r.tokens[static_cast<std::size_t>(s.pos)]));
    auto lp = e.find("logprob");
    if (lp == e.end()) return Status::error(at + ".logprob: missing");
    auto value = logprob_value(*lp, at + ".logprob");
    if (!value) return value.status();
    s.logprob = *value;
    if (auto top = e.find("top"); top != e.end()) {
      auto list = top_list(*top, at + ".top");
      if (!list) return list.status();
      s.top = std::move(*list);
      if (h.top_k > 0 && s.top.size() > static_cast<std::size_t>(h.top_k))
        return Status::error(at + ".top: " + std::to_string(s.top.size()) + " entries, more than top_k " +
                             std::to_string(h.top_k));
    }
    if (golden && s.top.size() != static_cast<std::size_t>(h.top_k))
      return Status::error(at + ".top: " + std::to_string(s.top.size()) + " entries, a golden file has top_k " +
                           std::to_string(h.top_k));
    r.positions.push_back(std::move(s));
  }
  return r;
}

}  // namespace

Result<LogprobFile> parse_logprob_jsonl(std::istream& in, const std::string& source) {
  LogprobFile f;
  f.source = source;
  std::map<int64_t, int64_t> line_of_id;
  std::string text;
  int64_t line = 0;
  bool have_header = false;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto where = [&](const Status& s) {
      return Status::error(source + ":" + std::to_string(line) + ": " + s.message());
    };
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return where(Status::error("not valid JSON"));
    if (!have_header) {
      auto h = parse_header(j);
      if (!h) return where(h.status());
      f.header = std::move(*h);
      have_header = true;
      continue;
    }
    auto r = parse_request(j, f.header);
    if (!r) return where(r.status().with_context("request"));
    r->line = line;
    if (auto [it, fresh] = line_of_id.emplace(r->id, line); !fresh)
      return where(
          Status::error("request id " + std::to_string(r->id) + " already on line " + std::to_string(it->second)));
    f.requests.push_back(std::move(*r));
  }
  if (!have_header) return Status::error(source + ": empty (no header line)");
  return f;
}

Result<LogprobFile> load_logprob_jsonl(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return Status::error(path.string() + ": cannot open");
  return parse_logprob_jsonl(in, path.string());
}

std::string to_jsonl(const LogprobFile& f) {
  std::ostringstream out;
  json h = {{"schema", kSchemaName},
            {"version", kSchemaVersion},
            {"role", f.header.role},
            {"producer", f.header.producer},
            {"model", f.header.model}};
  if (!f.header.kv_dtype.empty()) h["model"]["kv_dtype"] = f.header.kv_dtype;
  if (f.header.top_k > 0) h["top_k"] = f.header.top_k;
  out << h.dump() << "\n";
  for (const ScoredRequest& r : f.requests) {
    json positions = json::array();
    for (const ScoredPosition& s : r.positions) {
      json p = {{"pos", s.pos}, {"token", s.token}, {"logprob", s.logprob}};
      if (!s.top.empty()) {
        json top = json::array();
        for (const TokenLogprob& t : s.top) top.push_back({t.token, t.logprob});
        p["top"] = std::move(top);
      }
      positions.push_back(std::move(p));
    }
    out << json{{"id", r.id},
                {"prompt", r.prompt},
                {"tokens", r.tokens},
                {"greedy", r.greedy},
                {"positions", std::move(positions)}}
               .dump()
        << "\n";
  }
  return out.str();
}

// ---- compare ----

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

const TokenLogprob* find_token(const std::vector<TokenLogprob>& top, int32_t token) {
  for (const TokenLogprob& t : top)
    if (t.token == token) return &t;
  return nullptr;
}

std::string where(const LogprobFile& f, const ScoredRequest& r) {
  return f.source + ":" + std::to_string(r.line) + ": request " + std::to_string(r.id);
}

// The golden score at each position, by pos (a golden file has every position).
const ScoredPosition& at(const ScoredRequest& golden, int64_t pos) {
  return golden.positions[static_cast<std::size_t>(pos - 1)];
}

void compare_request(const ScoredRequest& g, const ScoredRequest& c, double tol, RequestComparison& out) {
  const std::size_t common = std::min(g.tokens.size(), c.tokens.size());
  std::size_t d = g.prompt.size();
  while (d < common && g.tokens[d] == c.tokens[d]) ++d;
  if (d < common) out.token_divergence = static_cast<int64_t>(d);
  // Positions before d have the golden's context and token.
  for (const ScoredPosition& s : c.positions) {
    if (s.pos >= static_cast<int64_t>(d)) {
      ++out.positions_not_compared;
      continue;
    }
    ++out.positions_compared;
    const ScoredPosition& gs = at(g, s.pos);
    auto check = [&](int32_t token, double candidate, double golden) {
      const double diff = std::abs(candidate - golden);
      out.worst_diff = std::max(out.worst_diff, diff);
      if (diff > tol && !out.logprob_divergence) {
        out.logprob_divergence = s.pos;
        out.logprob_detail = "position " + std::to_string(s.pos) + " token " + std::to_string(token) +
                             ": candidate logprob " + num(candidate) + ", golden " + num(golden) + ", |diff| " +
                             num(diff) + " > tolerance " + num(tol);
      }
    };
    check(s.token, s.logprob, gs.logprob);
    for (const TokenLogprob& t : s.top)
      if (const TokenLogprob* gt = find_token(gs.top, t.token)) check(t.token, t.logprob, gt->logprob);
  }
  if (out.token_divergence) {
    const int64_t p = *out.token_divergence;
    const int32_t gt = g.tokens[static_cast<std::size_t>(p)], ct = c.tokens[static_cast<std::size_t>(p)];
    out.token_divergence_checked = g.greedy && c.greedy;
    const ScoredPosition& gs = at(g, p);
    const double best = gs.top.front().logprob;
    const TokenLogprob* alt = find_token(gs.top, ct);
    std::string why;
    if (alt != nullptr) {
      out.token_divergence_explained = best - alt->logprob <= tol;
      why = "golden logprob of the candidate's token " + num(alt->logprob) + ", best " + num(best) + ", margin " +
            num(best - alt->logprob) + (out.token_divergence_explained ? " <= " : " > ") + "tolerance " + num(tol);
    } else {
      why = "the candidate's token is not in the golden's top " + std::to_string(gs.top.size()) + " (best " +
            num(best) + ", k-th " + num(gs.top.back().logprob) + ")";
    }
    out.token_detail = "position " + std::to_string(p) + ": candidate token " + std::to_string(ct) + ", golden " +
                       std::to_string(gt) + "; " + why +
                       (!out.token_divergence_checked    ? " (not greedy in both: not checked)"
                        : out.token_divergence_explained ? " (explained: a near tie in the oracle)"
                                                         : "");
  }
  if (!out.token_divergence && g.tokens.size() != c.tokens.size())
    out.note = "lengths differ: candidate " + std::to_string(c.tokens.size()) + " tokens, golden " +
               std::to_string(g.tokens.size()) + " (the common prefix agrees)";
  if (out.positions_compared == 0) out.note += std::string(out.note.empty() ? "" : "; ") + "no position compared";
}

}  // namespace

bool RequestComparison::passed() const {
  return !logprob_divergence && !(token_divergence && token_divergence_checked && !token_divergence_explained);
}

int64_t CompareReport::positions_compared() const {
  int64_t n = 0;
  for (const RequestComparison& r : requests) n += r.positions_compared;
  return n;
}

bool CompareReport::passed() const {
  return positions_compared() > 0 &&
         std::all_of(requests.begin(), requests.end(), [](const RequestComparison& r) { return r.passed(); });
}

Result<CompareReport> compare_logprobs(const LogprobFile& golden, const LogprobFile& candidate, double tolerance) {
  if (golden.header.role != "golden")
    return Status::error(golden.source + ": role \"" + golden.header.role + "\", expected a golden file");
  if (!(tolerance >= 0)) return Status::error("tolerance: must be >= 0");
  std::map<int64_t, const ScoredRequest*> by_id;
  for (const ScoredRequest& c : candidate.requests) by_id[c.id] = &c;
  CompareReport report;
  report.golden_source = golden.source;
  report.candidate_source = candidate.source;
  report.model = golden.header.model;
  report.golden_kv_dtype = golden.header.kv_dtype;
  report.candidate_kv_dtype = candidate.header.kv_dtype;
  report.tolerance = tolerance;
  for (const ScoredRequest& g : golden.requests) {
    auto it = by_id.find(g.id);
    if (it == by_id.end()) return Status::error(where(golden, g) + ": missing from the candidate " + candidate.source);
    const ScoredRequest& c = *it->second;
    by_id.erase(it);
    if (c.prompt != g.prompt) {
      std::size_t i = 0;
      while (i < c.prompt.size() && i < g.prompt.size() && c.prompt[i] == g.prompt[i]) ++i;
      const auto token = [](const std::vector<int32_t>& p, std::size_t k) {
        return k < p.size() ? std::to_string(p[k]) : std::string("the end");
      };
      return Status::error(where(candidate, c) + ": prompt differs from the golden's (" + golden.source + ":" +
                           std::to_string(g.line) + ") at index " + std::to_string(i) + ": candidate " +
                           token(c.prompt, i) + ", golden " + token(g.prompt, i));
    }
    RequestComparison rc;
    rc.id = g.id;
    compare_request(g, c, tolerance, rc);
    report.requests.push_back(std::move(rc));
  }
  if (!by_id.empty())
    return Status::error(where(candidate, *by_id.begin()->second) + ": not in the golden file " + golden.source);
  return report;
}

std::string CompareReport::table() const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-10s %-9s %9s %12s  %s\n", "request", "result", "compared", "worst |diff|",
                "detail");
  out << line;
  for (const RequestComparison& r : requests) {
    std::string detail = r.logprob_detail;
    for (const std::string* more : {&r.token_detail, &r.note})
      if (!more->empty()) detail += (detail.empty() ? "" : "; ") + *more;
    const char* result = !r.passed() ? "FAIL" : r.token_divergence_explained ? "explained" : "PASS";
    std::snprintf(line, sizeof line, "%-10lld %-9s %9lld %12s  ", static_cast<long long>(r.id), result,
                  static_cast<long long>(r.positions_compared), num(r.worst_diff).c_str());
    out << line << detail << "\n";
  }
  if (positions_compared() == 0) out << "nothing compared: the candidate scores no position the golden shares\n";
  if (!golden_kv_dtype.empty() || !candidate_kv_dtype.empty())
    out << "KV dtype: golden " << (golden_kv_dtype.empty() ? "not recorded" : golden_kv_dtype) << ", candidate "
        << (candidate_kv_dtype.empty() ? "not recorded" : candidate_kv_dtype) << "\n";
  if (const std::string note = tolerance_note(); !note.empty()) out << "note: " << note << "\n";
  out << "tolerance " << num(tolerance) << ", " << positions_compared() << " positions compared\n";
  out << "verdict: " << (passed() ? "PASS" : "FAIL") << "\n";
  return out.str();
}

std::string CompareReport::tolerance_note() const {
  const bool rounds =
      candidate_kv_dtype == "f16" || candidate_kv_dtype == "bf16" || candidate_kv_dtype.starts_with("fp8");
  if (!rounds || tolerance > 1e-3) return "";
  return "the candidate's KV cache is " + candidate_kv_dtype + " and the tolerance " + num(tolerance) +
         " is sized for fp32 engines; every stored key and value is rounded to " + candidate_kv_dtype +
         ", so a divergence here may be that rounding: measure the engine and set --tolerance (docs/golden.md)";
}

nlohmann::json CompareReport::to_json() const {
  json j = {{"passed", passed()},
            {"golden", golden_source},
            {"candidate", candidate_source},
            {"model", model},
            {"tolerance", tolerance},
            {"positions_compared", positions_compared()},
            {"golden_kv_dtype", golden_kv_dtype.empty() ? json(nullptr) : json(golden_kv_dtype)},
            {"candidate_kv_dtype", candidate_kv_dtype.empty() ? json(nullptr) : json(candidate_kv_dtype)},
            {"tolerance_note", tolerance_note().empty() ? json(nullptr) : json(tolerance_note())},
            {"requests", json::array()}};
  for (const RequestComparison& r : requests) {
    json e = {{"id", r.id},
              {"passed", r.passed()},
              {"positions_compared", r.positions_compared},
              {"positions_not_compared", r.positions_not_compared},
              {"worst_diff", r.worst_diff},
              {"logprob_divergence", r.logprob_divergence ? json(*r.logprob_divergence) : json()},
              {"logprob_detail", r.logprob_detail},
              {"token_divergence", r.token_divergence ? json(*r.token_divergence) : json()},
              {"token_divergence_checked", r.token_divergence_checked},
              {"token_divergence_explained", r.token_divergence_explained},
              {"token_detail", r.token_detail},
              {"note", r.note}};
    j["requests"].push_back(std::move(e));
  }
  return j;
}

std::string CompareReport::to_junit() const {
  std::vector<verify::JUnitCase> cases;
  cases.push_back({"something-compared",
                   positions_compared() == 0 ? std::optional<std::string>("no position compared") : std::nullopt, ""});
  for (const RequestComparison& r : requests) {
    std::string detail = r.logprob_detail.empty() ? r.token_detail : r.logprob_detail;
    cases.push_back({"request " + std::to_string(r.id), r.passed() ? std::nullopt : std::optional<std::string>(detail),
                     std::to_string(r.positions_compared) + " positions compared, worst |diff| " + num(r.worst_diff) +
                         (r.token_detail.empty() ? "" : "; " + r.token_detail)});
  }
  return verify::junit_xml("kvproof.compare", cases);
}

}  // namespace kvp::golden
