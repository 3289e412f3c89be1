#include "simulate/report.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace kvp::sim {

namespace {

nlohmann::json stat_json(const Stat& s) {
  return {{"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"count", s.count}};
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

struct Column {
  const char* name;
  std::string (*value)(const SimRun&);
};

// The columns of the table and the CSV, in order.
const std::vector<Column>& columns() {
  static const std::vector<Column> cols = {
      {"policy", [](const SimRun& r) { return r.report.policy; }},
      {"block", [](const SimRun& r) { return std::to_string(r.report.block_size); }},
      {"admission", [](const SimRun& r) { return r.report.admission; }},
      {"preempt_mode", [](const SimRun& r) { return r.report.preemption; }},
      {"max_len", [](const SimRun& r) { return std::to_string(r.report.max_model_len); }},
      {"sharing", [](const SimRun& r) { return std::string(r.report.prefix_sharing ? "on" : "off"); }},
      {"window",
       [](const SimRun& r) {
         return r.report.sliding_window > 0 ? std::to_string(r.report.sliding_window) : std::string("-");
       }},
      {"groups", [](const SimRun& r) { return std::to_string(r.report.num_kv_groups); }},
      {"rate", [](const SimRun& r) { return fmt("%.2f", r.report.rate); }},
      {"req/s", [](const SimRun& r) { return fmt("%.2f", r.report.requests_per_s); }},
      {"out_tok/s", [](const SimRun& r) { return fmt("%.0f", r.report.output_tokens_per_s); }},
      {"ttft_p50", [](const SimRun& r) { return fmt("%.3f", r.report.ttft_s.p50); }},
      {"ttft_p99", [](const SimRun& r) { return fmt("%.3f", r.report.ttft_s.p99); }},
      {"tpot_p50", [](const SimRun& r) { return fmt("%.4f", r.report.tpot_s.p50); }},
      {"tpot_p99", [](const SimRun& r) { return fmt("%.4f", r.report.tpot_s.p99); }},
      {"e2e_p50", [](const SimRun& r) { return fmt("%.2f", r.report.e2e_s.p50); }},
      {"queue_p99", [](const SimRun& r) { return fmt("%.2f", r.report.queue_s.p99); }},
      {"slo%", [](const SimRun& r) { return fmt("%.1f", 100 * r.report.slo_attainment); }},
      {"tokens%", [](const SimRun& r) { return fmt("%.1f", 100 * r.report.memory.token_states); }},
      {"reserved%", [](const SimRun& r) { return fmt("%.1f", 100 * r.report.memory.reserved); }},
      {"internal%", [](const SimRun& r) { return fmt("%.1f", 100 * r.report.memory.internal); }},
      {"external%", [](const SimRun& r) { return fmt("%.1f", 100 * r.report.memory.external); }},
      {"kv_in_use%", [](const SimRun& r) { return fmt("%.1f", 100 * r.report.memory.mean_in_use); }},
      {"preemptions", [](const SimRun& r) { return std::to_string(r.report.preemptions); }},
      {"swaps", [](const SimRun& r) { return std::to_string(r.report.swaps_out); }},
      {"rejected", [](const SimRun& r) { return std::to_string(r.report.rejected); }},
  };
  return cols;
}

}  // namespace

nlohmann::json to_json(const SimReport& r) {
  nlohmann::json timeline = nlohmann::json::array();
  for (const TimelinePoint& p : r.timeline)
    timeline.push_back({{"t_s", p.t_s},
                        {"waiting", p.waiting},
                        {"running", p.running},
                        {"swapped", p.swapped},
                        {"kv_in_use", p.kv_in_use},
                        {"kv_tokens", p.kv_tokens},
                        {"slots",
                         {{"token_states", p.memory.token_states},
                          {"reserved", p.memory.reserved},
                          {"internal_fragmentation", p.memory.internal},
                          {"external_fragmentation", p.memory.external}}}});
  return {
      {"settings",
       {{"traffic", r.traffic},
        {"model", r.model},
        {"gpu", r.gpu},
        {"kv_dtype", r.kv_dtype},
        {"policy", r.policy},
        {"admission", r.admission},
        {"preemption", r.preemption},
        {"block_size", r.block_size},
        {"max_model_len", r.max_model_len},
        {"prefix_sharing", r.prefix_sharing},
        {"sliding_window", r.sliding_window},
        {"kv_groups", r.kv_groups},
        {"num_kv_groups", r.num_kv_groups},
        {"rate", r.rate},
        {"ttft_slo_s", r.ttft_slo_s},
        {"tpot_slo_s", r.tpot_slo_s}}},
      {"pool",
       {{"kv_pool_bytes", r.kv_pool_bytes},
        {"kv_bytes_per_token", r.kv_bytes_per_token},
        {"kv_capacity_tokens", r.kv_capacity_tokens},
        {"kv_capacity_slots", r.kv_capacity_slots},
        {"num_device_blocks", r.num_device_blocks},
        {"num_host_blocks", r.num_host_blocks}}},
      {"requests", r.requests},
      {"finished", r.finished},
      {"rejected", r.rejected},
      {"preemptions", r.preemptions},
      {"swaps_out", r.swaps_out},
      {"swaps_in", r.swaps_in},
      {"prefix_hit_tokens", r.prefix_hit_tokens},
      {"steps", r.steps},
      {"token_steps", r.token_steps},
      {"compute_bound_steps", r.compute_bound_steps},
      {"duration_s", r.duration_s},
      {"requests_per_s", r.requests_per_s},
      {"output_tokens_per_s", r.output_tokens_per_s},
      {"total_tokens_per_s", r.total_tokens_per_s},
      {"ttft_s", stat_json(r.ttft_s)},
      {"tpot_s", stat_json(r.tpot_s)},
      {"e2e_s", stat_json(r.e2e_s)},
      {"queue_s", stat_json(r.queue_s)},
      {"slo_attainment", r.slo_attainment},
      {"ttft_attainment", r.ttft_attainment},
      {"tpot_attainment", r.tpot_attainment},
      {"memory",
       {{"token_states", r.memory.token_states},
        {"reserved", r.memory.reserved},
        {"internal_fragmentation", r.memory.internal},
        {"external_fragmentation", r.memory.external},
        {"mean_in_use", r.memory.mean_in_use},
        {"sampled_slots",
         {{"token_states", r.memory_slots.token_states},
          {"reserved", r.memory_slots.reserved},
          {"internal_fragmentation", r.memory_slots.internal},
          {"external_fragmentation", r.memory_slots.external}}}}},
      {"peak_waiting", r.peak_waiting},
      {"mean_running", r.mean_running},
      {"checked_steps", r.checked_steps},
      {"wall_s", r.wall_s},
      {"token_steps_per_s", r.token_steps_per_s()},
      {"timeline", timeline},
      {"ttft_samples", r.ttft_samples},
      {"tpot_samples", r.tpot_samples},
  };
}

nlohmann::json to_json(const std::vector<SimRun>& runs) {
  nlohmann::json arr = nlohmann::json::array();
  for (const SimRun& r : runs) {
    nlohmann::json j = to_json(r.report);
    j["label"] = r.label;
    arr.push_back(std::move(j));
  }
  return {{"runs", arr}};
}

std::string to_csv(const std::vector<SimRun>& runs) {
  std::string out = "label";
  for (const Column& c : columns()) out.append(1, ',').append(c.name);
  out += "\n";
  for (const SimRun& r : runs) {
    // Appends piece by piece: g++ 12 -O3 warns (-Wrestrict, a false positive) on "x" + str.
    out.append(1, '"').append(r.label).append(1, '"');
    for (const Column& c : columns()) out.append(1, ',').append(c.value(r));
    out += "\n";
  }
  return out;
}

std::string format_table(const std::vector<SimRun>& runs) {
  // Columns every run shares the value of are left out (the header says them).
  std::vector<const Column*> shown;
  for (const Column& c : columns()) {
    bool varies = runs.size() <= 1;
    for (const SimRun& r : runs) varies = varies || c.value(r) != c.value(runs.front());
    const std::string name = c.name;
    const bool always = name == "policy" || name == "block" || name == "admission";
    if (varies || always || name.find('%') != std::string::npos || name.find("_p") != std::string::npos ||
        name.find("/s") != std::string::npos || name == "preemptions" || name == "rejected")
      shown.push_back(&c);
  }
  std::vector<std::vector<std::string>> cells;
  std::vector<std::size_t> width;
  std::vector<std::string> head;
  for (const Column* c : shown) head.push_back(c->name);
  cells.push_back(head);
  for (const SimRun& r : runs) {
    std::vector<std::string> row;
    for (const Column* c : shown) row.push_back(c->value(r));
    cells.push_back(row);
  }
  width.assign(shown.size(), 0);
  for (const auto& row : cells)
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  std::string out;
  for (std::size_t k = 0; k < cells.size(); ++k) {
    out += "|";
    for (std::size_t i = 0; i < cells[k].size(); ++i) {
      out.append(1, ' ').append(cells[k][i]).append(width[i] - cells[k][i].size(), ' ').append(" |");
    }
    out += "\n";
    if (k == 0) {
      out += "|";
      for (std::size_t i = 0; i < width.size(); ++i) out += std::string(width[i] + 2, '-') + "|";
      out += "\n";
    }
  }
  return out;
}

std::string format_header(const SimReport& r) {
  char buf[1280];
  std::snprintf(buf, sizeof buf,
                "traffic %s: %lld requests at %.2f req/s; model %s on %s\n"
                "KV pool %.2f GB (GPU memory x utilization - weights - activation reserve), %s KV, %.0f KB per "
                "token, %lld token slots\n"
                "SLO: TTFT <= %.3f s and TPOT <= %.4f s\n",
                r.traffic.c_str(), static_cast<long long>(r.requests), r.rate, r.model.c_str(), r.gpu.c_str(),
                r.kv_pool_bytes / 1e9, r.kv_dtype.c_str(), r.kv_bytes_per_token / 1e3,
                static_cast<long long>(r.kv_capacity_tokens), r.ttft_slo_s, r.tpot_slo_s);
  std::string s = buf;
  // The first run's pool (a sweep's other runs may differ: their JSON has each).
  if (!r.kv_groups.empty())
    s += "KV-cache groups: " + r.kv_groups + "; " + std::to_string(r.num_device_blocks) + " blocks of " +
         std::to_string(r.block_size) + " positions of a group, " + std::to_string(r.kv_capacity_slots) +
         " slots (a group's positions)\n";
  return s;
}

std::vector<verify::Plot> plots(const std::vector<SimRun>& runs) {
  verify::Plot memory("line", "KV memory over time", "simulated time (s)", "share of the KV pool");
  verify::Plot queues("line", "Queues over time", "simulated time (s)", "requests");
  verify::Plot ttft("line", "Time to first token, distribution", "TTFT (s)", "share of finished requests");
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const SimReport& r = runs[k].report;
    const std::string name = runs[k].label.empty() ? r.policy + " B=" + std::to_string(r.block_size) : runs[k].label;
    verify::PlotSeries in_use(name + ": held"), tokens(name + ": token states");
    verify::PlotSeries waiting(name + ": waiting"), running(name + ": running");
    for (const TimelinePoint& p : r.timeline) {
      for (verify::PlotSeries* s : {&in_use, &tokens, &waiting, &running}) s->x.push_back(p.t_s);
      in_use.y.push_back(p.kv_in_use);
      tokens.y.push_back(p.kv_tokens);
      waiting.y.push_back(static_cast<double>(p.waiting));
      running.y.push_back(static_cast<double>(p.running));
    }
    memory.series.push_back(std::move(in_use));
    memory.series.push_back(std::move(tokens));
    queues.series.push_back(std::move(waiting));
    queues.series.push_back(std::move(running));
    std::vector<double> xs = r.ttft_samples;
    std::sort(xs.begin(), xs.end());
    verify::PlotSeries cdf(name);
    for (std::size_t i = 0; i < xs.size(); ++i) {
      cdf.x.push_back(xs[i]);
      cdf.y.push_back(static_cast<double>(i + 1) / static_cast<double>(xs.size()));
    }
    ttft.series.push_back(std::move(cdf));
  }
  memory.caption =
      "Held: the share of the KV pool allocated; token states: the share holding real tokens. The gap between them "
      "is the policy's waste (reservation and fragmentation); a held line pinned near 1 is a pool too small for the "
      "traffic.";
  queues.caption =
      "Requests waiting for admission and running. A waiting line that keeps growing is a deployment past its "
      "capacity; one that drains is a burst absorbed.";
  ttft.caption = "The TTFT of every finished request, sorted: the SLO attainment is where the SLO crosses each line.";
  return {memory, queues, ttft};
}

}  // namespace kvp::sim
