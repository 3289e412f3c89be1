// HTML reports (--html): one self-contained page per run, for people who would rather look
// than read a log, and for an audit file. The page is the job summary's content (summary.h:
// the verdict, the failed checks each with its reproducer, the table of every check, the
// notes) plus the report's plots, drawn by matplotlib (scripts/report_plots.py, compiled into
// the binary) as SVG and put inline. No script, no stylesheet or font from elsewhere: it opens
// offline and prints as it shows. Shared by verify, audit (both kinds), kernel-check, simulate.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/summary.h"

namespace kvp::verify {

struct PlotSeries {
  PlotSeries() = default;
  explicit PlotSeries(std::string n, std::vector<double> xs = {}, std::vector<double> ys = {})
      : name(std::move(n)), x(std::move(xs)), y(std::move(ys)) {}
  std::string name;
  std::vector<double> x;  // empty: 0, 1, 2, ... (bar: unused)
  std::vector<double> y;
};

struct PlotLine {
  double y = 0;
  std::string label;  // "tolerance"
};

struct Plot {
  Plot() = default;
  Plot(std::string k, std::string t, std::string xl, std::string yl, bool log_y = false)
      : title(std::move(t)), xlabel(std::move(xl)), ylabel(std::move(yl)), kind(std::move(k)), logy(log_y) {}
  std::string title, xlabel, ylabel;
  std::string kind = "line";            // line, scatter, bar (grouped over categories)
  bool logy = false;                    // values <= 0 are left out, and the plot says how many
  std::vector<std::string> categories;  // bar: one x label per value
  std::vector<PlotSeries> series;
  std::vector<PlotLine> hlines;
  std::string caption;  // under the plot: what it shows and what to look for
};

// The plots drawn as inline SVG, one per plot, or none and why not.
struct Figures {
  std::vector<std::string> svg;
  std::string unavailable;  // set: not drawn (no python3 with matplotlib, ...), the reason
};

// Draws the plots with the first interpreter that can: $KVP_PYTHON when set (only it), else
// python3 on PATH, then /usr/bin/python3 (Debian's, where python3-matplotlib installs).
Figures draw_plots(const std::vector<Plot>& plots);

// The page. A failing run shows its failures right under the verdict, before the table and
// the plots; figures that could not be drawn leave a notice saying why in their place.
std::string html_page(const Summary& s, const std::vector<Plot>& plots, const Figures& figures);

// Draws the plots and writes the page to `path` (replacing it). Plots that cannot be drawn do
// not fail the command (the verdict is the run's, not the plotting's): the page says why and
// a warning goes to stderr. Error: the file cannot be written, naming it.
Status write_html(const std::string& path, const Summary& s, const std::vector<Plot>& plots);

// A command's --summary and --html (either path empty: not written) from one Summary; the
// plots are made only for a page.
Status write_summary_and_page(const std::string& summary_path, const std::string& html_path, const Summary& s,
                              const std::function<std::vector<Plot>()>& plots);

// Text escaped for HTML element content and attribute values.
std::string html_escape(const std::string& text);

}  // namespace kvp::verify
