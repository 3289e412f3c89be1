#include "common/html_report.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvp::verify {

// scripts/report_plots.py, compiled in (common/CMakeLists.txt).
extern const char kReportPlotsScript[];

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs `python -c SCRIPT spec out` with stderr to `err`; the exit status (-1: not started,
// 128 + n: killed by signal n).
int run_python(const std::string& python, const std::string& spec, const std::string& out, const std::string& err) {
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);  // the script prints nothing on stdout; keep the command's own output clean
      dup2(fd, 2);
      close(fd);
    }
    const int null_in = open("/dev/null", O_RDONLY);
    if (null_in >= 0) dup2(null_in, 0);
    const char* argv[] = {python.c_str(), "-c", kReportPlotsScript, spec.c_str(), out.c_str(), nullptr};
    execvp(argv[0], const_cast<char* const*>(argv));
    std::fprintf(stderr, "cannot run %s\n", python.c_str());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

nlohmann::json plot_json(const Plot& p) {
  nlohmann::json j = {{"title", p.title}, {"xlabel", p.xlabel}, {"ylabel", p.ylabel},
                      {"kind", p.kind},   {"logy", p.logy},     {"categories", p.categories}};
  j["series"] = nlohmann::json::array();
  for (const PlotSeries& s : p.series) j["series"].push_back({{"name", s.name}, {"x", s.x}, {"y", s.y}});
  j["hlines"] = nlohmann::json::array();
  for (const PlotLine& h : p.hlines) j["hlines"].push_back({{"y", h.y}, {"label", h.label}});
  return j;
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const std::size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// A Markdown pipe table (simulate's runs table) as an HTML table; other lines as text.
std::string markdown_tables_html(const std::string& md) {
  std::string html;
  std::istringstream lines(md);
  bool in_table = false;
  int row = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.size() >= 2 && line.front() == '|') {
      if (!in_table) html += "<div class=\"wide\"><table class=\"data\">\n";
      in_table = true;
      std::vector<std::string> cells;
      std::string cell;
      for (std::size_t i = 1; i < line.size(); ++i) {
        if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
          cell += '|';
          ++i;
        } else if (line[i] == '|') {
          cells.push_back(cell);
          cell.clear();
        } else {
          cell += line[i];
        }
      }
      const bool separator = !cells.empty() && cells.front().find_first_not_of(" -:") == std::string::npos;
      if (separator) continue;
      const char* tag = row == 0 ? "th" : "td";
      html += "<tr>";
      for (std::string& c : cells) {
        const std::size_t b = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
        c = b == std::string::npos ? "" : c.substr(b, e - b + 1);
        html += std::string("<") + tag + ">" + html_escape(c) + "</" + tag + ">";
      }
      html += "</tr>\n";
      ++row;
    } else {
      if (in_table) html += "</table></div>\n";
      in_table = false;
      row = 0;
      if (!line.empty()) html += "<p>" + html_escape(line) + "</p>\n";
    }
  }
  if (in_table) html += "</table></div>\n";
  return html;
}

const char* kStyle = R"css(
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 72em; color: #1b1f23; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.3em; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #d0d7de; padding-bottom: 0.2em; }
.verdict { font-size: 1.4em; font-weight: 600; padding: 0.5em 0.8em; border-radius: 6px; margin: 0.6em 0; }
.verdict.pass { background: #dafbe1; color: #116329; border: 1px solid #4ac26b; }
.verdict.fail { background: #ffebe9; color: #a40e26; border: 1px solid #ff8182; }
.verdict.none { background: #ddf4ff; color: #0a3069; border: 1px solid #54aeff; }
.failure { border-left: 4px solid #cf222e; background: #fff8f7; padding: 0.4em 0.8em; margin: 0.6em 0; }
.failure .name { font-weight: 600; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.9em; }
code.cmd { background: #f6f8fa; padding: 0.1em 0.3em; border-radius: 3px; word-break: break-all; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #d0d7de; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
tr.FAIL td { background: #ffebe9; }
td.PASS { color: #116329; font-weight: 600; }
td.FAIL { color: #a40e26; font-weight: 600; }
td:first-child { white-space: nowrap; }
pre { white-space: pre-wrap; }
.wide { overflow-x: auto; }
table.data { font-size: 0.75em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; page-break-inside: avoid; }
figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 0.9em; color: #57606a; }
.notice { border: 1px dashed #bf8700; background: #fff8c5; padding: 0.5em 0.8em; }
footer { margin-top: 2em; font-size: 0.8em; color: #57606a; }
)css";

}  // namespace

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Figures draw_plots(const std::vector<Plot>& plots) {
  Figures f;
  if (plots.empty()) return f;
  std::vector<std::string> pythons;
  if (const char* env = std::getenv("KVP_PYTHON"); env != nullptr && *env != '\0') {
    pythons.push_back(env);
  } else {
    pythons = {"python3", "/usr/bin/python3"};
  }
  std::error_code ec;
  const std::filesystem::path tmp_root = std::filesystem::temp_directory_path(ec);
  if (ec) {
    f.unavailable = "no temporary directory: " + ec.message();
    return f;
  }
  std::string templ = (tmp_root / "kvproof-plots-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) {
    f.unavailable = "cannot create a temporary directory in " + tmp_root.string();
    return f;
  }
  const std::filesystem::path dir = templ;
  const std::string spec = (dir / "spec.json").string(), out = (dir / "svg.json").string(),
                    err = (dir / "stderr").string();
  nlohmann::json j = {{"plots", nlohmann::json::array()}};
  for (const Plot& p : plots) j["plots"].push_back(plot_json(p));
  {
    std::ofstream s(spec, std::ios::binary);
    s << j.dump();
  }
  std::string tried;
  for (const std::string& py : pythons) {
    const int rc = run_python(py, spec, out, err);
    if (rc == 0) {
      try {
        const auto svgs = nlohmann::json::parse(read_file(out));
        for (const auto& s : svgs) f.svg.push_back(s.get<std::string>());
        if (f.svg.size() == plots.size()) break;
        tried += (tried.empty() ? "" : "; ") + py + ": " + std::to_string(svgs.size()) + " plots for " +
                 std::to_string(plots.size());
      } catch (const nlohmann::json::exception& e) {
        tried += (tried.empty() ? "" : "; ") + py + ": unreadable output (" + e.what() + ")";
      }
      f.svg.clear();
    } else {
      const std::string why = last_line(read_file(err));
      tried +=
          (tried.empty() ? "" : "; ") + py + ": exit " + std::to_string(rc) + (why.empty() ? "" : " (" + why + ")");
    }
  }
  std::filesystem::remove_all(dir, ec);
  if (f.svg.empty())
    f.unavailable =
        "no python3 with matplotlib drew them (" + tried + "); set KVP_PYTHON or install python3-matplotlib";
  return f;
}

std::string html_page(const Summary& s, const std::vector<Plot>& plots, const Figures& figures) {
  const std::string verdict = !s.passed ? "" : *s.passed ? "PASS" : "FAIL";
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  html_escape(s.title) + (verdict.empty() ? "" : ": " + verdict) + "</title>\n<style>" + kStyle +
                  "</style>\n</head>\n<body>\n";
  h += "<h1>" + html_escape(s.title) + "</h1>\n";
  const std::string cls = verdict.empty() ? "none" : verdict == "PASS" ? "pass" : "fail";
  h += "<div class=\"verdict " + cls + "\" id=\"verdict\">" + (verdict.empty() ? "" : "Verdict: " + verdict) +
       (!verdict.empty() && !s.verdict_detail.empty() ? " — " : "") + html_escape(s.verdict_detail) + "</div>\n";
  if (!s.context.empty()) {
    h += "<ul class=\"context\">\n";
    for (const std::string& c : s.context) h += "<li>" + html_escape(c) + "</li>\n";
    h += "</ul>\n";
  }
  const std::vector<const SummaryRow*> failed = failed_rows(s);
  if (!failed.empty()) {
    h += "<section id=\"failures\">\n<h2>Failed (" + std::to_string(failed.size()) + ")</h2>\n";
    for (const SummaryRow* r : failed) {
      const std::string& repro = r->reproducer.empty() ? s.reproducer : r->reproducer;
      h += "<div class=\"failure\"><div class=\"name\">FAILED: " + html_escape(r->name) + "</div><div>" +
           html_escape(r->detail) + "</div>";
      if (!repro.empty()) h += "<div>reproduce: <code class=\"cmd\">" + html_escape(repro) + "</code></div>";
      h += "</div>\n";
    }
    h += "</section>\n";
  }
  if (!s.reproducer.empty()) h += "<p>Run: <code class=\"cmd\">" + html_escape(s.reproducer) + "</code></p>\n";
  if (!s.rows.empty()) {
    h += "<section id=\"checks\">\n<h2>" + html_escape(s.rows_title) + "</h2>\n<table>\n<tr><th>" +
         (s.rows_title == "Checks" ? "check" : "name") + "</th><th>result</th>";
    for (const std::string& c : s.columns) h += "<th>" + html_escape(c) + "</th>";
    h += "<th>detail</th></tr>\n";
    for (const SummaryRow& r : s.rows) {
      const std::string rc = r.result == "PASS" || r.result == "FAIL" ? r.result : "other";
      h += "<tr class=\"" + rc + "\"><td>" + html_escape(r.name) + "</td><td class=\"" + rc + "\">" +
           html_escape(r.result) + "</td>";
      for (std::size_t i = 0; i < s.columns.size(); ++i)
        h += "<td class=\"num\">" + html_escape(i < r.cells.size() ? r.cells[i] : "") + "</td>";
      h += "<td>" + html_escape(r.detail) + "</td></tr>\n";
    }
    h += "</table>\n</section>\n";
  }
  if (!s.raw_markdown.empty()) h += "<section id=\"runs\">\n" + markdown_tables_html(s.raw_markdown) + "</section>\n";
  if (!plots.empty()) {
    h += "<section id=\"plots\">\n<h2>Plots</h2>\n";
    if (!figures.unavailable.empty())
      h += "<p class=\"notice\">Plots not drawn: " + html_escape(figures.unavailable) + "</p>\n";
    for (std::size_t i = 0; i < plots.size(); ++i) {
      h += "<figure>\n";
      if (i < figures.svg.size()) {
        h += figures.svg[i] + "\n";
      } else {
        h += "<p class=\"notice\">" + html_escape(plots[i].title) + ": not drawn</p>\n";
      }
      if (!plots[i].caption.empty()) h += "<figcaption>" + html_escape(plots[i].caption) + "</figcaption>\n";
      h += "</figure>\n";
    }
    h += "</section>\n";
  }
  if (!s.notes.empty()) {
    h += "<section id=\"notes\">\n<h2>Notes</h2>\n<pre>";
    for (const std::string& n : s.notes) h += html_escape(n) + "\n";
    h += "</pre>\n</section>\n";
  }
  h += "<footer>Written by kvproof. Self-contained: no scripts, nothing loaded from "
       "elsewhere.</footer>\n</body>\n</html>\n";
  return h;
}

Status write_html(const std::string& path, const Summary& s, const std::vector<Plot>& plots) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::error("--html " + path + ": cannot open for writing");
  const Figures figures = draw_plots(plots);
  if (!figures.unavailable.empty())
    std::fprintf(stderr, "kvproof: --html %s: plots not drawn: %s\n", path.c_str(), figures.unavailable.c_str());
  out << html_page(s, plots, figures);
  out.flush();
  if (!out) return Status::error("--html " + path + ": cannot write");
  return Status::ok();
}

Status write_summary_and_page(const std::string& summary_path, const std::string& html_path, const Summary& s,
                              const std::function<std::vector<Plot>()>& plots) {
  if (!summary_path.empty()) KVP_RETURN_IF_ERROR(append_summary(summary_path, s));
  if (!html_path.empty()) KVP_RETURN_IF_ERROR(write_html(html_path, s, plots()));
  return Status::ok();
}

}  // namespace kvp::verify
