// Job summaries (common/summary.h): the verdict first, the failed checks with their
// reproducers before the table, Markdown that a table cell or a code span cannot break, and
// a file that collects every step's summary.
#include "common/summary.h"
#include "common/html_report.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace kvp::verify {
namespace {

Summary two_checks(bool second_passes) {
  Summary s;
  s.title = "kvproof verify";
  s.passed = second_passes;
  s.verdict_detail = second_passes ? "0 of 2 checks failed" : "1 of 2 checks failed";
  s.context = {"preset tiny"};
  s.reproducer = "kvproof verify --shape mixed";
  s.columns = {"count"};
  s.rows = {{"invariants", "PASS", {"96"}, "", ""},
            {"logits", second_passes ? "PASS" : "FAIL", {"1410"}, "worst 3e-4 | over\nthe tolerance", ""}};
  s.notes = {"run[swap]: 102 steps"};
  return s;
}

TEST(Summary, TheVerdictComesFirstThenTheFailuresWithTheirReproducerThenTheTable) {
  const std::string md = summary_markdown(two_checks(false));
  EXPECT_EQ(md.rfind("## kvproof verify: ❌ FAIL\n\n1 of 2 checks failed\n", 0), 0u) << md;
  const auto failed = md.find("### Failed (1)"), table = md.find("### Checks"), note = md.find("run[swap]");
  ASSERT_NE(failed, std::string::npos) << md;
  ASSERT_NE(table, std::string::npos) << md;
  EXPECT_LT(failed, table);
  EXPECT_LT(table, note);
  EXPECT_NE(md.find("- **logits**: worst 3e-4 \\| over<br>the tolerance\n  reproduce: `kvproof verify --shape mixed`"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| logits | ❌ FAIL | 1410 | worst 3e-4 \\| over<br>the tolerance |"), std::string::npos) << md;
  EXPECT_NE(md.find("| invariants | ✅ PASS | 96 |  |"), std::string::npos) << md;
}

TEST(Summary, APassingRunHasNoFailedSectionAndNamesItsCommand) {
  const std::string md = summary_markdown(two_checks(true));
  EXPECT_EQ(md.rfind("## kvproof verify: ✅ PASS\n", 0), 0u) << md;
  EXPECT_EQ(md.find("### Failed"), std::string::npos) << md;
  EXPECT_NE(md.find("Run: `kvproof verify --shape mixed`"), std::string::npos) << md;
}

TEST(Summary, ARowsOwnReproducerWinsAndBackticksCannotCloseItsCodeSpan) {
  Summary s = two_checks(false);
  s.rows[1].reproducer = "kvproof kernel-check --plugin 'a`b.so' --case 5";
  const std::string md = summary_markdown(s);
  EXPECT_NE(md.find("reproduce: ``kvproof kernel-check --plugin 'a`b.so' --case 5``"), std::string::npos) << md;
}

TEST(Summary, AReportWithoutAVerdictHasNoBadge) {
  Summary s;
  s.title = "kvproof simulate";
  s.raw_markdown = "| a |\n|---|\n| 1 |\n";
  const std::string md = summary_markdown(s);
  EXPECT_EQ(md.rfind("## kvproof simulate\n\n", 0), 0u) << md;
  EXPECT_NE(md.find("| a |\n|---|\n| 1 |\n"), std::string::npos) << md;
}

TEST(Summary, AppendsToTheFileAndNamesAFileItCannotWrite) {
  const auto path = std::filesystem::temp_directory_path() / "kvp_summary_test.md";
  std::filesystem::remove(path);
  ASSERT_TRUE(append_summary(path.string(), two_checks(true)).is_ok());
  ASSERT_TRUE(append_summary(path.string(), two_checks(false)).is_ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  EXPECT_EQ(all, summary_markdown(two_checks(true)) + summary_markdown(two_checks(false)));
  std::filesystem::remove(path);
  const Status bad = append_summary("/nonexistent-dir/x.md", two_checks(true));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.message(), "--summary /nonexistent-dir/x.md: cannot open for writing");
}

TEST(Summary, TheCommandLineQuotesWhatTheShellWouldSplitOrExpand) {
  const char* argv[] = {"build/bin/kvproof", "verify", "--workload", "my file.json", "--x", "it's", "a=b,c", ""};
  EXPECT_EQ(shell_command_line(8, argv), "build/bin/kvproof verify --workload 'my file.json' --x 'it'\\''s' a=b,c ''");
}

TEST(Html, EscapesTextAndAttributes) {
  EXPECT_EQ(html_escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
}

TEST(Html, AFailingPageShowsItsFailuresBeforeTheTableAndEscapesThem) {
  Summary s = two_checks(false);
  s.rows.back().detail = "<script>alert(1)</script>";
  const std::string page = html_page(s, {}, {});
  const std::size_t verdict = page.find("Verdict: FAIL"), failure = page.find("FAILED: "),
                    table = page.find("<section id=\"checks\">");
  ASSERT_NE(verdict, std::string::npos) << page;
  ASSERT_NE(failure, std::string::npos) << page;
  ASSERT_NE(table, std::string::npos) << page;
  EXPECT_LT(verdict, failure);
  EXPECT_LT(failure, table);
  EXPECT_EQ(page.find("<script>"), std::string::npos) << "a check's text became markup";
  EXPECT_EQ(page.find("FAILED: ", failure + 1), std::string::npos) << "one failing row, one failure shown";
  EXPECT_EQ(html_page(two_checks(true), {}, {}).find("FAILED: "), std::string::npos);
}

TEST(Html, PlotsThatCannotBeDrawnLeaveANoticeNamingWhy) {
  Plot p("line", "by position", "position", "error");
  p.series.emplace_back("a", std::vector<double>{0, 1}, std::vector<double>{1e-7, 2e-7});
  Figures none;
  none.unavailable = "no python3 with matplotlib drew them (python3: exit 3)";
  const std::string page = html_page(two_checks(true), {p}, none);
  EXPECT_NE(page.find("Plots not drawn: no python3 with matplotlib drew them (python3: exit 3)"), std::string::npos);
  EXPECT_NE(page.find("by position: not drawn"), std::string::npos);
  EXPECT_EQ(page.find("<svg"), std::string::npos);
  setenv("KVP_PYTHON", "/nonexistent/python3", 1);
  const Figures f = draw_plots({p});
  unsetenv("KVP_PYTHON");
  EXPECT_TRUE(f.svg.empty());
  EXPECT_NE(f.unavailable.find("/nonexistent/python3: exit 127"), std::string::npos) << f.unavailable;
}

TEST(Html, AMarkdownTableBecomesATable) {
  Summary s;
  s.title = "kvproof simulate";
  s.raw_markdown = "| policy | a\\|b |\n|---|---|\n| paged | 1 |\n";
  const std::string page = html_page(s, {}, {});
  EXPECT_NE(page.find("<tr><th>policy</th><th>a|b</th></tr>"), std::string::npos) << page;
  EXPECT_NE(page.find("<tr><td>paged</td><td>1</td></tr>"), std::string::npos) << page;
  EXPECT_EQ(page.find("---"), std::string::npos) << "the separator row was kept";
  EXPECT_EQ(page.find("Verdict:"), std::string::npos) << "a report without a verdict got one";
}

TEST(Html, APageThatCannotBeWrittenIsNamed) {
  const Status bad = write_html("/nonexistent-dir/x.html", two_checks(true), {});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.message(), "--html /nonexistent-dir/x.html: cannot open for writing");
}

}  // namespace
}  // namespace kvp::verify
