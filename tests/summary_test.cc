// Job summaries (common/summary.h): the verdict first, the failed checks with their
// reproducers before the table, Markdown that a table cell or a code span cannot break, and
// a file that collects every step's summary.
#include "common/summary.h"

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

}  // namespace
}  // namespace kvp::verify
