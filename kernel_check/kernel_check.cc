// kernel-check's harness: the cases in a forked worker with a time limit each (CaseWorker),
// the run over the grid or a shard of it, the report (text, JSON, JUnit, Markdown) and the
// merge of shard reports. The grid is grid.cc, a case's properties properties.cc, its inputs,
// reference and plug-in call case_run.{h,cc}.
#include "kernel_check/kernel_check.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "common/dtype.h"
#include "common/report.h"
#include "common/rng.h"
#include "kernel_check/case_run.h"
#include "kernel_check/cuda_runtime.h"

namespace kvp::verify::kernel_check {

namespace {
// Every property a case can fail, in the order the summary and the plots list them.
constexpr const char* kProperties[] = {
    "accuracy",         "no-poison-leak", "finite-output", "guard-zones", "inputs-unchanged",
    "batch-invariance", "repeatability",  "run-error",     "crash",       "timeout"};
}  // namespace

const std::vector<std::string>& all_properties() {
  static const std::vector<std::string> all(std::begin(kProperties), std::end(kProperties));
  return all;
}

bool always_required(const std::string& property) {
  return property == "run-error" || property == "crash" || property == "timeout";
}

Status check_property_names(const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    const auto& all = all_properties();
    if (std::find(all.begin(), all.end(), n) == all.end()) {
      std::string known;
      for (const std::string& p : all) known += (known.empty() ? "" : ", ") + p;
      return Status::error("--properties: '" + n + "' is not a property (" + known + ")");
    }
  }
  return Status::ok();
}

bool Report::gates(const std::string& property) const {
  return required.empty() || always_required(property) ||
         std::find(required.begin(), required.end(), property) != required.end();
}

bool Report::case_failed(const CaseResult& r) const {
  return std::any_of(r.failures.begin(), r.failures.end(), [&](const Failure& f) { return gates(f.property); });
}

std::vector<std::string> Report::not_required() const {
  std::vector<std::string> out;
  for (const std::string& p : all_properties())
    if (!gates(p)) out.push_back(p);
  return out;
}

int64_t Report::num_failed_not_required() const {
  return std::count_if(cases.begin(), cases.end(),
                       [&](const CaseRecord& c) { return !c.result.failures.empty() && !case_failed(c.result); });
}

namespace {

nlohmann::json result_to_json(const CaseResult& r, bool failed) {
  nlohmann::json failures = nlohmann::json::array();
  for (const Failure& f : r.failures) failures.push_back({{"property", f.property}, {"message", f.message}});
  return {{"status", r.skipped ? "skip"
                     : failed  ? "fail"
                               : "pass"},
          {"failures", failures},
          {"max_rel_error", r.max_rel_error},
          {"max_error_ulps", r.max_error_ulps},
          {"seconds", r.seconds}};
}

CaseResult result_from_json(const nlohmann::json& j) {
  CaseResult r;
  r.skipped = j.at("status") == "skip";
  for (const auto& f : j.at("failures"))
    r.failures.push_back({f.at("property").get<std::string>(), f.at("message").get<std::string>()});
  r.max_rel_error = j.at("max_rel_error");
  r.max_error_ulps = j.at("max_error_ulps");
  r.seconds = j.at("seconds");
  return r;
}

}  // namespace

namespace {

void write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

// The worker: a forked child that runs cases in a loop. It reads a case index (8 bytes) from
// its socket, runs that case in its own process and answers with the result as one line of
// JSON; it exits when the socket closes. Forked from this process after the grid is made, so
// it has the cases and the loaded plug-in; a CUDA plug-in initialises CUDA in the worker, once
// per worker instead of once per case (0.32 s a case on an H200, issue 42).
CaseWorker::CaseWorker(const kvp_attention_plugin& plugin, const std::vector<KernelCase>& cases)
    : plugin_(plugin), cases_(cases) {}

CaseWorker::~CaseWorker() { stop(); }

int CaseWorker::stop() {
  if (pid_ < 0) return 0;
  close(fd_);  // the worker reads EOF and exits
  fd_ = -1;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return status;
}

std::string CaseWorker::start() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    return std::string("socketpair() failed: ") + std::strerror(errno);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return std::string("fork() failed: ") + std::strerror(errno);
  }
  if (pid == 0) {
    close(fds[0]);
    // The kernel's fault is reported as its signal, not through a sanitizer's handler.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, SIG_DFL);
    for (;;) {
      uint64_t index = 0;
      std::size_t got = 0;
      while (got < sizeof index) {
        const ssize_t n = read(fds[1], reinterpret_cast<char*>(&index) + got, sizeof index - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) _exit(0);
        got += static_cast<std::size_t>(n);
      }
      if (index >= cases_.size()) _exit(3);
      // The worker's status is the measured one; the parent's report decides what gates.
      const CaseResult measured = run_case(plugin_, cases_[index]);
      const std::string line = result_to_json(measured, !measured.passed()).dump() + "\n";
      write_all(fds[1], line.data(), line.size());
    }
  }
  close(fds[1]);
  pid_ = pid;
  fd_ = fds[0];
  ++started_;
  return "";
}

CaseResult CaseWorker::run(std::size_t index, double timeout_s) {
  const auto start_time = Clock::now();
  CaseResult r;
  if (pid_ < 0) {
    if (std::string why = start(); !why.empty()) {
      r.failures.push_back({"crash", why});
      return r;
    }
  }
  const uint64_t wire = index;
  write_all(fd_, &wire, sizeof wire);
  std::string text;
  bool timed_out = false, eof = false;
  char buf[4096];
  while (text.find('\n') == std::string::npos) {
    const double left = timeout_s - seconds_since(start_time);
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t got = read(fd_, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {  // the worker died
      eof = true;
      break;
    }
    text.append(buf, static_cast<std::size_t>(got));
  }
  if (timed_out || eof) {
    // The worker is gone or stuck in the kernel: kill it; the next case gets a fresh one.
    if (timed_out) kill(pid_, SIGKILL);
    const int status = stop();
    if (timed_out) {
      r.failures.push_back({"timeout", "the case ran past its time limit of " + std::to_string(timeout_s) +
                                           " s (killed; --timeout sets the limit)"});
    } else if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      r.failures.push_back({"crash", "the kernel's process died by signal " + std::to_string(sig) + " (" +
                                         std::string(strsignal(sig)) + ")"});
    } else {
      r.failures.push_back({"crash", "the kernel's process exited with status " +
                                         std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                                         " without a result"});
    }
  } else {
    try {
      r = result_from_json(nlohmann::json::parse(text.substr(0, text.find('\n'))));
    } catch (const std::exception& e) {
      r = CaseResult{};
      r.failures.push_back({"crash", std::string("the kernel's process answered what is not a result: ") + e.what()});
      stop();
    }
  }
  r.seconds = seconds_since(start_time);
  return r;
}

CaseResult run_case_isolated(const kvp_attention_plugin& plugin, const KernelCase& c, double timeout_s) {
  const std::vector<KernelCase> one{c};
  CaseWorker worker(plugin, one);
  return worker.run(0, timeout_s);
}

int64_t Report::num_failed() const {
  return std::count_if(cases.begin(), cases.end(), [&](const CaseRecord& c) { return case_failed(c.result); });
}
int64_t Report::num_skipped() const {
  return std::count_if(cases.begin(), cases.end(), [](const CaseRecord& c) { return c.result.skipped; });
}

nlohmann::json Report::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  std::map<std::string, int64_t> by_property;
  double worst[5] = {0, 0, 0, 0, 0};
  for (const CaseRecord& c : cases) {
    nlohmann::json j = c.spec.to_json();
    j.update(result_to_json(c.result, case_failed(c.result)));
    j["reproduce"] = c.reproduce;
    list.push_back(j);
    std::set<std::string> seen;
    for (const Failure& f : c.result.failures)
      if (seen.insert(f.property).second) ++by_property[f.property];
    if (c.spec.kv_dtype >= 0 && c.spec.kv_dtype < 5)
      worst[c.spec.kv_dtype] = std::max(worst[c.spec.kv_dtype], c.result.max_rel_error);
  }
  nlohmann::json failed = nlohmann::json::object();
  for (const auto& [p, k] : by_property) failed[p] = k;
  const int64_t n = static_cast<int64_t>(cases.size());
  return {{"schema", "kvproof.kernel-check"},
          {"version", 1},
          {"plugin", {{"path", plugin_path}, {"name", plugin_name}}},
          {"grid", grid_name(grid)},
          {"shard", {{"index", shard_index}, {"count", shard_count}}},
          {"required_properties", required.empty() ? all_properties() : required},
          {"not_required_properties", not_required()},
          {"tolerance",
           {{"f32", tolerance(KVP_KV_F32)},
            {"f16", tolerance(KVP_KV_F16)},
            {"bf16", tolerance(KVP_KV_BF16)},
            {"fp8-e4m3", tolerance(KVP_KV_FP8_E4M3)},
            {"fp8-e5m2", tolerance(KVP_KV_FP8_E5M2)}}},
          {"max_rel_error",
           {{"f32", worst[0]}, {"f16", worst[1]}, {"bf16", worst[2]}, {"fp8-e4m3", worst[3]}, {"fp8-e5m2", worst[4]}}},
          {"summary",
           {{"cases", n},
            {"passed", n - num_failed() - num_skipped()},
            {"failed", num_failed()},
            {"failed_not_required", num_failed_not_required()},
            {"skipped", num_skipped()},
            {"failed_by_property", failed},
            {"seconds", seconds},
            {"workers_started", workers_started}}},
          {"verdict", passed() ? "pass" : "fail"},
          {"cases", list}};
}

std::string Report::to_junit() const {
  std::vector<JUnitCase> list;
  for (const CaseRecord& c : cases) {
    JUnitCase j;
    j.name = "case " + std::to_string(c.spec.id) + " " + c.spec.label;
    if (case_failed(c.result)) {
      std::string message;
      for (const Failure& f : c.result.failures) message += f.property + ": " + f.message + "\n";
      j.failure = message;
      j.system_out = c.spec.describe() + "\nre-run alone: " + c.reproduce + "\n";
    }
    list.push_back(std::move(j));
  }
  return junit_xml("kernel-check " + plugin_name, list);
}

std::string Report::summary() const {
  std::ostringstream o;
  std::map<std::string, int64_t> by_property;
  for (const CaseRecord& c : cases) {
    if (c.result.passed()) continue;
    o << (case_failed(c.result) ? "FAIL " : "NOT REQUIRED ") << c.spec.describe() << "\n";
    std::set<std::string> seen;
    for (const Failure& f : c.result.failures) {
      o << "  " << f.property << ": " << f.message << "\n";
      if (seen.insert(f.property).second) ++by_property[f.property];
    }
    o << "  re-run alone: " << c.reproduce << "\n";
  }
  const int64_t n = static_cast<int64_t>(cases.size());
  o << "kernel-check " << plugin_name << " (" << plugin_path << "), grid " << grid_name(grid);
  if (shard_count > 1) o << " shard " << shard_index << "/" << shard_count;
  o << ": " << n << " cases, " << (n - num_failed() - num_skipped()) << " passed, " << num_failed() << " failed, "
    << num_skipped() << " skipped (declined by supports()) in " << seconds << " s";
  if (workers_started > 0)
    o << ", " << workers_started
      << (workers_started == 1 ? " worker process" : " worker processes (a fresh one after each crash or timeout)");
  o << "\n";
  for (const auto& [p, k] : by_property)
    o << "  " << p << ": " << k << " cases" << (gates(p) ? "" : " (not required: measured, not gating)") << "\n";
  if (!required.empty()) {
    std::string list;
    for (const std::string& p : not_required()) list += (list.empty() ? "" : ", ") + p;
    o << "properties not required (--properties): " << (list.empty() ? "none" : list) << "\n";
  }
  if (num_failed() == 0 && !passed()) o << "nothing was checked: supports() declined every case\n";
  o << (passed() ? "PASS" : "FAIL") << "\n";
  return o.str();
}

Summary Report::to_summary(std::string reproducer) const {
  Summary s;
  s.title = "kvproof kernel-check";
  s.passed = passed();
  s.reproducer = std::move(reproducer);
  const int64_t n = static_cast<int64_t>(cases.size()), ran = n - num_skipped();
  s.verdict_detail = std::to_string(n) + " cases: " + std::to_string(ran - num_failed()) + " passed, " +
                     std::to_string(num_failed()) + " failed, " + std::to_string(num_skipped()) +
                     " skipped (declined by supports())" + (ran == 0 ? "; nothing was checked" : "") +
                     (num_failed_not_required() > 0 ? "; " + std::to_string(num_failed_not_required()) +
                                                          " more broke only properties not required (--properties)"
                                                    : "");
  s.context = {"plug-in " + plugin_name + " (" + plugin_path + "), grid " + grid_name(grid) +
               (shard_count > 1 ? ", shard " + std::to_string(shard_index) + "/" + std::to_string(shard_count) : "")};
  s.rows_title = "Properties";
  s.columns = {"cases failed", "cases run"};
  double worst = 0.0;
  for (const CaseRecord& c : cases) worst = std::max(worst, c.result.max_rel_error);
  for (const char* property : kProperties) {
    int64_t failed = 0;
    const CaseRecord* first = nullptr;
    std::string message;
    for (const CaseRecord& c : cases) {
      for (const Failure& f : c.result.failures) {
        if (f.property != property) continue;
        if (first == nullptr) {
          first = &c;
          message = "case " + std::to_string(c.spec.id) + ": " + f.message;
        }
        ++failed;
        break;
      }
    }
    std::string detail = message;
    if (detail.empty() && std::string(property) == "accuracy" && ran > 0) {
      std::ostringstream o;
      o << "worst error " << worst << " of the row's largest reference value";
      detail = o.str();
    }
    if (!gates(property)) {
      std::string note = "not required (--properties): measured, not gating";
      if (!detail.empty()) note += "; " + detail;
      detail = note;
    }
    s.rows.push_back({property,
                      !gates(property) ? "not required"
                      : failed > 0     ? "FAIL"
                      : ran > 0        ? "PASS"
                                       : "n/a",
                      {std::to_string(failed), std::to_string(ran)},
                      detail,
                      first != nullptr ? first->reproduce : ""});
  }
  constexpr int kShown = 20;
  int shown = 0;
  for (const CaseRecord& c : cases) {
    if (!case_failed(c.result) || shown++ >= kShown) continue;
    std::string what;
    for (const Failure& f : c.result.failures) what += (what.empty() ? "" : ", ") + f.property;
    s.notes.push_back("FAIL " + c.spec.describe() + " (" + what + "): " + c.reproduce);
  }
  if (shown > kShown) s.notes.push_back(std::to_string(shown - kShown) + " more failing cases: see the JSON report");
  return s;
}

std::vector<Plot> Report::plots() const {
  Plot error("scatter", "Error against the fp64 reference, by case", "case id",
             "worst |kernel - ref| / max |ref| of a row", true);
  std::map<std::string, std::size_t> series_of;  // scenario -> its series
  PlotSeries failing("failed (any property)");
  for (const CaseRecord& c : cases) {
    if (c.result.skipped) continue;
    const std::string label = c.result.passed() ? c.spec.label : std::string();
    if (label.empty()) {
      failing.x.push_back(static_cast<double>(c.spec.id));
      failing.y.push_back(c.result.max_rel_error);
      continue;
    }
    auto [it, added] = series_of.try_emplace(label, error.series.size());
    if (added) error.series.emplace_back(label);
    error.series[it->second].x.push_back(static_cast<double>(c.spec.id));
    error.series[it->second].y.push_back(c.result.max_rel_error);
  }
  if (!failing.x.empty()) error.series.push_back(std::move(failing));
  error.caption =
      "Each case's worst row error, one colour per scenario of the grid; failing cases in their own colour. A "
      "scenario standing above the rest (long contexts, partition edges) is where the kernel's reduction drifts.";
  Plot by_property("bar", "Failing cases per property", "property", "cases");
  PlotSeries failed("cases failed");
  for (const char* property : kProperties) {
    by_property.categories.push_back(property);
    failed.y.push_back(static_cast<double>(
        std::count_if(cases.begin(), cases.end(), [&](const CaseRecord& c) { return c.result.failed(property); })));
  }
  by_property.series.push_back(std::move(failed));
  by_property.caption = "Every bar should be 0. A case counts once under each property it failed.";
  if (error.series.empty()) return {by_property};
  return {error, by_property};
}

Result<Report> run_kernel_check(const AttentionPlugin& plugin, const Options& options,
                                const std::function<void(const CaseRecord&)>& on_case) {
  const kvp_attention_plugin& d = plugin.descriptor();
  if (d.device == KVP_DEVICE_CUDA) {
    // Without isolation the cases run here, so the probe may too; with it, a child probes, so
    // that this process never initialises CUDA and its per-case children can.
    std::string why;
    if (!options.isolate) {
      const CudaRuntime* rt = CudaRuntime::shared(why);
      if (rt != nullptr) why = rt->check_device();
    } else {
      why = probe_device_in_child();
    }
    if (!why.empty())
      return Status::error("attention plug-in " + plugin.path() + " (" + plugin.name() + ") runs on CUDA: " + why);
  }
  if (options.shard_count < 1 || options.shard_index < 0 || options.shard_index >= options.shard_count)
    return Status::error("--shard " + std::to_string(options.shard_index) + "/" + std::to_string(options.shard_count) +
                         ": want I/N with 0 <= I < N");
  const std::vector<KernelCase> grid =
      make_grid(options.grid, d.kv_dtypes, d.kv_layouts, has_window(d), has_softcap(d));
  if (options.case_id && (*options.case_id < 0 || *options.case_id >= static_cast<int64_t>(grid.size())))
    return Status::error("--case " + std::to_string(*options.case_id) + ": the " + grid_name(options.grid) +
                         " grid for this plug-in has cases 0.." + std::to_string(grid.size() - 1));
  const auto start = Clock::now();
  Report report;
  report.plugin_path = plugin.path();
  report.plugin_name = plugin.name();
  report.grid = options.grid;
  report.shard_index = options.shard_index;
  report.shard_count = options.shard_count;
  KVP_RETURN_IF_ERROR(check_property_names(options.required_properties));
  report.required = options.required_properties;
  CaseWorker worker(d, grid);
  for (std::size_t i = 0; i < grid.size(); ++i) {
    const KernelCase& c = grid[i];
    if (options.case_id ? c.id != *options.case_id : shard_of(c.id, options.shard_count) != options.shard_index)
      continue;
    CaseRecord record;
    record.spec = c;
    record.result = options.isolate ? worker.run(i, options.timeout_s) : run_case(d, c);
    record.reproduce = "kvproof kernel-check --plugin " + plugin.path() + " --grid " + grid_name(options.grid) +
                       " --case " + std::to_string(c.id);
    if (!options.required_properties.empty()) {
      std::string list;
      for (const std::string& p : options.required_properties) list += (list.empty() ? "" : ",") + p;
      record.reproduce += " --properties " + list;
    }
    if (on_case) on_case(record);
    report.cases.push_back(std::move(record));
    if (options.max_failures > 0 && report.num_failed() >= options.max_failures) break;
  }
  report.seconds = seconds_since(start);
  report.workers_started = worker.started();
  return report;
}

Result<nlohmann::json> merge_reports(const std::vector<nlohmann::json>& reports) {
  if (reports.empty()) return Status::error("--merge: no reports");
  try {
    const nlohmann::json& first = reports.front();
    const int64_t count = first.at("shard").at("count");
    std::set<int64_t> shards;
    nlohmann::json cases = nlohmann::json::array();
    std::map<std::string, int64_t> by_property;
    int64_t failed = 0, skipped = 0, failed_not_required = 0;
    double seconds = 0.0;
    for (std::size_t i = 0; i < reports.size(); ++i) {
      const nlohmann::json& r = reports[i];
      auto bad = [&](const std::string& why) { return Status::error("report " + std::to_string(i + 1) + ": " + why); };
      if (r.at("schema") != "kvproof.kernel-check" || r.at("version") != 1) return bad("not a kernel-check v1 report");
      if (r.at("plugin").at("name") != first.at("plugin").at("name"))
        return bad("plug-in " + r.at("plugin").at("name").get<std::string>() + ", the first report's is " +
                   first.at("plugin").at("name").get<std::string>());
      if (r.at("grid") != first.at("grid")) return bad("another grid than the first report's");
      if (r.at("shard").at("count") != count) return bad("a shard of another count than the first report's");
      if (r.value("required_properties", nlohmann::json()) != first.value("required_properties", nlohmann::json()))
        return bad("other --properties than the first report's");
      const int64_t index = r.at("shard").at("index");
      if (!shards.insert(index).second) return bad("shard " + std::to_string(index) + " given twice");
      for (const auto& c : r.at("cases")) {
        cases.push_back(c);
        if (c.at("status") == "fail") ++failed;
        if (c.at("status") == "skip") ++skipped;
        if (c.at("status") == "pass" && !c.at("failures").empty()) ++failed_not_required;
        std::set<std::string> seen;
        for (const auto& f : c.at("failures"))
          if (seen.insert(f.at("property").get<std::string>()).second)
            ++by_property[f.at("property").get<std::string>()];
      }
      seconds += r.at("summary").at("seconds").get<double>();
    }
    std::string missing;
    for (int64_t s = 0; s < count; ++s)
      if (!shards.count(s)) missing += (missing.empty() ? "" : ", ") + std::to_string(s);
    if (!missing.empty()) return Status::error("--merge: shards missing: " + missing + " of " + std::to_string(count));
    std::sort(cases.begin(), cases.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a.at("id").get<int64_t>() < b.at("id").get<int64_t>();
    });
    nlohmann::json failed_by = nlohmann::json::object();
    for (const auto& [p, k] : by_property) failed_by[p] = k;
    nlohmann::json merged = first;
    merged["shard"] = {{"index", 0}, {"count", 1}, {"merged_from", count}};
    merged["cases"] = cases;
    const int64_t n = static_cast<int64_t>(cases.size());
    merged["summary"] = {{"cases", n},         {"passed", n - failed - skipped},
                         {"failed", failed},   {"failed_not_required", failed_not_required},
                         {"skipped", skipped}, {"failed_by_property", failed_by},
                         {"seconds", seconds}};
    merged["verdict"] = failed == 0 && skipped < n ? "pass" : "fail";
    merged.erase("max_rel_error");
    return merged;
  } catch (const nlohmann::json::exception& e) {
    return Status::error(std::string("--merge: malformed report: ") + e.what());
  }
}

}  // namespace kvp::verify::kernel_check
