#include "simulate/traffic.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <numbers>

#include <nlohmann/json.hpp>

#include "common/rng.h"

namespace kvp {

double Traffic::mean_rate() const {
  const double d = duration_s();
  return requests.size() >= 2 && d > 0 ? static_cast<double>(requests.size() - 1) / d : 0;
}

namespace {

std::string where(const std::string& source, int64_t line) { return source + ":" + std::to_string(line) + ": "; }

Status field_error(const std::string& source, int64_t line, const std::string& field, const std::string& reason) {
  return Status::error(where(source, line) + "field " + field + ": " + reason);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '"')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '"')) s.remove_suffix(1);
  return s;
}

bool parse_int(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_double(std::string_view s, double& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && std::isfinite(out);
}

// Days since 1970-01-01 of a proleptic Gregorian date (era arithmetic: 400-year cycles of
// 146097 days, years starting in March so the leap day is last).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// "YYYY-MM-DD HH:MM:SS[.fraction]" (or "T" between date and time) or plain seconds.
bool parse_timestamp(std::string_view s, double& out) {
  if (s.find('-') == std::string_view::npos || s.size() < 19) return parse_double(s, out);
  int64_t y, mo, d, h, mi;
  if (s[4] != '-' || s[7] != '-' || (s[10] != ' ' && s[10] != 'T') || s[13] != ':' || s[16] != ':') return false;
  if (!parse_int(s.substr(0, 4), y) || !parse_int(s.substr(5, 2), mo) || !parse_int(s.substr(8, 2), d) ||
      !parse_int(s.substr(11, 2), h) || !parse_int(s.substr(14, 2), mi))
    return false;
  double sec;
  if (!parse_double(s.substr(17), sec)) return false;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 || sec >= 61)
    return false;
  out = static_cast<double>(days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60) + sec;
  return true;
}

Status check_lengths(const std::string& source, int64_t line, const char* prompt_field, const char* output_field,
                     TrafficRequest& r) {
  if (r.prompt_tokens < 1)
    return field_error(source, line, prompt_field, "must be >= 1, got " + std::to_string(r.prompt_tokens));
  if (r.output_tokens < 0)
    return field_error(source, line, output_field, "must be >= 0, got " + std::to_string(r.output_tokens));
  if (r.prompt_tokens > (int64_t{1} << 30)) return field_error(source, line, prompt_field, "too large");
  if (r.output_tokens > (int64_t{1} << 30)) return field_error(source, line, output_field, "too large");
  r.output_tokens = std::max<int64_t>(r.output_tokens, 1);
  return Status::ok();
}

void finish_traffic(Traffic& t) {
  std::stable_sort(t.requests.begin(), t.requests.end(),
                   [](const TrafficRequest& a, const TrafficRequest& b) { return a.arrival_s < b.arrival_s; });
  if (t.requests.empty()) return;
  const double t0 = t.requests.front().arrival_s;
  for (TrafficRequest& r : t.requests) r.arrival_s -= t0;
}

}  // namespace

Result<Traffic> parse_azure_csv(std::istream& in, const std::string& source) {
  Traffic t;
  t.name = source;
  std::string line;
  int64_t lineno = 0;
  int col_ts = -1, col_ctx = -1, col_gen = -1;
  int num_cols = 0;
  std::vector<std::string_view> cols;
  while (std::getline(in, line)) {
    ++lineno;
    if (trim(line).empty()) continue;
    cols.clear();
    std::string_view rest(line);
    while (true) {
      const std::size_t comma = rest.find(',');
      cols.push_back(trim(rest.substr(0, comma)));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    if (num_cols == 0) {
      num_cols = static_cast<int>(cols.size());
      for (int i = 0; i < num_cols; ++i) {
        if (cols[static_cast<std::size_t>(i)] == "TIMESTAMP") col_ts = i;
        if (cols[static_cast<std::size_t>(i)] == "ContextTokens") col_ctx = i;
        if (cols[static_cast<std::size_t>(i)] == "GeneratedTokens") col_gen = i;
      }
      if (col_ts < 0) return field_error(source, lineno, "TIMESTAMP", "missing from the header");
      if (col_ctx < 0) return field_error(source, lineno, "ContextTokens", "missing from the header");
      if (col_gen < 0) return field_error(source, lineno, "GeneratedTokens", "missing from the header");
      continue;
    }
    if (static_cast<int>(cols.size()) != num_cols)
      return Status::error(where(source, lineno) + "expected " + std::to_string(num_cols) + " fields, got " +
                           std::to_string(cols.size()));
    TrafficRequest r;
    const std::string_view ts = cols[static_cast<std::size_t>(col_ts)];
    const std::string_view ctx = cols[static_cast<std::size_t>(col_ctx)];
    const std::string_view gen = cols[static_cast<std::size_t>(col_gen)];
    if (!parse_timestamp(ts, r.arrival_s))
      return field_error(source, lineno, "TIMESTAMP",
                         "not a time (YYYY-MM-DD HH:MM:SS[.f] or seconds): '" + std::string(ts) + "'");
    if (!parse_int(ctx, r.prompt_tokens))
      return field_error(source, lineno, "ContextTokens", "not an integer: '" + std::string(ctx) + "'");
    if (!parse_int(gen, r.output_tokens))
      return field_error(source, lineno, "GeneratedTokens", "not an integer: '" + std::string(gen) + "'");
    KVP_RETURN_IF_ERROR(check_lengths(source, lineno, "ContextTokens", "GeneratedTokens", r));
    t.requests.push_back(r);
  }
  if (num_cols == 0)
    return Status::error(source + ": empty (expected a header TIMESTAMP,ContextTokens,GeneratedTokens)");
  finish_traffic(t);
  return t;
}

Result<Traffic> parse_traffic_jsonl(std::istream& in, const std::string& source) {
  Traffic t;
  t.name = source;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (trim(line).empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Status::error(where(source, lineno) + "not a JSON object");
    if (!j.is_object()) return Status::error(where(source, lineno) + "not a JSON object");
    TrafficRequest r;
    auto get_int = [&](const char* key, bool required, int64_t& out) -> Status {
      auto it = j.find(key);
      if (it == j.end()) return required ? field_error(source, lineno, key, "missing") : Status::ok();
      if (!it->is_number_integer()) return field_error(source, lineno, key, "not an integer: " + it->dump());
      out = it->get<int64_t>();
      return Status::ok();
    };
    auto arrival = j.find("arrival_s");
    if (arrival == j.end()) return field_error(source, lineno, "arrival_s", "missing");
    if (!arrival->is_number() || !std::isfinite(arrival->get<double>()))
      return field_error(source, lineno, "arrival_s", "not a finite number: " + arrival->dump());
    r.arrival_s = arrival->get<double>();
    KVP_RETURN_IF_ERROR(get_int("prompt_tokens", true, r.prompt_tokens));
    KVP_RETURN_IF_ERROR(get_int("output_tokens", true, r.output_tokens));
    KVP_RETURN_IF_ERROR(get_int("tenant", false, r.tenant));
    KVP_RETURN_IF_ERROR(get_int("shared_prefix_tokens", false, r.shared_prefix_tokens));
    KVP_RETURN_IF_ERROR(check_lengths(source, lineno, "prompt_tokens", "output_tokens", r));
    if (r.tenant < 0 || r.tenant > (int64_t{1} << 30))
      return field_error(source, lineno, "tenant", "must be in [0, 2^30], got " + std::to_string(r.tenant));
    if (r.shared_prefix_tokens < 0 || r.shared_prefix_tokens > r.prompt_tokens)
      return field_error(source, lineno, "shared_prefix_tokens",
                         "must be in [0, prompt_tokens], got " + std::to_string(r.shared_prefix_tokens));
    t.requests.push_back(r);
  }
  finish_traffic(t);
  return t;
}

Result<Traffic> load_traffic(const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  if (ext != ".csv" && ext != ".jsonl" && ext != ".json")
    return Status::error(path.string() + ": unknown trace format '" + ext + "' (expected .csv or .jsonl)");
  std::ifstream in(path);
  if (!in) return Status::error(path.string() + ": cannot open");
  auto t = ext == ".csv" ? parse_azure_csv(in, path.string()) : parse_traffic_jsonl(in, path.string());
  if (t) t->name = path.filename().string();
  return t;
}

Status SyntheticTrafficSpec::validate() const {
  auto bad = [](double v) { return !std::isfinite(v) || v <= 0; };
  if (bad(rate)) return Status::error("rate must be > 0");
  if (arrivals == ArrivalProcess::kGamma && bad(burstiness_cv)) return Status::error("burstiness_cv must be > 0");
  if (num_requests < 0) return Status::error("num_requests must be >= 0");
  for (const auto& [what, l] : {std::pair<const char*, const LengthSpec&>{"prompt", prompt}, {"output", output}}) {
    if (bad(l.mean)) return Status::error(std::string(what) + ".mean must be > 0");
    if (!std::isfinite(l.sigma) || l.sigma < 0) return Status::error(std::string(what) + ".sigma must be >= 0");
    if (l.min < 1 || l.max < l.min) return Status::error(std::string(what) + ": need 1 <= min <= max");
  }
  if (system_prompt_tokens < 0) return Status::error("system_prompt_tokens must be >= 0");
  if (num_tenants < 1) return Status::error("num_tenants must be >= 1");
  return Status::ok();
}

namespace {

double normal(Rng& rng) {
  // Box-Muller; 1 - u keeps the log argument in (0, 1].
  const double u = 1.0 - rng.uniform();
  const double v = rng.uniform();
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
}

// Gamma(shape, 1): Marsaglia and Tsang (2000); shape < 1 boosted by U^(1/shape).
double gamma(Rng& rng, double shape) {
  if (shape < 1) return gamma(rng, shape + 1) * std::pow(1.0 - rng.uniform(), 1.0 / shape);
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    double x, v;
    do {
      x = normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1.0 - rng.uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}

int64_t draw_length(Rng& rng, const LengthSpec& l) {
  double x = l.mean;
  if (l.dist == LengthDistribution::kLognormal && l.sigma > 0) {
    const double mu = std::log(l.mean) - 0.5 * l.sigma * l.sigma;
    x = std::exp(mu + l.sigma * normal(rng));
  }
  return std::clamp<int64_t>(std::llround(x), l.min, l.max);
}

}  // namespace

Traffic generate_traffic(const SyntheticTrafficSpec& spec) {
  KVP_CHECK(spec.validate().is_ok());
  Traffic t;
  t.name = spec.name;
  Rng arrivals(mix_seed(spec.seed, 1));
  Rng lengths(mix_seed(spec.seed, 2));
  double now = 0;
  for (int64_t i = 0; i < spec.num_requests; ++i) {
    TrafficRequest r;
    r.arrival_s = now;
    r.tenant = i % spec.num_tenants;
    r.shared_prefix_tokens = spec.system_prompt_tokens;
    r.prompt_tokens = spec.system_prompt_tokens + draw_length(lengths, spec.prompt);
    r.output_tokens = draw_length(lengths, spec.output);
    t.requests.push_back(r);
    if (spec.arrivals == ArrivalProcess::kPoisson) {
      now += -std::log(1.0 - arrivals.uniform()) / spec.rate;
    } else {
      const double shape = 1.0 / (spec.burstiness_cv * spec.burstiness_cv);
      now += gamma(arrivals, shape) / (shape * spec.rate);
    }
  }
  return t;
}

std::vector<std::string> builtin_traffic_names() { return {"chat", "long-docs", "shared-prefix", "bursty", "max-len"}; }

Result<SyntheticTrafficSpec> builtin_traffic(const std::string& name, double rate, int64_t num_requests,
                                             int64_t max_len, uint64_t seed) {
  SyntheticTrafficSpec s;
  s.name = name;
  s.seed = seed;
  s.prompt = {LengthDistribution::kLognormal, 1000, 0.8, 8, 8192};
  s.output = {LengthDistribution::kLognormal, 200, 0.8, 1, 2048};
  s.rate = 4;
  if (name == "chat") {
  } else if (name == "long-docs") {
    s.prompt = {LengthDistribution::kLognormal, 3000, 0.5, 256, 16384};
    s.output = {LengthDistribution::kLognormal, 100, 0.6, 1, 1024};
    s.rate = 1;
  } else if (name == "shared-prefix") {
    s.system_prompt_tokens = 512;
    s.num_tenants = 4;
  } else if (name == "bursty") {
    s.arrivals = ArrivalProcess::kGamma;
    s.burstiness_cv = 3;
  } else if (name == "max-len") {
    if (max_len < 2) return Status::error("shape max-len needs max_len >= 2");
    s.prompt = {LengthDistribution::kFixed, static_cast<double>(max_len / 2), 0, max_len / 2, max_len / 2};
    s.output = {LengthDistribution::kFixed, static_cast<double>(max_len - max_len / 2), 0, max_len - max_len / 2,
                max_len - max_len / 2};
    s.rate = 1;
  } else {
    std::string known;
    for (const std::string& n : builtin_traffic_names()) known += (known.empty() ? "" : ", ") + n;
    return Status::error("unknown traffic shape '" + name + "' (known: " + known + ")");
  }
  if (rate > 0) s.rate = rate;
  if (num_requests > 0) s.num_requests = num_requests;
  KVP_RETURN_IF_ERROR(s.validate());
  return s;
}

void reshape_traffic(Traffic& t, double speed, double rate, double max_duration_s, int64_t max_requests) {
  KVP_CHECK(speed > 0 && rate >= 0);
  finish_traffic(t);
  for (TrafficRequest& r : t.requests) r.arrival_s /= speed;
  if (rate > 0 && t.mean_rate() > 0) {
    const double f = t.mean_rate() / rate;
    for (TrafficRequest& r : t.requests) r.arrival_s *= f;
  }
  if (max_duration_s > 0) {
    auto end = std::find_if(t.requests.begin(), t.requests.end(),
                            [&](const TrafficRequest& r) { return r.arrival_s >= max_duration_s; });
    t.requests.erase(end, t.requests.end());
  }
  if (max_requests > 0 && static_cast<int64_t>(t.requests.size()) > max_requests)
    t.requests.resize(static_cast<std::size_t>(max_requests));
}

}  // namespace kvp
