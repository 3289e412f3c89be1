// The properties of one case (kernel_check.h lists them) and run_case, which checks them all.
#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "common/dtype.h"
#include "kernel_check/case_run.h"

namespace kvp::verify::kernel_check {

namespace {

using FailFn = std::function<void(const char*, std::string)>;

// guard-zones: the floats on each side of `out` unchanged; inputs-unchanged: the host arrays
// (and a CUDA plug-in's device copies, read back) as they were given.
void check_guards_and_inputs(const KernelCase& c, const Inputs& in, const Inputs& pristine, Output& first, int64_t n,
                             const FailFn& fail) {
  int64_t before = 0, after = 0;
  for (int64_t i = 0; i < kGuardFloats; ++i) {
    before += float_bits(first.buffer[static_cast<std::size_t>(i)]) != kGuardBits ? 1 : 0;
    after += float_bits(first.buffer[static_cast<std::size_t>(kGuardFloats + n + i)]) != kGuardBits ? 1 : 0;
  }
  if (before + after > 0)
    fail("guard-zones", std::to_string(before) + " of the " + std::to_string(kGuardFloats) + " floats before out and " +
                            std::to_string(after) + " of those after it were written");
  std::vector<std::string> changed;
  if (in.k_pool != pristine.k_pool) changed.push_back(combined_pool(c.kv_layout) ? "the KV pool" : "the K pool");
  if (in.v_pool != pristine.v_pool) changed.push_back("the V pool");
  if (in.query != pristine.query) changed.push_back("query");
  if (in.block_tables != pristine.block_tables) changed.push_back("block_tables");
  if (in.positions != pristine.positions || in.token_seq != pristine.token_seq ||
      in.query_start != pristine.query_start || in.context_lens != pristine.context_lens)
    changed.push_back("the batch metadata");
  for (const std::string& name : first.inputs_changed)  // a CUDA plug-in's device copies
    if (std::find(changed.begin(), changed.end(), name) == changed.end()) changed.push_back(name);
  if (!changed.empty()) {
    std::string what;
    for (const std::string& s : changed) what += (what.empty() ? "" : ", ") + s;
    fail("inputs-unchanged", "run() wrote into its inputs: " + what);
  }
}

// no-poison-leak / finite-output: a non-finite value, and what it becomes with the poison at 0.
void check_non_finite(const kvp_attention_plugin& plugin, const KernelCase& c, const Inputs& in, const Inputs& pristine,
                      const float* out, int64_t n, const FailFn& fail) {
  const int64_t non_finite = count_non_finite(out, n);
  if (non_finite == 0) return;
  int64_t first_bad = 0;
  while (std::isfinite(out[first_bad])) ++first_bad;
  Inputs zero = pristine;
  fill_pool(c, zero, /*nan_poison=*/false);
  Output again = call_plugin(plugin, zero);
  const int64_t still = again.status == 0 ? count_non_finite(again.out(), n) : n;
  const std::string where = std::to_string(non_finite) + " non-finite output values, the first at " +
                            row_name(c, in, first_bad / c.head_dim) + " dim " + std::to_string(first_bad % c.head_dim);
  if (still == 0)
    fail("no-poison-leak", where +
                               "; with the poisoned (unused and padding) slots 0 instead of NaN every value is "
                               "finite: the kernel read a slot outside the context");
  else
    fail("finite-output", where + " from finite inputs (still " + std::to_string(still) +
                              " with the poison at 0): overflow, or 0/0 in the softmax");
}

// accuracy, on the finite rows: the worst error relative to its row's largest reference value.
void check_accuracy(const KernelCase& c, const Inputs& in, const std::vector<double>& ref, const float* out,
                    CaseResult& r, const FailFn& fail) {
  const int64_t row_len = c.head_dim;
  const int64_t n = static_cast<int64_t>(ref.size());
  double worst = 0.0;
  int64_t worst_row = -1;
  double worst_got = 0.0, worst_want = 0.0;
  for (int64_t row = 0; row * row_len < n; ++row) {
    double largest = 0.0, err = 0.0;
    bool finite = true;
    int64_t arg = 0;
    for (int64_t d = 0; d < row_len; ++d) {
      const std::size_t i = static_cast<std::size_t>(row * row_len + d);
      largest = std::max(largest, std::abs(ref[i]));
      if (!std::isfinite(out[i])) finite = false;
      const double e = std::abs(static_cast<double>(out[i]) - ref[i]);
      if (e > err) {
        err = e;
        arg = d;
      }
    }
    if (!finite) continue;
    const double rel = err / std::max(largest, 1e-30);
    r.max_error_ulps = std::max(r.max_error_ulps, err / ulp_of(largest, c.kv_dtype));
    if (rel > worst) {
      worst = rel;
      worst_row = row;
      worst_got = out[row * row_len + arg];
      worst_want = ref[static_cast<std::size_t>(row * row_len + arg)];
    }
  }
  r.max_rel_error = worst;
  if (worst > tolerance(c.kv_dtype)) {
    std::ostringstream o;
    o << "error " << worst << " relative to the row's largest reference value (tolerance " << tolerance(c.kv_dtype)
      << " for " << dtype_name(c.kv_dtype) << ") at " << row_name(c, in, worst_row) << ": got " << worst_got
      << ", fp64 reference " << worst_want;
    fail("accuracy", o.str());
  }
}

// batch-invariance: each sequence alone, bit for bit its rows in the batch.
void check_batch_invariance(const kvp_attention_plugin& plugin, const KernelCase& c, const Inputs& in, const float* out,
                            const FailFn& fail) {
  if (c.seqs.size() < 2) return;
  const int64_t row_len = c.head_dim;
  for (std::size_t s = 0; s < c.seqs.size(); ++s) {
    const int32_t t0 = in.query_start[s], t1 = in.query_start[s + 1];
    kvp_attention_shape alone = in.shape;
    alone.num_seqs = 1;
    alone.num_tokens = t1 - t0;
    alone.max_context_len = in.context_lens[s];
    const std::vector<int32_t> qs = {0, t1 - t0};
    const std::vector<int32_t> seq0(static_cast<std::size_t>(t1 - t0), 0);
    const int64_t offset = static_cast<int64_t>(t0) * c.num_heads * row_len;
    Output o = call_plugin(plugin, in, alone, in.query.data() + offset, qs.data(), seq0.data(),
                           in.positions.data() + t0, in.context_lens.data() + s,
                           in.block_tables.data() + s * static_cast<std::size_t>(in.shape.max_blocks_per_seq));
    const int64_t len = static_cast<int64_t>(t1 - t0) * c.num_heads * row_len;
    if (o.status != 0 || !same_bits(o.out(), out + offset, len)) {
      fail("batch-invariance", o.status != 0 ? "run() failed on sequence " + std::to_string(s) + " alone: " + o.error
                                             : "sequence " + std::to_string(s) + " (context " +
                                                   std::to_string(in.context_lens[s]) +
                                                   ") alone differs in its bits from the same sequence in the batch");
      return;
    }
  }
}

}  // namespace

CaseResult run_case(const kvp_attention_plugin& plugin, const KernelCase& c) {
  const auto start = Clock::now();
  CaseResult r;
  const FailFn fail = [&r](const char* property, std::string message) {
    r.failures.push_back({property, std::move(message)});
  };
  Inputs in = make_inputs(c);
  if (!plugin_takes(plugin, c, in.shape)) {
    r.skipped = true;
    return r;
  }
  fill_pool(c, in, /*nan_poison=*/true);
  const Inputs pristine = in;
  const std::vector<double> ref = reference_attention(c, in);
  const int64_t n = static_cast<int64_t>(ref.size());

  Output first = call_plugin(plugin, in);
  if (first.status != 0) {
    fail("run-error", std::string(c.softcap > 0.0f ? "supports() and supports_softcap() accepted"
                                  : c.window > 0   ? "supports() and supports_window() accepted"
                                                   : "supports() accepted") +
                          " the shape but run() returned " + std::to_string(first.status) + ": " + first.error);
    r.seconds = seconds_since(start);
    return r;
  }
  check_guards_and_inputs(c, in, pristine, first, n, fail);
  check_non_finite(plugin, c, in, pristine, first.out(), n, fail);
  check_accuracy(c, in, ref, first.out(), r, fail);
  Output second = call_plugin(plugin, in);
  if (second.status != 0 || !same_bits(first.out(), second.out(), n))
    fail("repeatability", second.status != 0 ? "the second run() failed: " + second.error
                                             : "the same batch run twice gave different bits");
  check_batch_invariance(plugin, c, in, first.out(), fail);
  r.seconds = seconds_since(start);
  return r;
}

}  // namespace kvp::verify::kernel_check
