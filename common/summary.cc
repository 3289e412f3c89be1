#include "common/summary.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace kvp::verify {
namespace {

std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += "<br>";
    } else if (c != '\r') {
      out += c;
    }
  }
  return out;
}

// A code span that survives backticks in the text (CommonMark: a longer fence).
std::string code(const std::string& text) {
  std::size_t longest = 0, run = 0;
  for (char c : text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  const std::string fence(longest + 1, '`');
  const bool pad = !text.empty() && (text.front() == '`' || text.back() == '`');
  return fence + (pad ? " " : "") + text + (pad ? " " : "") + fence;
}

std::string badge(const std::string& result) {
  if (result == "PASS") return "✅ PASS";
  if (result == "FAIL") return "❌ FAIL";
  return result;
}

}  // namespace

std::vector<const SummaryRow*> failed_rows(const Summary& s) {
  std::vector<const SummaryRow*> failed;
  for (const SummaryRow& r : s.rows)
    if (r.result == "FAIL") failed.push_back(&r);
  return failed;
}

std::string summary_markdown(const Summary& s) {
  std::string md = "## " + s.title + (!s.passed ? "" : *s.passed ? ": ✅ PASS" : ": ❌ FAIL") + "\n\n";
  if (!s.verdict_detail.empty()) md += s.verdict_detail + "\n\n";
  for (const std::string& line : s.context) md += cell(line) + "  \n";
  if (!s.context.empty()) md += "\n";
  const std::vector<const SummaryRow*> failed = failed_rows(s);
  if (!failed.empty()) {
    md += "### Failed (" + std::to_string(failed.size()) + ")\n\n";
    for (const SummaryRow* r : failed) {
      md += "- **" + cell(r->name) + "**: " + cell(r->detail) + "\n";
      const std::string& repro = r->reproducer.empty() ? s.reproducer : r->reproducer;
      if (!repro.empty()) md += "  reproduce: " + code(repro) + "\n";
    }
    md += "\n";
  } else if (!s.reproducer.empty()) {
    md += "Run: " + code(s.reproducer) + "\n\n";
  }
  if (!s.rows.empty()) {
    md += "### " + s.rows_title + "\n\n| " + cell(s.rows_title == "Checks" ? "check" : "name") + " | result |";
    for (const std::string& c : s.columns) md += " " + cell(c) + " |";
    md += " detail |\n|---|---|";
    for (std::size_t i = 0; i < s.columns.size(); ++i) md += "---:|";
    md += "---|\n";
    for (const SummaryRow& r : s.rows) {
      md += "| " + cell(r.name) + " | " + badge(r.result) + " |";
      for (std::size_t i = 0; i < s.columns.size(); ++i) md += " " + cell(i < r.cells.size() ? r.cells[i] : "") + " |";
      md += " " + cell(r.detail) + " |\n";
    }
    md += "\n";
  }
  for (const std::string& n : s.notes) md += cell(n) + "  \n";
  if (!s.notes.empty()) md += "\n";
  if (!s.raw_markdown.empty()) md += s.raw_markdown + (s.raw_markdown.back() == '\n' ? "" : "\n") + "\n";
  return md;
}

Status append_summary(const std::string& path, const Summary& s) {
  std::ofstream out(path, std::ios::app | std::ios::binary);
  if (!out) return Status::error("--summary " + path + ": cannot open for writing");
  out << summary_markdown(s);
  out.flush();
  if (!out) return Status::error("--summary " + path + ": cannot write");
  return Status::ok();
}

std::vector<std::string> report_lines_after(const std::string& text, std::size_t skip) {
  std::vector<std::string> out;
  std::istringstream lines(text);
  std::string line;
  for (std::size_t i = 0; std::getline(lines, line); ++i)
    if (i >= skip && line.rfind("verdict:", 0) != 0) out.push_back(line);
  return out;
}

std::string shell_command_line(int argc, const char* const* argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-_./=:,+@%") == std::string::npos;
    std::string quoted = "'";
    for (char c : a) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    quoted += "'";
    line += (i == 0 ? "" : " ") + (plain ? a : quoted);
  }
  return line;
}

}  // namespace kvp::verify
