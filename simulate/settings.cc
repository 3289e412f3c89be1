// simulate's settings: allocation policies by name, one --sweep key=value applied to the
// options, the sweep's combinations, and the percentile summary of a sample.
#include <algorithm>
#include <cmath>
#include <string>

#include "simulate/simulate.h"

namespace kvp::sim {

const char* to_string(AllocationPolicy p) {
  switch (p) {
    case AllocationPolicy::kPaged: return "paged";
    case AllocationPolicy::kContiguousMax: return "contiguous-max";
    case AllocationPolicy::kContiguousPow2: return "contiguous-pow2";
    case AllocationPolicy::kContiguousOracle: return "contiguous-oracle";
  }
  return "?";
}

Result<AllocationPolicy> parse_policy(const std::string& s) {
  for (AllocationPolicy p : {AllocationPolicy::kPaged, AllocationPolicy::kContiguousMax,
                             AllocationPolicy::kContiguousPow2, AllocationPolicy::kContiguousOracle})
    if (s == to_string(p)) return p;
  return Status::error("unknown policy '" + s + "' (known: paged, contiguous-max, contiguous-pow2, contiguous-oracle)");
}

const char* to_string(AdmissionRule a) { return a == AdmissionRule::kOptimistic ? "optimistic" : "conservative"; }
const char* to_string(PreemptionMode m) { return m == PreemptionMode::kRecompute ? "recompute" : "swap"; }

namespace {

Result<int64_t> to_int(const std::string& key, const std::string& v, int64_t lo, int64_t hi) {
  std::size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || v.empty() || x < lo || x > hi)
    return Status::error(key + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "], got '" + v + "'");
  return static_cast<int64_t>(x);
}

Result<double> to_double(const std::string& key, const std::string& v, double lo, double hi) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || v.empty() || !std::isfinite(x) || x < lo || x > hi)
    return Status::error(key + ": expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "], got '" + v + "'");
  return x;
}

}  // namespace

Status apply_setting(SimOptions& o, const std::string& key, const std::string& value) {
  if (key == "block-size") {
    auto v = to_int(key, value, 1, 4096);
    if (!v) return v.status();
    o.block_size = static_cast<int32_t>(*v);
  } else if (key == "admission") {
    if (value == "optimistic")
      o.admission = AdmissionRule::kOptimistic;
    else if (value == "conservative")
      o.admission = AdmissionRule::kConservative;
    else
      return Status::error("admission: expected optimistic or conservative, got '" + value + "'");
  } else if (key == "preemption") {
    if (value == "recompute")
      o.preemption = PreemptionMode::kRecompute;
    else if (value == "swap")
      o.preemption = PreemptionMode::kSwap;
    else
      return Status::error("preemption: expected recompute or swap, got '" + value + "'");
  } else if (key == "max-model-len" || key == "max-context") {
    auto v = to_int(key, value, 0, int64_t{1} << 24);
    if (!v) return v.status();
    o.max_model_len = *v;
  } else if (key == "rate") {
    auto v = to_double(key, value, 0, 1e6);
    if (!v) return v.status();
    o.rate = *v;
  } else if (key == "policy") {
    auto p = parse_policy(value);
    if (!p) return p.status();
    o.policy = *p;
  } else if (key == "prefix-sharing") {
    if (value == "on" || value == "true" || value == "1")
      o.prefix_sharing = true;
    else if (value == "off" || value == "false" || value == "0")
      o.prefix_sharing = false;
    else
      return Status::error("prefix-sharing: expected on or off, got '" + value + "'");
  } else if (key == "sliding-window") {
    if (value == "model" || value == "on")
      o.sliding_window = true;
    else if (value == "off")
      o.sliding_window = false;
    else
      return Status::error("sliding-window: expected model (the model's window releases blocks) or off, got '" + value +
                           "'");
  } else if (key == "max-num-seqs") {
    auto v = to_int(key, value, 1, 1 << 20);
    if (!v) return v.status();
    o.max_num_seqs = static_cast<int32_t>(*v);
  } else if (key == "n") {
    auto v = to_int(key, value, 1, 1 << 20);
    if (!v) return v.status();
    o.n = static_cast<int32_t>(*v);
  } else if (key == "gpu-memory-utilization") {
    auto v = to_double(key, value, 1e-6, 1);
    if (!v) return v.status();
    o.gpu_memory_utilization = *v;
  } else if (key == "gpu") {
    auto g = find_gpu_preset(value);
    if (!g) return g.status();
    o.gpu = g->name;
  } else if (key == "kv-dtype") {
    const std::optional<DType> d = dtype_from_flag(value);
    if (!d || *d == DType::kF64)
      return Status::error("kv-dtype: expected f32, f16, bf16, fp8-e4m3 or fp8-e5m2, got '" + value + "'");
    o.kv_dtype = *d;
  } else if (key == "model") {
    auto m = find_model_preset(value);
    if (!m) return m.status();
    o.model = m->name;
  } else {
    return Status::error(
        "unknown setting '" + key +
        "' (known: block-size, admission, preemption, max-model-len, max-context, rate, policy, "
        "prefix-sharing, sliding-window, max-num-seqs, n, gpu-memory-utilization, gpu, model, kv-dtype)");
  }
  return Status::ok();
}

Stat summarize(std::vector<double> samples) {
  Stat s;
  s.count = static_cast<int64_t>(samples.size());
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  double sum = 0;
  for (double x : samples) sum += x;
  s.mean = sum / static_cast<double>(samples.size());
  auto rank = [&](double q) {  // nearest rank
    const auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
    return samples[std::min(samples.size() - 1, k == 0 ? 0 : k - 1)];
  };
  s.p50 = rank(0.5);
  s.p90 = rank(0.9);
  s.p99 = rank(0.99);
  return s;
}

Result<std::vector<SweepPoint>> expand_sweep(const SimOptions& base, const std::vector<std::string>& axes) {
  std::vector<SweepPoint> points = {{base, ""}};
  for (const std::string& axis : axes) {
    const std::size_t eq = axis.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == axis.size())
      return Status::error("--sweep '" + axis + "': expected key=v1,v2,...");
    const std::string key = axis.substr(0, eq);
    std::vector<std::string> values;
    std::string rest = axis.substr(eq + 1);
    for (std::size_t start = 0;;) {
      const std::size_t comma = rest.find(',', start);
      values.push_back(rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    std::vector<SweepPoint> next;
    for (const SweepPoint& p : points) {
      for (const std::string& v : values) {
        SweepPoint q = p;
        Status s = apply_setting(q.options, key, v);
        if (!s) return s.with_context("--sweep");
        q.label += (q.label.empty() ? "" : " ") + key + "=" + v;
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  return points;
}

}  // namespace kvp::sim
