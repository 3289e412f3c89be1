// Job summaries: a report as GitHub-flavoured Markdown, the format CI systems show on a run's
// page ($GITHUB_STEP_SUMMARY; GitLab and Buildkite render the same Markdown). The verdict
// first, then the failing checks each with the command that reproduces it, then the table of
// every check. Shared by every command that writes --summary (verify, audit, kernel-check,
// simulate).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvp::verify {

struct SummaryRow {
  std::string name;
  std::string result;              // "PASS", "FAIL", "n/a", "skip": FAIL rows are the failures
  std::vector<std::string> cells;  // one per Summary::columns
  std::string detail;              // the check's message
  std::string reproducer;          // a failing row's own command; empty: the run's
};

struct Summary {
  std::string title;                 // "kvproof verify"
  std::optional<bool> passed;        // none: a report with no verdict (simulate's measurements)
  std::string verdict_detail;        // one line beside the verdict: "2 of 18 checks failed"
  std::vector<std::string> context;  // what ran: model, workload, backend ...
  std::string reproducer;            // the command that re-runs the whole run
  std::vector<std::string> columns;  // headers between "result" and "detail"
  std::vector<SummaryRow> rows;
  std::string rows_title = "Checks";  // the table's heading
  std::vector<std::string> notes;     // lines after the table
  std::string raw_markdown;           // appended as is after the notes (simulate's own table)
};

// The FAIL rows, in table order: what both renderings show first.
std::vector<const SummaryRow*> failed_rows(const Summary& s);

// The summary as Markdown. Table cells escape '|' and turn newlines into <br>; the reproducers
// are code spans.
std::string summary_markdown(const Summary& s);

// Appends the Markdown to `path` (a job summary file collects every step's), creating it.
// Error: the file cannot be opened or written, naming it.
Status append_summary(const std::string& path, const Summary& s);

// The lines of a text report after its first `skip`, less its closing "verdict:" line: the
// notes under a summary's table are the text report's own lines (one source for both).
std::vector<std::string> report_lines_after(const std::string& text, std::size_t skip);

// argv as one shell command line, each argument quoted where the shell would split or expand it.
std::string shell_command_line(int argc, const char* const* argv);

}  // namespace kvp::verify
