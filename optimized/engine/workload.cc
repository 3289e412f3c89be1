#include "optimized/engine/workload.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/rng.h"

namespace kvp {

namespace {

using json = nlohmann::json;

constexpr int64_t kMaxLen = 1 << 20;

uint64_t name_seed(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return t;
}

Result<int64_t> int_field(const json& r, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  auto it = r.find(key);
  if (it == r.end()) return fallback;
  if (!it->is_number_integer()) return Status::error(std::string(key) + ": must be an integer, got " + it->dump());
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi))
    return Status::error(std::string(key) + ": " + it->dump() + " is out of range [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]");
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return Status::error(std::string(key) + ": " + std::to_string(v) + " is out of range [" + std::to_string(lo) +
                         ", " + std::to_string(hi) + "]");
  return v;
}

Result<double> number_field(const json& r, const char* key, double fallback) {
  auto it = r.find(key);
  if (it == r.end()) return fallback;
  if (!it->is_number()) return Status::error(std::string(key) + ": must be a number, got " + it->dump());
  return it->get<double>();
}

// The prompt: an explicit token list or a length of seeded random tokens, after the shared
// prefix of its group when one is named.
Result<std::vector<int32_t>> parse_prompt(const json& r, int64_t vocab, uint64_t seed, int64_t index) {
  const bool has_prompt = r.contains("prompt"), has_len = r.contains("prompt_len");
  if (has_prompt == has_len) return Status::error("exactly one of 'prompt' and 'prompt_len' is required");
  std::vector<int32_t> prompt;
  if (auto sp = r.find("shared_prefix"); sp != r.end()) {
    if (!sp->is_object() || !sp->contains("group") || !(*sp)["group"].is_string())
      return Status::error("shared_prefix: must be {\"group\": string, \"len\": integer}");
    auto len = int_field(*sp, "len", -1, 1, kMaxLen);
    if (!len) return len.status().with_context("shared_prefix");
    if (*len < 1) return Status::error("shared_prefix.len: required");
    prompt = random_tokens(*len, vocab, mix_seed(seed, name_seed((*sp)["group"].get<std::string>())));
  }
  if (has_prompt) {
    const json& p = r["prompt"];
    if (!p.is_array()) return Status::error("prompt: must be an array of token ids");
    for (const auto& t : p) {
      if (!t.is_number_integer()) return Status::error("prompt: token " + t.dump() + " is not an integer");
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v >= vocab)
        return Status::error("prompt: token " + std::to_string(v) + " is outside the vocabulary [0, " +
                             std::to_string(vocab) + ")");
      prompt.push_back(static_cast<int32_t>(v));
    }
    return prompt;
  }
  auto len = int_field(r, "prompt_len", 0, 1, kMaxLen);
  if (!len) return len.status();
  const int64_t extra = std::max<int64_t>(0, *len - static_cast<int64_t>(prompt.size()));
  auto rest = random_tokens(extra, vocab, mix_seed(seed, 1000003u + static_cast<uint64_t>(index)));
  prompt.insert(prompt.end(), rest.begin(), rest.end());
  return prompt;
}

Result<SamplingParams> parse_sampling(const json& r, int64_t index) {
  auto temperature = number_field(r, "temperature", 0.0);
  if (!temperature) return temperature.status();
  auto top_p = number_field(r, "top_p", 1.0);
  if (!top_p) return top_p.status();
  auto top_k = int_field(r, "top_k", 0, 0, 1 << 30);
  if (!top_k) return top_k.status();
  auto s = int_field(r, "seed", index, 0, INT64_MAX);
  if (!s) return s.status();
  const SamplingParams sampling{static_cast<float>(*temperature), static_cast<int32_t>(*top_k),
                                static_cast<float>(*top_p), static_cast<uint64_t>(*s)};
  KVP_RETURN_IF_ERROR(sampling.validate());
  return sampling;
}

// "speculate" (off, ngram, draft; ngram when only "k" is given) and "k".
Result<SpeculationParams> parse_speculation(const json& r) {
  SpeculationParams sp;
  if (auto it = r.find("speculate"); it != r.end()) {
    const std::string kind = it->is_string() ? it->get<std::string>() : "";
    if (kind == "off")
      sp.proposer = ProposerKind::kOff;
    else if (kind == "ngram")
      sp.proposer = ProposerKind::kNgram;
    else if (kind == "draft")
      sp.proposer = ProposerKind::kDraft;
    else
      return Status::error("speculate: must be \"off\", \"ngram\" or \"draft\"");
  } else {
    sp.proposer = ProposerKind::kNgram;
  }
  auto k = int_field(r, "k", 4, 0, 64);
  if (!k) return k.status();
  sp.k = static_cast<int32_t>(*k);
  return sp;
}

Result<WorkloadRequest> parse_request(const json& r, int64_t vocab, uint64_t seed, int64_t index) {
  if (!r.is_object()) return Status::error("must be an object");
  static const std::set<std::string> known = {
      "prompt", "prompt_len", "shared_prefix", "max_tokens",  "temperature", "top_k",     "top_p", "seed",
      "tenant", "stop_token", "arrival_step",  "cancel_step", "n",           "speculate", "k"};
  for (auto it = r.begin(); it != r.end(); ++it)
    if (!known.count(it.key())) return Status::error("unknown field '" + it.key() + "'");
  WorkloadRequest w;
  auto prompt = parse_prompt(r, vocab, seed, index);
  if (!prompt) return prompt.status();
  w.spec.prompt = std::move(*prompt);
  auto max_tokens = int_field(r, "max_tokens", 16, 1, kMaxLen);
  if (!max_tokens) return max_tokens.status();
  w.spec.max_tokens = *max_tokens;
  auto sampling = parse_sampling(r, index);
  if (!sampling) return sampling.status();
  w.spec.sampling = *sampling;
  auto tenant = int_field(r, "tenant", 0, 0, INT32_MAX);
  if (!tenant) return tenant.status();
  w.spec.tenant = *tenant;
  if (r.contains("stop_token")) {
    auto stop = int_field(r, "stop_token", 0, 0, vocab - 1);
    if (!stop) return stop.status();
    w.spec.stop_tokens = {static_cast<int32_t>(*stop)};
  }
  auto n = int_field(r, "n", 1, 1, 64);
  if (!n) return n.status();
  w.spec.n = static_cast<int32_t>(*n);
  if (r.contains("speculate") || r.contains("k")) {
    auto sp = parse_speculation(r);
    if (!sp) return sp.status();
    w.spec.speculation = *sp;
  }
  auto arrival = int_field(r, "arrival_step", 0, 0, kMaxLen);
  if (!arrival) return arrival.status();
  w.arrival_step = *arrival;
  if (r.contains("cancel_step")) {
    auto cancel = int_field(r, "cancel_step", 0, 0, kMaxLen);
    if (!cancel) return cancel.status();
    w.cancel_step = *cancel;
  }
  return w;
}

}  // namespace

Result<Workload> parse_workload(const json& j, int64_t vocab_size, uint64_t seed) {
  if (!j.is_object()) return Status::error("workload must be a JSON object with a 'requests' array");
  auto it = j.find("requests");
  if (it == j.end() || !it->is_array()) return Status::error("'requests' must be an array");
  if (it->empty()) return Status::error("'requests' is empty");
  if (it->size() > 100000) return Status::error("'requests' has more than 100000 entries");
  Workload w;
  w.name = j.value("name", std::string("workload"));
  for (std::size_t i = 0; i < it->size(); ++i) {
    auto r = parse_request((*it)[i], vocab_size, seed, static_cast<int64_t>(i));
    if (!r) return r.status().with_context("requests[" + std::to_string(i) + "]");
    w.requests.push_back(std::move(*r));
  }
  return w;
}

Result<Workload> load_workload(const std::filesystem::path& path, int64_t vocab_size, uint64_t seed) {
  std::ifstream in(path);
  if (!in) return Status::error(path.string() + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(path.string() + ": not valid JSON");
  auto w = parse_workload(j, vocab_size, seed);
  if (!w) return w.status().with_context(path.string());
  return w;
}

std::vector<std::string> builtin_workload_names() {
  return {"short-chat", "long-docs", "many-users", "shared-prefix", "mixed", "multi-tenant"};
}

Result<Workload> builtin_workload(const std::string& name, int64_t vocab, uint64_t seed) {
  Rng rng(mix_seed(seed, name_seed(name)));
  json reqs = json::array();
  auto between = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
  };
  if (name == "short-chat") {
    for (int i = 0; i < 12; ++i)
      reqs.push_back({{"prompt_len", between(4, 24)}, {"max_tokens", between(4, 16)}, {"arrival_step", i / 2}});
  } else if (name == "long-docs") {
    for (int i = 0; i < 4; ++i)
      reqs.push_back({{"prompt_len", between(120, 200)}, {"max_tokens", between(4, 8)}, {"arrival_step", i * 3}});
    for (int i = 0; i < 4; ++i)
      reqs.push_back({{"prompt_len", between(4, 12)}, {"max_tokens", 12}, {"arrival_step", i}});
  } else if (name == "many-users") {
    for (int i = 0; i < 24; ++i)
      reqs.push_back(
          {{"prompt_len", between(8, 40)}, {"max_tokens", between(8, 24)}, {"arrival_step", 0}, {"tenant", i % 3}});
  } else if (name == "shared-prefix") {
    for (int i = 0; i < 10; ++i)
      reqs.push_back({{"prompt_len", between(40, 64)},
                      {"shared_prefix", {{"group", "system"}, {"len", 32}}},
                      {"max_tokens", between(4, 12)},
                      {"arrival_step", i},
                      {"tenant", i % 2}});
  } else if (name == "mixed") {
    for (int i = 0; i < 20; ++i) {
      json r = {{"max_tokens", between(6, 20)}, {"arrival_step", between(0, 12)}, {"tenant", i % 2}};
      const auto kind = i % 4;
      if (kind == 0) r["prompt_len"] = between(60, 120);  // long document
      if (kind == 1) r["prompt_len"] = between(4, 16);    // short chat
      if (kind >= 2) {
        r["prompt_len"] = between(36, 56);
        r["shared_prefix"] = {{"group", kind == 2 ? "system" : "tools"}, {"len", 32}};
      }
      if (i % 3 == 0) {
        r["temperature"] = 0.8;
        r["top_p"] = 0.9;
        r["seed"] = 100 + i;
      }
      if (i % 7 == 3) r["cancel_step"] = r["arrival_step"].get<int64_t>() + between(1, 8);
      if (i % 5 == 2) {
        // Parallel samples: forks share the prompt's blocks; copy-on-write on the first decode.
        r["n"] = 3;
        r["temperature"] = 0.9;
        r["seed"] = 200 + i;
      }
      reqs.push_back(r);
    }
  } else if (name == "multi-tenant") {
    // Three tenants. Every tenant sends the same public system prompt (identical tokens
    // across tenants: tenant-scoped sharing must still keep them apart) and its own private
    // prefix; some requests have no shared prefix at all.
    for (int i = 0; i < 18; ++i) {
      const int tenant = i % 3;
      json r = {{"max_tokens", between(4, 12)},
                {"arrival_step", between(0, 10)},
                {"tenant", tenant},
                {"prompt_len", between(40, 60)}};
      if (i % 6 < 3)
        r["shared_prefix"] = {{"group", "public-system"}, {"len", 32}};
      else if (i % 6 < 5)
        r["shared_prefix"] = {{"group", "private-" + std::to_string(tenant)}, {"len", 24}};
      if (i % 5 == 4) r["cancel_step"] = r["arrival_step"].get<int64_t>() + between(1, 6);
      reqs.push_back(r);
    }
  } else {
    std::string known;
    for (const auto& n : builtin_workload_names()) known += (known.empty() ? "" : ", ") + n;
    return Status::error("unknown workload shape '" + name + "' (known: " + known + ")");
  }
  auto w = parse_workload(json{{"name", name}, {"requests", reqs}}, vocab, seed);
  if (w) w->name = name;
  return w;
}

Result<WorkloadRun> run_workload(Engine& engine, const Workload& w, int64_t max_steps,
                                 const std::function<Status(Engine&)>& after_step) {
  WorkloadRun run;
  run.ids.assign(w.requests.size(), -1);
  std::multimap<int64_t, std::size_t> arrivals, cancels;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    arrivals.emplace(w.requests[i].arrival_step, i);
    if (w.requests[i].cancel_step) cancels.emplace(*w.requests[i].cancel_step, i);
  }
  for (int64_t s = 0;; ++s) {
    for (auto [a, b] = arrivals.equal_range(s); a != b; ++a)
      run.ids[a->second] = engine.add_request(w.requests[a->second].spec);
    for (auto [a, b] = cancels.equal_range(s); a != b; ++a)
      if (run.ids[a->second] >= 0) engine.cancel(run.ids[a->second]);
    const bool more_arrivals = arrivals.upper_bound(s) != arrivals.end();
    if (!engine.has_unfinished() && !more_arrivals) break;
    if (s >= max_steps) return Status::error("workload did not finish within " + std::to_string(max_steps) + " steps");
    KVP_RETURN_IF_ERROR(engine.step());
    ++run.steps;
    if (after_step) KVP_RETURN_IF_ERROR(after_step(engine));
  }
  return run;
}

}  // namespace kvp
