// kernel-check on the in-tree plug-ins (plugins/): kvproof's own CPU attention and the naive
// C kernel pass the quick grid; each planted defect fails with the property that names it; a
// crash and a hang are the case's failure, not the harness's; the loader refuses unusable
// libraries by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "kernel_check/attention_plugin_loader.h"
#include "kernel_check/case_run.h"
#include "kernel_check/cuda_runtime.h"
#include "kernel_check/kernel_check.h"

namespace kvp::verify::kernel_check {
namespace {

// The build's folders, or the ones the environment names: scripts/gpu-check.sh --prebuilt runs
// this program from a build directory copied to another machine.
std::string folder(const char* variable, const char* built) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? value : built;
}
std::string plugin_dir() { return folder("KVP_PLUGIN_DIR", KVP_PLUGIN_DIR); }
std::string source_dir() { return folder("KVP_SOURCE_DIR", KVP_SOURCE_DIR); }
std::string fake_cudart() { return plugin_dir() + "/kvp_fake_cudart.so"; }

std::string plugin_path(const std::string& name) { return plugin_dir() + "/kvp_plugin_" + name + ".so"; }

std::unique_ptr<AttentionPlugin> load_or_die(const std::string& name) {
  auto p = AttentionPlugin::load(plugin_path(name));
  if (!p) ADD_FAILURE() << p.status().message();
  return p ? std::move(p).value() : nullptr;
}

// Properties that failed, with the number of cases each failed in.
std::map<std::string, int> failed_properties(const Report& report) {
  std::map<std::string, int> out;
  for (const CaseRecord& c : report.cases) {
    std::set<std::string> seen;
    for (const Failure& f : c.result.failures)
      if (seen.insert(f.property).second) ++out[f.property];
  }
  return out;
}

std::string failures_text(const Report& report) {
  std::string s;
  for (const auto& [p, n] : failed_properties(report)) s += p + " x" + std::to_string(n) + " ";
  return s;
}

// The quick grid, or a third of it (shard 0/3: every layout still comes up), or up to the
// first `max_failures` failing cases.
Report quick_grid(const std::string& name, bool third = false, int64_t max_failures = 0) {
  auto plugin = load_or_die(name);
  if (!plugin) return {};
  Options options;
  options.shard_count = third ? 3 : 1;
  options.max_failures = max_failures;
  auto report = run_kernel_check(*plugin, options);
  EXPECT_TRUE(report) << report.status().message();
  return report ? std::move(report).value() : Report{};
}

TEST(KernelCheck, KvproofCpuPluginPassesTheQuickGridWithNoCaseSkipped) {
  const Report report = quick_grid("kvproof_cpu");
  ASSERT_GT(report.cases.size(), 100u);
  EXPECT_TRUE(report.passed()) << report.summary();
  EXPECT_EQ(report.num_skipped(), 0);
}

TEST(KernelCheck, NaiveCPluginPassesTheQuickGridInEveryLayout) {
  const Report report = quick_grid("naive_c", /*third=*/true);
  EXPECT_TRUE(report.passed()) << report.summary();
  std::set<int32_t> layouts;
  for (const CaseRecord& c : report.cases) layouts.insert(c.spec.kv_layout);
  EXPECT_EQ(layouts.size(), 4u);
}

struct Planted {
  const char* plugin;
  const char* property;
};

class PlantedDefect : public testing::TestWithParam<Planted> {};

TEST_P(PlantedDefect, FailsTheQuickGridWithTheDefectsPropertyInItsFirstFailingCases) {
  const Report report = quick_grid(GetParam().plugin, /*third=*/false, /*max_failures=*/2);
  EXPECT_FALSE(report.passed());
  EXPECT_GT(failed_properties(report).count(GetParam().property), 0u)
      << GetParam().plugin << " failed only: " << failures_text(report);
}

INSTANTIATE_TEST_SUITE_P(Plugins, PlantedDefect,
                         testing::Values(Planted{"past_context", "no-poison-leak"}, Planted{"drop_partial", "accuracy"},
                                         Planted{"head_modulo", "accuracy"}, Planted{"outside_table", "no-poison-leak"},
                                         Planted{"batch_split", "batch-invariance"},
                                         Planted{"write_past_out", "guard-zones"}, Planted{"no_max", "finite-output"},
                                         Planted{"crash", "crash"}, Planted{"run_error", "run-error"},
                                         Planted{"write_pool", "inputs-unchanged"},
                                         Planted{"nondeterministic", "repeatability"}),
                         [](const testing::TestParamInfo<Planted>& p) { return std::string(p.param.plugin); });

TEST(KernelCheck, DefectsThatOnlyChangeValuesAreNotReportedAsPoisonOrOverflow) {
  // A wrong head mapping reads only valid slots with finite values: only accuracy may fail.
  const auto failed = failed_properties(quick_grid("head_modulo", /*third=*/true));
  EXPECT_EQ(failed.count("no-poison-leak"), 0u);
  EXPECT_EQ(failed.count("finite-output"), 0u);
  EXPECT_EQ(failed.count("batch-invariance"), 0u);
}

TEST(KernelCheck, ACrashIsTheCasesFailureWithItsSignal) {
  const Report report = quick_grid("crash", /*third=*/false, /*max_failures=*/1);
  ASSERT_FALSE(report.cases.empty());
  const CaseResult& last = report.cases.back().result;
  ASSERT_TRUE(last.failed("crash")) << report.summary();
  EXPECT_NE(last.failures[0].message.find("signal 11"), std::string::npos) << last.failures[0].message;
}

// Isolated cases run in one long-lived worker process; a crash or a hang kills only that
// worker, its case is reported with the signal or the timeout, and a fresh worker runs the
// rest (issue 42: one child per case cost 4.5-5 ms a case here, and a CUDA context each on a
// device).
TEST(KernelCheck, CrashesAndHangsKillOnlyTheirWorkerAndTheRunGoesOn) {
  const Report clean = quick_grid("kvproof_cpu", /*third=*/true);
  ASSERT_GT(clean.cases.size(), 10u);
  EXPECT_EQ(clean.workers_started, 1) << "every case in one worker";
  for (const char* name : {"crash", "hang"}) {
    auto plugin = load_or_die(name);
    ASSERT_TRUE(plugin);
    Options options;
    options.shard_count = 8;
    // The hang needs a short limit (each hanging case costs it); the crash a generous one:
    // under a loaded CI machine a fresh worker's start and a 400-position chunk once took
    // more than 1 s, a spurious timeout that this test would count as a failure.
    const bool crash = std::string(name) == "crash";
    options.timeout_s = crash ? 30.0 : 1.0;
    auto report = run_kernel_check(*plugin, options);
    ASSERT_TRUE(report) << report.status().message();
    const std::string property = crash ? "crash" : "timeout";
    int64_t broken = 0, passed_after_first_break = 0;
    for (const CaseRecord& c : report->cases) {
      if (c.result.failed(property)) {
        ++broken;
        EXPECT_EQ(c.result.failures.size(), 1u) << c.spec.describe();
      } else if (broken > 0 && c.result.passed()) {
        ++passed_after_first_break;
      }
    }
    EXPECT_GE(broken, 2) << name << ": " << report->summary();
    EXPECT_GT(passed_after_first_break, 0) << name << ": the run goes on after a broken worker";
    EXPECT_EQ(report->num_failed(), broken) << report->summary();
    const bool last_broke = report->cases.back().result.failed(property);
    EXPECT_EQ(report->workers_started, broken + (last_broke ? 0 : 1)) << name;
    EXPECT_NE(report->summary().find("worker processes (a fresh one after each crash or timeout)"), std::string::npos);
  }
}

TEST(KernelCheck, APluginThatDeclinesEveryShapeChecksNothingAndDoesNotPass) {
  const Report report = quick_grid("declines_all", /*third=*/true);
  EXPECT_EQ(report.num_skipped(), static_cast<int64_t>(report.cases.size()));
  EXPECT_EQ(report.num_failed(), 0);
  EXPECT_FALSE(report.passed());
  EXPECT_NE(report.summary().find("nothing was checked"), std::string::npos);
}

TEST(KernelCheck, AHangingKernelTimesOutInItsChildAndTheHarnessCarriesOn) {
  auto plugin = load_or_die("hang");
  ASSERT_TRUE(plugin);
  const std::vector<KernelCase> grid =
      make_grid(Grid::kQuick, plugin->descriptor().kv_dtypes, plugin->descriptor().kv_layouts);
  int64_t id = -1;
  for (const KernelCase& c : grid)
    if (c.block_size == 1) id = c.id;
  ASSERT_GE(id, 0);
  Options options;
  options.case_id = id;
  options.timeout_s = 0.3;
  auto report = run_kernel_check(*plugin, options);
  ASSERT_TRUE(report);
  ASSERT_EQ(report->cases.size(), 1u);
  EXPECT_TRUE(report->cases[0].result.failed("timeout")) << report->summary();
  EXPECT_NE(report->cases[0].reproduce.find("--case " + std::to_string(id)), std::string::npos);
}

// fp8 pools with scales (ABI version 2): kvproof's CPU kernel passes every fp8 case of the
// quick grid (the long reduction over 131,073 positions included), and the same kernel with
// its scales dropped before the kernel fails accuracy on every fp8 case and on nothing else.
TEST(KernelCheck, Fp8CasesPassWithScalesAndFailWhenTheKernelDropsThem) {
  auto good = load_or_die("kvproof_cpu");
  auto dropped = load_or_die("kvproof_cpu_drop_scales");
  ASSERT_TRUE(good && dropped);
  const auto grid = make_grid(Grid::kQuick, good->descriptor().kv_dtypes, good->descriptor().kv_layouts);
  int64_t fp8_cases = 0;
  bool long_reduction = false;
  for (const KernelCase& c : grid) {
    const bool fp8 = c.kv_dtype == KVP_KV_FP8_E4M3 || c.kv_dtype == KVP_KV_FP8_E5M2;
    if (c.label == "long-reduction") {
      long_reduction = true;
      EXPECT_GE(c.seqs[0].context_len, 100000);
    }
    if (!fp8 && c.label != "long-reduction") continue;
    fp8_cases += fp8 ? 1 : 0;
    const CaseResult ok = run_case(good->descriptor(), c);
    EXPECT_TRUE(ok.failures.empty()) << "case " << c.id << " " << c.label << ": " << ok.failures[0].message;
    const CaseResult bad = run_case(dropped->descriptor(), c);
    if (fp8) {
      EXPECT_TRUE(bad.failed("accuracy")) << "case " << c.id << " " << c.label;
      for (const Failure& f : bad.failures) EXPECT_EQ(f.property, "accuracy") << f.message;
    } else {
      EXPECT_TRUE(bad.failures.empty()) << "case " << c.id;
    }
  }
  EXPECT_GE(fp8_cases, 10);
  EXPECT_TRUE(long_reduction);
}

// ---- sliding windows (ABI version 3) -------------------------------------------------------

// Shard 0/8 of the quick grid, in this process: a sample of every scenario, for the checks
// whose subject is elsewhere (the windowed cases).
Report eighth_of_quick_grid(const std::string& name) {
  auto plugin = load_or_die(name);
  if (!plugin) return {};
  Options options;
  options.shard_count = 8;
  options.isolate = false;
  auto report = run_kernel_check(*plugin, options);
  EXPECT_TRUE(report) << report.status().message();
  return report ? std::move(report).value() : Report{};
}

// A plug-in with a window gets the windowed cases after all the others, whose ids and seeds do
// not move; the windows are smaller than a block, one block and longer, over contexts several
// windows long, with prefill chunks longer than the window. A version-2 plug-in gets none.
TEST(KernelCheck, WindowedCasesComeLastAndOnlyToAPluginWithAWindow) {
  auto v3 = load_or_die("kvproof_cpu");
  ASSERT_TRUE(v3);
  const kvp_attention_plugin& d = v3->descriptor();
  const auto plain = make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts);
  const auto windowed = make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts, /*windows=*/true);
  ASSERT_GT(windowed.size(), plain.size() + 20);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(windowed[i].describe(), plain[i].describe());
    EXPECT_EQ(plain[i].window, 0);
  }
  bool below = false, one = false, over = false, many_windows = false, long_chunk = false, gemma = false;
  for (std::size_t i = plain.size(); i < windowed.size(); ++i) {
    const KernelCase& c = windowed[i];
    ASSERT_GT(c.window, 0) << c.describe();
    EXPECT_EQ(c.label.rfind("window-", 0), 0u) << c.describe();
    below |= c.window < c.block_size;
    one |= c.window == c.block_size;
    over |= c.window > c.block_size;
    gemma |= c.window == 512;
    for (const SeqSpec& s : c.seqs) {
      many_windows |= s.context_len >= 4 * c.window + 1;
      long_chunk |= s.num_new > c.window;
    }
  }
  EXPECT_TRUE(below && one && over && many_windows && long_chunk && gemma);
  const Report v2 = eighth_of_quick_grid("naive_c_v2");
  EXPECT_TRUE(v2.passed()) << v2.summary();
  EXPECT_GT(v2.cases.size(), 10u);
  for (const CaseRecord& c : v2.cases) EXPECT_EQ(c.spec.window, 0) << c.spec.describe();
}

// Runs case `c` on the plug-in in this process: taken (not skipped) and passed, or the first
// failure named with the plug-in and the case.
void expect_case_passes(const kvp_attention_plugin& d, const KernelCase& c, const std::string& name) {
  const CaseResult r = run_case(d, c);
  EXPECT_FALSE(r.skipped) << name << " " << c.describe();
  EXPECT_TRUE(r.passed()) << name << " " << c.describe() << ": " << r.failures[0].property << ": "
                          << r.failures[0].message;
}

// kvproof's CPU kernel and an independent C kernel (naive-c-v3, every layout) pass every
// windowed case, in which the table entries before a window name a block of NaN.
TEST(KernelCheck, CorrectKernelsPassEveryWindowedCase) {
  for (const char* name : {"kvproof_cpu", "naive_c_v3"}) {
    auto plugin = load_or_die(name);
    ASSERT_TRUE(plugin);
    const kvp_attention_plugin& d = plugin->descriptor();
    int64_t cases = 0, with_dead_entries = 0;
    std::set<int32_t> layouts;
    for (const KernelCase& c : make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts, /*windows=*/true)) {
      if (c.window == 0) continue;
      ++cases;
      layouts.insert(c.kv_layout);
      const Inputs in = make_inputs(c);
      if (std::any_of(in.dead_entries.begin(), in.dead_entries.end(), [](int32_t n) { return n > 0; }))
        ++with_dead_entries;
      expect_case_passes(d, c, name);
    }
    EXPECT_GT(cases, 20) << name;
    EXPECT_GT(with_dead_entries, cases / 2) << name;
    if (std::string(name) == "naive_c_v3") {
      EXPECT_EQ(layouts.size(), 4u);
    }
  }
}

// Two planted window defects, each passing every case without a window: seeing W + 1
// positions fails every windowed case with a dominant key one position before the window
// (accuracy; no-poison-leak where that position's block was freed), and reading the freed
// blocks before the window and weighing them by 0 fails every case that has freed blocks, by
// no-poison-leak (0 * NaN is NaN).
TEST(KernelCheck, WindowDefectsFailTheWindowedCasesAndNothingElse) {
  for (const char* name : {"window_off_by_one", "window_masked"}) {
    // An eighth of the quick grid: every case without a window passes.
    const Report report = eighth_of_quick_grid(name);
    int64_t plain = 0;
    for (const CaseRecord& c : report.cases) {
      if (c.spec.window != 0) continue;
      ++plain;
      EXPECT_TRUE(c.result.passed()) << name << " " << c.spec.describe() << ": " << c.result.failures[0].message;
    }
    EXPECT_GT(plain, 10) << name;
    // Every windowed case, in this process (the planted kernels neither crash nor hang).
    auto plugin = load_or_die(name);
    ASSERT_TRUE(plugin);
    const kvp_attention_plugin& d = plugin->descriptor();
    int64_t expected = 0, caught = 0;
    std::map<std::string, int> failed;
    for (const KernelCase& c : make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts, /*windows=*/true)) {
      if (c.window == 0) continue;
      const CaseResult r = run_case(d, c);
      for (const Failure& f : r.failures) ++failed[f.property];
      bool must_fail = false;
      if (std::string(name) == "window_off_by_one") {
        must_fail = c.kind == InputKind::kDominant;
        if (must_fail && (r.failed("accuracy") || r.failed("no-poison-leak"))) ++caught;
        // Far off, not near the tolerance: the key one position before the window dominates
        // the rows that see it (where its block was not freed: NaN there).
        if (must_fail && !r.failed("no-poison-leak")) {
          EXPECT_GT(r.max_rel_error, 0.3) << c.describe();
        }
      } else {
        const Inputs in = make_inputs(c);
        must_fail = std::any_of(in.dead_entries.begin(), in.dead_entries.end(), [](int32_t n) { return n > 0; });
        if (must_fail && r.failed("no-poison-leak")) ++caught;
      }
      expected += must_fail ? 1 : 0;
    }
    std::string seen;
    for (const auto& [p, n] : failed) seen += p + " x" + std::to_string(n) + " ";
    EXPECT_GT(expected, 10) << name;
    EXPECT_EQ(caught, expected) << name << ": " << seen;
  }
}

// ---- score scales (every version) and soft-caps (ABI version 4) ----------------------------

// Every plug-in gets the scale cases at the end of its common grid (Gemma's
// query_pre_attn_scalar^-1/2 and scales 8x off the default); a plug-in with a soft-cap gets the
// soft-capped cases after everything else, so no other case moves: Gemma 2's cap of 50 on scores
// driven past it, a cap of 5 that bends every score, and with a window the cap and the window.
TEST(KernelCheck, ScaleCasesForEveryPluginSoftCappedOnesLastForAPluginWithACap) {
  auto v4 = load_or_die("kvproof_cpu");
  ASSERT_TRUE(v4);
  const kvp_attention_plugin& d = v4->descriptor();
  ASSERT_TRUE(has_softcap(d));
  const auto plain = make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts);
  const auto windowed = make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts, /*windows=*/true);
  const auto capped = make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts, /*windows=*/true, /*softcaps=*/true);
  ASSERT_GT(capped.size(), windowed.size() + 7);
  for (std::size_t i = 0; i < windowed.size(); ++i) {
    EXPECT_EQ(capped[i].describe(), windowed[i].describe());
    EXPECT_EQ(windowed[i].softcap, 0.0f);
  }
  int64_t scaled = 0;
  bool gemma2_27b = false, far_off = false;
  for (const KernelCase& c : plain) {
    if (c.scale == 0.0f) continue;
    ++scaled;
    const double usual = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    EXPECT_GT(std::abs(c.scale - usual) / usual, 0.05) << c.describe();
    gemma2_27b |= c.head_dim == 128 && c.scale == 1.0f / 12.0f;
    far_off |= std::abs(c.scale / usual - 8.0) < 1e-6 || std::abs(usual / c.scale - 8.0) < 1e-6;
  }
  EXPECT_GE(scaled, 8);
  EXPECT_TRUE(gemma2_27b && far_off);
  bool gemma2_cap = false, bending = false, with_window = false, large = false;
  for (std::size_t i = windowed.size(); i < capped.size(); ++i) {
    const KernelCase& c = capped[i];
    ASSERT_GT(c.softcap, 0.0f) << c.describe();
    gemma2_cap |= c.softcap == 50.0f;
    bending |= c.softcap == 5.0f;
    with_window |= c.window > 0;
    large |= c.kind == InputKind::kLargeScores;
  }
  EXPECT_TRUE(gemma2_cap && bending && with_window && large);
  // Without a window, no windowed soft-capped case.
  for (const KernelCase& c : make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts, false, /*softcaps=*/true))
    EXPECT_EQ(c.window, 0) << c.describe();
}

// kvproof's CPU kernel and an independent C kernel (naive-c-v4, every layout) pass every scale
// and soft-capped case; a version-3 plug-in gets the scale cases and no soft-capped one.
TEST(KernelCheck, CorrectKernelsPassEveryScaleAndSoftCappedCase) {
  for (const char* name : {"kvproof_cpu", "naive_c_v4"}) {
    auto plugin = load_or_die(name);
    ASSERT_TRUE(plugin);
    const kvp_attention_plugin& d = plugin->descriptor();
    int64_t scaled = 0, capped = 0;
    std::set<int32_t> layouts;
    for (const KernelCase& c : make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts, true, true)) {
      if (c.scale == 0.0f && c.softcap == 0.0f) continue;
      (c.softcap > 0.0f ? capped : scaled) += 1;
      layouts.insert(c.kv_layout);
      expect_case_passes(d, c, name);
    }
    EXPECT_GE(scaled, 8) << name;
    EXPECT_GE(capped, 8) << name;
    if (std::string(name) == "naive_c_v4") {
      EXPECT_EQ(layouts.size(), 4u);
    }
  }
  const Report v3 = eighth_of_quick_grid("naive_c_v3");
  EXPECT_TRUE(v3.passed()) << v3.summary();
  for (const CaseRecord& c : v3.cases) EXPECT_EQ(c.spec.softcap, 0.0f) << c.spec.describe();
}

// Three planted defects, each failing by accuracy on its own cases and on nothing else:
// capping the raw dot product and scaling after (the soft-capped cases whose scale is far from
// 1 or whose scores reach the cap), declaring the cap and never applying it (the cases whose
// scores reach into tanh's bend), and computing 1 / sqrt(head_dim) instead of taking the
// scale (every scale case).
TEST(KernelCheck, ScaleAndSoftCapDefectsFailTheirCasesAndNothingElse) {
  for (const char* name : {"softcap_unscaled", "softcap_ignored", "own_scale"}) {
    auto plugin = load_or_die(name);
    ASSERT_TRUE(plugin);
    const kvp_attention_plugin& d = plugin->descriptor();
    const bool scale_defect = std::string(name) == "own_scale";
    int64_t subject = 0, caught = 0, others = 0;
    for (const KernelCase& c : make_grid(Grid::kQuick, d.kv_dtypes, d.kv_layouts, has_window(d), has_softcap(d))) {
      const bool is_subject = scale_defect ? c.scale > 0.0f : c.softcap > 0.0f;
      // The other cases: a sample of the grid (every scenario), to keep the test short.
      if (!is_subject && c.id % 7 != 0) continue;
      const CaseResult r = run_case(d, c);
      for (const Failure& f : r.failures) EXPECT_EQ(f.property, "accuracy") << name << " " << c.describe();
      if (!is_subject) {
        ++others;
        EXPECT_TRUE(r.passed()) << name << " " << c.describe();
        continue;
      }
      ++subject;
      // Scores that stay far below the cap (scale 1/sqrt(D), random inputs, cap 50) and equal
      // scores are capped into what they were: no defect of the cap shows there.
      const bool must_fail =
          scale_defect || (c.kind != InputKind::kEqualScores && !(c.softcap == 50.0f && c.kind == InputKind::kRandom));
      if (must_fail) {
        EXPECT_TRUE(r.failed("accuracy")) << name << " " << c.describe();
        caught += r.failed("accuracy") ? 1 : 0;
      }
    }
    EXPECT_GE(subject, 8) << name;
    EXPECT_GE(caught, 4) << name;
    EXPECT_GT(others, 10) << name;
  }
}

// --properties: the batch-split kernel (planted: rows depend on their batch) passes when
// batch-invariance is not required, every other property still gating, and the report names
// it as not required with the cases that broke it; a crash gates whatever is required; an
// unknown name is refused.
TEST(KernelCheck, PropertiesNotRequiredAreMeasuredAndReportedButDoNotGate) {
  auto split = load_or_die("batch_split");
  ASSERT_TRUE(split);
  Options all;
  all.isolate = false;
  all.shard_count = 3;
  auto strict = run_kernel_check(*split, all);
  ASSERT_TRUE(strict);
  ASSERT_FALSE(strict->passed());
  Options relaxed = all;
  for (const std::string& p : all_properties())
    if (p != "batch-invariance") relaxed.required_properties.push_back(p);
  auto r = run_kernel_check(*split, relaxed);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->passed()) << r->summary();
  EXPECT_EQ(r->num_failed(), 0);
  EXPECT_EQ(r->num_failed_not_required(), strict->num_failed());
  EXPECT_EQ(r->not_required(), std::vector<std::string>{"batch-invariance"});
  EXPECT_NE(r->summary().find("properties not required (--properties): batch-invariance"), std::string::npos);
  const nlohmann::json j = r->to_json();
  EXPECT_EQ(j["verdict"], "pass");
  EXPECT_EQ(j["summary"]["failed_not_required"], strict->num_failed());
  EXPECT_EQ(j["not_required_properties"], nlohmann::json::array({"batch-invariance"}));
  // Requiring only accuracy does not let a crash through.
  auto crash = load_or_die("crash");
  ASSERT_TRUE(crash);
  Options only_accuracy;
  only_accuracy.required_properties = {"accuracy"};
  only_accuracy.max_failures = 1;
  auto c = run_kernel_check(*crash, only_accuracy);
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->passed());
  EXPECT_TRUE(always_required("crash"));
  Options bogus;
  bogus.required_properties = {"accuracy", "speed"};
  auto b = run_kernel_check(*split, bogus);
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("'speed' is not a property"), std::string::npos) << b.status().message();
}

TEST(KernelCheck, ShardsAreDisjointAndMergeIntoTheWholeGrid) {
  auto plugin = load_or_die("kvproof_cpu");
  ASSERT_TRUE(plugin);
  std::vector<nlohmann::json> shards;
  int64_t total = 0;
  for (int i = 0; i < 3; ++i) {
    Options options;
    options.shard_index = i;
    options.shard_count = 3;
    options.isolate = false;
    auto report = run_kernel_check(*plugin, options);
    ASSERT_TRUE(report);
    total += static_cast<int64_t>(report->cases.size());
    shards.push_back(report->to_json());
  }
  const auto grid = make_grid(Grid::kQuick, plugin->descriptor().kv_dtypes, plugin->descriptor().kv_layouts,
                              /*windows=*/true, /*softcaps=*/true);
  EXPECT_EQ(total, static_cast<int64_t>(grid.size()));
  auto merged = merge_reports(shards);
  ASSERT_TRUE(merged) << merged.status().message();
  EXPECT_EQ((*merged)["summary"]["cases"], total);
  EXPECT_EQ((*merged)["verdict"], "pass");
  shards.pop_back();
  auto incomplete = merge_reports(shards);
  ASSERT_FALSE(incomplete);
  EXPECT_NE(incomplete.status().message().find("shards missing: 2"), std::string::npos);
}

// kernel-check's CUDA path without a GPU: host plug-ins built declaring KVP_DEVICE_CUDA
// (planted.c, KVP_PLANTED_DEVICE), with the CUDA runtime replaced by plugins/fake_cudart.c.
// Every array goes through the runtime's copies, so a defect must be caught on the device
// copies read back, not on the host arrays (which a device kernel cannot touch).
class DevicePath : public testing::Test {
 protected:
  static void SetUpTestSuite() { ::setenv("KVPROOF_CUDART", fake_cudart().c_str(), 1); }
};

TEST_F(DevicePath, NaiveCDeclaredCudaPassesTheQuickGridInEveryLayout) {
  const Report report = quick_grid("naive_c_as_cuda", /*third=*/true);
  EXPECT_TRUE(report.passed()) << report.summary();
  EXPECT_EQ(report.num_skipped(), 0);
}

TEST_F(DevicePath, WritesPastOutAreCaughtInTheDeviceCopysGuardZones) {
  const Report report = quick_grid("write_past_out_as_cuda", /*third=*/false, /*max_failures=*/2);
  EXPECT_GT(failed_properties(report).count("guard-zones"), 0u) << failures_text(report);
}

TEST_F(DevicePath, WritesIntoThePoolAreCaughtOnTheDeviceCopy) {
  const Report report = quick_grid("write_pool_as_cuda", /*third=*/false, /*max_failures=*/2);
  EXPECT_GT(failed_properties(report).count("inputs-unchanged"), 0u) << failures_text(report);
}

TEST_F(DevicePath, NoDeviceIsOneClearErrorBeforeAnyCase) {
  auto plugin = load_or_die("naive_c_as_cuda");
  ASSERT_TRUE(plugin);
  for (bool isolate : {true, false}) {
    ::setenv("KVP_FAKE_CUDART_DEVICES", "0", 1);
    Options options;
    options.isolate = isolate;
    auto report = run_kernel_check(*plugin, options);
    ::unsetenv("KVP_FAKE_CUDART_DEVICES");
    ASSERT_FALSE(report) << "isolate " << isolate;
    EXPECT_NE(report.status().message().find(
                  "runs on CUDA: no CUDA device: cudaGetDeviceCount: no CUDA-capable device is detected"),
              std::string::npos)
        << report.status().message();
    EXPECT_NE(report.status().message().find("naive_c_as_cuda"), std::string::npos) << report.status().message();
  }
}

TEST_F(DevicePath, AMissingRuntimeIsNamedInTheError) {
  // CudaRuntime::open, not shared(): this process may already hold the stand-in.
  ::setenv("KVPROOF_CUDART", "/nonexistent/libcudart.so.12", 1);
  auto rt = CudaRuntime::open();
  ::setenv("KVPROOF_CUDART", fake_cudart().c_str(), 1);
  ASSERT_FALSE(rt);
  EXPECT_NE(rt.status().message().find("no CUDA runtime library (/nonexistent/libcudart.so.12"), std::string::npos)
      << rt.status().message();
  auto fake = CudaRuntime::open();
  ASSERT_TRUE(fake) << fake.status().message();
  EXPECT_EQ(fake.value()->check_device(), "");
}

TEST(AttentionPluginLoader, RefusesAMissingFileNamingIt) {
  auto p = AttentionPlugin::load("/nonexistent/lib.so");
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("/nonexistent/lib.so: no such file"), std::string::npos);
}

TEST(AttentionPluginLoader, RefusesALibraryWithoutTheEntryPoint) {
  auto p = AttentionPlugin::load(plugin_path("no_entry"));
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find(plugin_path("no_entry") +
                                      ": no entry point kvp_attention_plugin_v4 (nor kvp_attention_plugin_v3, "
                                      "kvp_attention_plugin_v2 or kvp_attention_plugin_v1"),
            std::string::npos)
      << p.status().message();
}

TEST(AttentionPluginLoader, RefusesAnotherAbiVersion) {
  auto p = AttentionPlugin::load(plugin_path("abi_v2"));
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("ABI version 2"), std::string::npos) << p.status().message();
}

// ABI version 2 added fp8 pools and their scales at the end of kvp_attention_args, version 3
// the sliding window after them (and supports_window at the end of the descriptor), version 4
// the soft-cap after that (and supports_softcap). Libraries built for versions 1 to 3
// (planted.c's builds: their entry points) still load, without what came later; kvproof's own
// plug-ins are version 4, declaring the fp8 dtypes, the window and the soft-cap.
TEST(AttentionPluginLoader, LoadsVersionOneToFourPlugins) {
  auto v1 = AttentionPlugin::load(plugin_path("naive_c"));
  ASSERT_TRUE(v1) << v1.status().message();
  EXPECT_EQ(v1.value()->descriptor().abi_version, 1u);
  EXPECT_FALSE(has_window(v1.value()->descriptor()));
  EXPECT_FALSE(has_softcap(v1.value()->descriptor()));
  auto v2 = AttentionPlugin::load(plugin_path("naive_c_v2"));
  ASSERT_TRUE(v2) << v2.status().message();
  EXPECT_EQ(v2.value()->descriptor().abi_version, 2u);
  EXPECT_FALSE(has_window(v2.value()->descriptor()));
  auto v3 = AttentionPlugin::load(plugin_path("naive_c_v3"));
  ASSERT_TRUE(v3) << v3.status().message();
  EXPECT_EQ(v3.value()->descriptor().abi_version, 3u);
  EXPECT_TRUE(has_window(v3.value()->descriptor()));
  EXPECT_FALSE(has_softcap(v3.value()->descriptor()));
  auto v4 = AttentionPlugin::load(plugin_path("kvproof_cpu"));
  ASSERT_TRUE(v4) << v4.status().message();
  EXPECT_EQ(v4.value()->descriptor().abi_version, 4u);
  EXPECT_NE(v4.value()->descriptor().kv_dtypes & KVP_DTYPE_BIT(KVP_KV_FP8_E4M3), 0u);
  EXPECT_NE(v4.value()->descriptor().kv_dtypes & KVP_DTYPE_BIT(KVP_KV_FP8_E5M2), 0u);
  EXPECT_TRUE(has_window(v4.value()->descriptor()));
  EXPECT_TRUE(has_softcap(v4.value()->descriptor()));
}

TEST(AttentionPluginLoader, RefusesADescriptorWithoutRun) {
  auto p = AttentionPlugin::load(plugin_path("bad_descriptor"));
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("bad descriptor: run is NULL"), std::string::npos) << p.status().message();
}

TEST(AttentionPluginLoader, RefusesAFileThatIsNotALibrary) {
  auto p = AttentionPlugin::load(source_dir() + "/README.md");
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("README.md: cannot load"), std::string::npos) << p.status().message();
}

// ---- each property's reach, with the naive C kernel wrapped in one defect (issue 43) ----

enum class Defect { kNone, kWriteBeforeOut, kWriteAfterOut, kWriteInput, kLastRowInBatch, kNudgeFirstRow };
// The inputs kWriteInput can write into, in kvp_attention_args' order.
enum class Input { kQuery, kQueryStart, kTokenSeq, kPositions, kContextLens, kBlockTables, kKCache, kVCache };
constexpr Input kInputs[] = {Input::kQuery,       Input::kQueryStart,  Input::kTokenSeq, Input::kPositions,
                             Input::kContextLens, Input::kBlockTables, Input::kKCache,   Input::kVCache};

// The plug-in ABI passes no user pointer, so the wrapper's state is the test's one at a time.
// kWriteInput flips one bit after the first run() of a case and flips it back at the start of
// the next, so the later calls (repeatability, batch invariance) read valid inputs: only the
// inputs-unchanged check, made between the two, sees the write.
struct Wrapper {
  const kvp_attention_plugin* inner = nullptr;
  Defect defect = Defect::kNone;
  Input input = Input::kQuery;
  unsigned char* flipped = nullptr;  // reset before each case
  bool restored = false;
  double nudge = 0.0;  // kNudgeFirstRow: the error added, as a multiple of the row's largest value
};
Wrapper g_wrapper;

// The lowest bit of the last element (its first byte: x86 is little-endian).
template <typename T>
unsigned char* last_element(const T* p, int64_t n) {
  return reinterpret_cast<unsigned char*>(const_cast<T*>(p) + n - 1);
}

int wrapped_run(const kvp_attention_args* a, char* err, size_t err_len) {
  if (g_wrapper.flipped != nullptr && !g_wrapper.restored) {
    *g_wrapper.flipped ^= 0x01;
    g_wrapper.restored = true;
  }
  const int rc = g_wrapper.inner->run(a, err, err_len);
  if (rc != 0) return rc;
  const kvp_attention_shape& s = a->shape;
  const int64_t out_len = static_cast<int64_t>(s.num_tokens) * s.num_heads * s.head_dim;
  switch (g_wrapper.defect) {
    case Defect::kNone: break;
    case Defect::kWriteBeforeOut: a->out[-1] = 0.0f; break;
    case Defect::kWriteAfterOut: a->out[out_len] = 0.0f; break;
    case Defect::kLastRowInBatch: {
      // Batched, the last value of the batch's last row moves by one ulp: a variance only the
      // comparison of the last sequence's last new token (a prefill chunk's) can see.
      const int32_t last = s.num_seqs - 1;
      if (s.num_seqs > 1 && a->query_start[last + 1] - a->query_start[last] > 1)
        a->out[out_len - 1] = std::nextafter(a->out[out_len - 1], INFINITY);
      break;
    }
    case Defect::kNudgeFirstRow: {
      // The first row's largest value moves away from zero by `nudge` times itself.
      int64_t arg = 0;
      for (int64_t d = 1; d < s.head_dim; ++d)
        if (std::abs(a->out[d]) > std::abs(a->out[arg])) arg = d;
      a->out[arg] = static_cast<float>(a->out[arg] * (1.0 + g_wrapper.nudge));
      break;
    }
    case Defect::kWriteInput: {
      if (g_wrapper.flipped != nullptr) break;
      unsigned char* p = nullptr;
      switch (g_wrapper.input) {
        case Input::kQuery: p = last_element(a->query, out_len); break;
        case Input::kQueryStart: p = last_element(a->query_start, s.num_seqs + 1); break;
        case Input::kTokenSeq: p = last_element(a->token_seq, s.num_tokens); break;
        case Input::kPositions: p = last_element(a->positions, s.num_tokens); break;
        case Input::kContextLens: p = last_element(a->context_lens, s.num_seqs); break;
        case Input::kBlockTables:
          p = last_element(a->block_tables, static_cast<int64_t>(s.num_seqs) * s.max_blocks_per_seq);
          break;
        case Input::kKCache: p = last_element(static_cast<const unsigned char*>(a->k_cache), 1); break;
        case Input::kVCache: p = last_element(static_cast<const unsigned char*>(a->v_cache), 1); break;
      }
      *p ^= 0x01;
      g_wrapper.flipped = p;
      break;
    }
  }
  return 0;
}

class WrappedNaiveKernel : public testing::Test {
 protected:
  void SetUp() override {
    inner_ = load_or_die("naive_c");
    ASSERT_NE(inner_, nullptr);
    plugin_ = inner_->descriptor();
    plugin_.run = wrapped_run;
    g_wrapper = {&inner_->descriptor(), Defect::kNone, Input::kQuery, nullptr, false, 0.0};
  }
  void TearDown() override { g_wrapper = {}; }
  // Two sequences, the second a prefill chunk of 9 new tokens across a block boundary.
  static KernelCase batch_case(int32_t layout, int32_t dtype = KVP_KV_F32) {
    KernelCase c;
    c.label = "wrapped";
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.block_size = 16;
    c.kv_dtype = dtype;
    c.kv_layout = layout;
    c.seqs = {{37, 1}, {50, 9}};
    c.seed = 7;
    return c;
  }
  std::unique_ptr<AttentionPlugin> inner_;
  kvp_attention_plugin plugin_{};
};

constexpr int32_t kLayouts[] = {KVP_LAYOUT_KVPROOF, KVP_LAYOUT_FLASHINFER_NHD, KVP_LAYOUT_FLASHINFER_HND,
                                KVP_LAYOUT_VLLM};

TEST_F(WrappedNaiveKernel, WithoutADefectEveryPropertyPasses) {
  for (int32_t layout : kLayouts) {
    const CaseResult r = run_case(plugin_, batch_case(layout));
    EXPECT_FALSE(r.skipped);
    EXPECT_TRUE(r.passed()) << "layout " << layout << ": " << (r.failures.empty() ? "" : r.failures[0].message);
  }
}

TEST_F(WrappedNaiveKernel, GuardZonesOnBothSidesOfOut) {
  g_wrapper.defect = Defect::kWriteBeforeOut;
  CaseResult r = run_case(plugin_, batch_case(KVP_LAYOUT_KVPROOF));
  ASSERT_TRUE(r.failed("guard-zones"));
  EXPECT_NE(r.failures[0].message.find("1 of the 64 floats before out and 0 of those after"), std::string::npos)
      << r.failures[0].message;
  g_wrapper.defect = Defect::kWriteAfterOut;
  r = run_case(plugin_, batch_case(KVP_LAYOUT_KVPROOF));
  ASSERT_TRUE(r.failed("guard-zones"));
  EXPECT_NE(r.failures[0].message.find("0 of the 64 floats before out and 1 of those after"), std::string::npos)
      << r.failures[0].message;
}

TEST_F(WrappedNaiveKernel, InputsUnchangedCoversEveryInputAndBothPoolsInEveryLayout) {
  g_wrapper.defect = Defect::kWriteInput;
  for (int32_t layout : kLayouts) {
    const bool combined = layout == KVP_LAYOUT_FLASHINFER_NHD || layout == KVP_LAYOUT_FLASHINFER_HND;
    for (Input input : kInputs) {
      g_wrapper.input = input;
      g_wrapper.flipped = nullptr;
      g_wrapper.restored = false;
      const std::string want = input == Input::kQuery         ? "query"
                               : input == Input::kBlockTables ? "block_tables"
                               : input == Input::kKCache      ? (combined ? "the KV pool" : "the K pool")
                               : input == Input::kVCache      ? (combined ? "the KV pool" : "the V pool")
                                                              : "the batch metadata";
      SCOPED_TRACE("layout " + std::to_string(layout) + ", input " + std::to_string(static_cast<int>(input)));
      const CaseResult r = run_case(plugin_, batch_case(layout));
      ASSERT_TRUE(r.failed("inputs-unchanged"));
      for (const Failure& f : r.failures) {
        if (f.property == "inputs-unchanged") {
          EXPECT_NE(f.message.find(want), std::string::npos) << f.message;
        }
      }
    }
  }
}

TEST_F(WrappedNaiveKernel, BatchInvarianceComparesEveryRowOfAPrefillChunk) {
  g_wrapper.defect = Defect::kLastRowInBatch;
  for (int32_t dtype : {KVP_KV_F32, KVP_KV_BF16}) {
    const CaseResult r = run_case(plugin_, batch_case(KVP_LAYOUT_KVPROOF, dtype));
    EXPECT_TRUE(r.failed("batch-invariance")) << "dtype " << dtype;
    EXPECT_FALSE(r.failed("accuracy")) << "dtype " << dtype;  // one ulp is within every tolerance
  }
}

// accuracy's tolerance on both sides: an error of 0.9 times the dtype's tolerance passes, 1.1
// times fails (f32 1e-4, f16 2e-3, bf16 1.6e-2: docs/plugins.md).
TEST_F(WrappedNaiveKernel, AccuracyPassesJustUnderItsToleranceAndFailsJustOver) {
  g_wrapper.defect = Defect::kNudgeFirstRow;
  for (const auto& [dtype, tolerance] :
       {std::pair{KVP_KV_F32, 1e-4}, std::pair{KVP_KV_F16, 2e-3}, std::pair{KVP_KV_BF16, 1.6e-2}}) {
    SCOPED_TRACE("dtype " + std::to_string(dtype));
    g_wrapper.nudge = 0.9 * tolerance;
    CaseResult r = run_case(plugin_, batch_case(KVP_LAYOUT_KVPROOF, dtype));
    EXPECT_FALSE(r.failed("accuracy")) << r.max_rel_error;
    EXPECT_GT(r.max_rel_error, 0.8 * tolerance);
    g_wrapper.nudge = 1.1 * tolerance;
    r = run_case(plugin_, batch_case(KVP_LAYOUT_KVPROOF, dtype));
    EXPECT_TRUE(r.failed("accuracy")) << r.max_rel_error;
  }
}

}  // namespace
}  // namespace kvp::verify::kernel_check
