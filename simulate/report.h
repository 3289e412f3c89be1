// Reports of kvproof simulate: a text table (one row per run), CSV (the same columns) and
// JSON (everything, with the timeline and per-request latencies, for
// scripts/plot_simulation.py).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/html_report.h"
#include "simulate/simulate.h"

namespace kvp::sim {

struct SimRun {
  std::string label;  // the sweep's "key=v ..." (empty for a single run)
  SimReport report;
};

nlohmann::json to_json(const SimReport& r);
// {"runs": [{"label": ..., <to_json(report)>}, ...]}
nlohmann::json to_json(const std::vector<SimRun>& runs);
std::string to_csv(const std::vector<SimRun>& runs);
std::string format_table(const std::vector<SimRun>& runs);
// The pool and speed lines printed above the table.
std::string format_header(const SimReport& r);
// The HTML report's plots (--html): KV memory in use and the queues over simulated time, one
// line per run, and the TTFT distribution (the runs' own view; scripts/plot_simulation.py
// draws more from the JSON).
std::vector<verify::Plot> plots(const std::vector<SimRun>& runs);

}  // namespace kvp::sim
