#include "verify/oracle_checks.h"

#include <algorithm>
#include <cmath>

#include <openssl/evp.h>

#include "verify/verify.h"

namespace kvp::verify {

namespace {

RowDigest digest_row(const std::vector<float>& row) {
  RowDigest d{};
  unsigned int len = 0;
  KVP_CHECK(EVP_Digest(row.data(), row.size() * sizeof(float), d.data(), &len, EVP_sha256(), nullptr) == 1);
  return d;
}

int64_t row_bytes(const OracleJob& job) {
  int64_t bytes = 0;
  for (const std::vector<float>& row : job.rows) bytes += static_cast<int64_t>(row.size() * sizeof(float));
  return bytes;
}

// Positions 0..n-1 of `tokens` and `other` agree.
int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const auto n = std::min(a.size(), b.size());
  std::size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

// The oracle's verdict on each of the job's rows at positions cache.length()..last: the
// oracle runs on from the cache a chunk of positions at a time (the same bits as all at
// once: ReferenceModel's logits do not depend on the split), one block of its matrix
// products per chunk, so only a chunk's fp64 logits are held at once. 32 positions: the
// products are near their best speed there, and a chunk's logits stay small beside the
// weights (32 x vocab fp64: 12.6 MB for SmolLM2's vocabulary).
Status run_oracle(const ReferenceModel<double>& oracle, const OracleJob& job, DenseKVCache<double>& cache,
                  std::vector<RowComparison>& out) {
  constexpr int64_t kOracleChunk = 32;
  const auto last = static_cast<int64_t>(job.rows.size()) - 1;
  const int64_t vocab = oracle.config().vocab_size;
  for (int64_t begin = cache.length(); begin <= last; begin += kOracleChunk) {
    const int64_t n = std::min(kOracleChunk, last + 1 - begin);
    auto ref = oracle.forward(std::span<const int32_t>(job.tokens.data() + begin, static_cast<std::size_t>(n)), cache);
    if (!ref) return ref.status();
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<float>& got = job.rows[static_cast<std::size_t>(begin + i)];
      if (got.empty()) continue;
      RowComparison& c = out[static_cast<std::size_t>(begin + i)];
      c.present = true;
      c.scale = ref->row(i).cwiseAbs().maxCoeff();
      for (int64_t v = 0; v < vocab; ++v) {
        const double d = std::abs(static_cast<double>(got[static_cast<std::size_t>(v)]) - (*ref)(i, v));
        c.err = std::max(c.err, std::isnan(d) ? INFINITY : d);
      }
      Eigen::Index best = 0;
      ref->row(i).maxCoeff(&best);
      double second = -INFINITY;
      for (int64_t v = 0; v < vocab; ++v)
        if (v != best) second = std::max(second, (*ref)(i, v));
      c.best = best;
      c.margin = (*ref)(i, best) - second;
    }
  }
  return Status::ok();
}

}  // namespace

std::optional<OracleJob> OracleJob::of(const Request& r, std::string label, std::vector<std::vector<float>> rows) {
  while (!rows.empty() && rows.back().empty()) rows.pop_back();
  if (rows.empty()) return std::nullopt;
  KVP_CHECK(rows.size() <= r.tokens().size());
  OracleJob job;
  job.label = std::move(label);
  job.tokens = r.tokens();
  job.rows = std::move(rows);
  job.num_prompt = r.num_prompt();
  job.num_generated = r.num_generated();
  job.num_forced = static_cast<int64_t>(r.spec.forced_tokens.size());
  job.greedy = r.spec.sampling.greedy();
  return job;
}

const std::vector<RowComparison>* OracleMemo::find(const std::vector<int32_t>& tokens,
                                                   const std::vector<std::optional<RowDigest>>& rows) const {
  if (!reuse_) return nullptr;
  auto it = by_tokens_.find(tokens);
  if (it == by_tokens_.end() || it->second.size() != rows.size()) return nullptr;
  for (std::size_t p = 0; p < rows.size(); ++p) {
    const RowComparison& c = it->second[p];
    if (c.present != rows[p].has_value() || (c.present && c.engine_row != *rows[p])) return nullptr;
  }
  return &it->second;
}

void OracleMemo::store(std::vector<int32_t> tokens, std::vector<RowComparison> rows) {
  if (!reuse_) return;
  by_tokens_[std::move(tokens)] = std::move(rows);
}

int64_t OracleMemo::restore_prefix(const std::vector<int32_t>& tokens, int64_t limit, DenseKVCache<double>& cache) {
  KVP_CHECK(cache.length() == 0);
  if (!reuse_) return 0;
  limit = std::min(limit, cache.capacity());
  Cached* from = nullptr;
  int64_t n = 0;
  for (Cached& c : caches_) {
    const int64_t shared = std::min(common_prefix(tokens, c.tokens), limit);
    if (shared > n) {
      n = shared;
      from = &c;
    }
  }
  if (from == nullptr) return 0;
  from->last_use = ++clock_;
  cache.copy_prefix(from->cache, n);
  return n;
}

void OracleMemo::keep_cache(std::vector<int32_t> tokens, DenseKVCache<double> cache) {
  const int64_t bytes = cache.reserved_bytes();
  if (!reuse_ || bytes > cache_budget_) return;
  // A stored run whose tokens this one extends (or repeats) is of no more use.
  std::erase_if(caches_, [&](const Cached& c) {
    const bool covered = common_prefix(tokens, c.tokens) == static_cast<int64_t>(c.tokens.size());
    if (covered) cached_bytes_ -= c.cache.reserved_bytes();
    return covered;
  });
  while (cached_bytes_ + bytes > cache_budget_) {
    auto lru = std::min_element(caches_.begin(), caches_.end(),
                                [](const Cached& a, const Cached& b) { return a.last_use < b.last_use; });
    cached_bytes_ -= lru->cache.reserved_bytes();
    caches_.erase(lru);
  }
  cached_bytes_ += bytes;
  caches_.push_back(Cached{std::move(tokens), std::move(cache), ++clock_});
}

Result<std::vector<RowComparison>> compare_job(const ReferenceModel<double>& oracle, const OracleJob& job,
                                               OracleMemo* memo, OracleStats& stats) {
  KVP_CHECK(!job.rows.empty() && job.rows.size() <= job.tokens.size());
  const std::vector<int32_t> key = job.positions();
  const std::size_t n = key.size();
  std::vector<std::optional<RowDigest>> digests(n);
  if (memo != nullptr && memo->reuse()) {
    for (std::size_t p = 0; p < n; ++p)
      if (!job.rows[p].empty()) digests[p] = digest_row(job.rows[p]);
    if (const std::vector<RowComparison>* rows = memo->find(key, digests)) {
      ++stats.comparisons_reused;
      return *rows;
    }
  }
  std::vector<RowComparison> out(n);
  auto cache = oracle.make_cache(static_cast<int64_t>(n));
  // Positions before the first engine row need only their K/V: a stored run's, if it shares
  // them.
  const auto first_row = static_cast<int64_t>(
      std::find_if(job.rows.begin(), job.rows.end(), [](const std::vector<float>& r) { return !r.empty(); }) -
      job.rows.begin());
  const int64_t restored = memo != nullptr ? memo->restore_prefix(key, first_row, cache) : 0;
  KVP_RETURN_IF_ERROR(run_oracle(oracle, job, cache, out));
  ++stats.sequences_run;
  stats.positions_restored += restored;
  stats.positions_run += static_cast<int64_t>(n) - restored;
  if (memo != nullptr && memo->reuse()) {
    for (std::size_t p = 0; p < n; ++p)
      if (digests[p]) out[p].engine_row = *digests[p];
    memo->store(key, out);
    memo->keep_cache(key, std::move(cache));
  }
  return out;
}

void apply_comparisons(const OracleJob& job, const std::vector<RowComparison>& rows, double tol, CheckResult& logits,
                       CheckResult& greedy) {
  double request_worst = 0;
  bool any = false;
  for (std::size_t p = 0; p < rows.size(); ++p) {
    const RowComparison& c = rows[p];
    if (!c.present) continue;
    ++logits.count;
    const double rel = c.err / c.scale;
    logits.worst_error = std::max(logits.worst_error, rel);
    if (logits.worst_by_position.size() <= p) logits.worst_by_position.resize(p + 1, 0.0);
    // A NaN row (err inf) stays the worst: max() would keep a NaN's predecessor.
    logits.worst_by_position[p] =
        rel > logits.worst_by_position[p] || std::isnan(rel) ? rel : logits.worst_by_position[p];
    request_worst = rel > request_worst || std::isnan(rel) ? rel : request_worst;
    any = true;
    if (!(rel <= tol) && logits.passed) {
      logits.passed = false;
      logits.detail = job.label + " position " + std::to_string(p) +
                      ": max |engine - reference| = " + std::to_string(c.err) + " (" + std::to_string(rel) +
                      " of the row's max logit, tolerance " + std::to_string(tol) + ")";
    }
    // Greedy tokens: the token generated from position p's logits.
    const int64_t k = static_cast<int64_t>(p) + 1 - job.num_prompt;
    const bool sampled_here = k >= 0 && k < job.num_generated && k >= job.num_forced;
    if (!sampled_here || !job.greedy) continue;
    if (c.margin <= tol * c.scale) continue;  // too close to call
    ++greedy.count;
    const int32_t engine_token = job.tokens[p + 1];
    if (engine_token != c.best && greedy.passed) {
      greedy.passed = false;
      greedy.detail = job.label + " position " + std::to_string(p) + ": engine chose " + std::to_string(engine_token) +
                      ", reference arg-max " + std::to_string(c.best);
    }
  }
  if (any) logits.worst_by_request.emplace_back(job.label, request_worst);
}

OracleChecks::OracleChecks(const ReferenceModel<double>& oracle, Options options)
    : oracle_(oracle), options_(options), memo_(options.reuse, options.cache_budget_bytes) {
  if (options_.background) worker_ = std::thread([this] { work(); });
}

OracleChecks::~OracleChecks() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void OracleChecks::compare(Pending& p) {
  p.result = compare_job(oracle_, p.job, &memo_, stats_);
  // The comparisons carry what the verdicts read: the rows can go.
  std::vector<std::vector<float>>().swap(p.job.rows);
}

OracleChecks::Stream& OracleChecks::stream(int s) {
  KVP_CHECK(s >= 0);
  while (streams_.size() <= static_cast<std::size_t>(s)) streams_.emplace_back();
  return streams_[static_cast<std::size_t>(s)];
}

OracleChecks::Stream* OracleChecks::current() {
  for (Stream& st : streams_)
    if (st.next < st.jobs.size() || !st.closed) return &st;
  return nullptr;
}

void OracleChecks::submit(OracleJob job, double tolerance, CheckResult& logits, CheckResult& greedy, int s) {
  const int64_t bytes = row_bytes(job);
  std::unique_lock<std::mutex> lock(mu_);
  Stream& st = stream(s);
  KVP_CHECK(!st.closed);
  // Back-pressure: the engine waits for the oracle rather than the rows piling up.
  cv_.wait(lock, [&] {
    const int64_t budget = current() == &st ? options_.max_pending_bytes : options_.max_waiting_bytes;
    return st.next == st.jobs.size() || st.pending_bytes + bytes <= budget;
  });
  st.jobs.push_back(Pending{std::move(job), tolerance, &logits, &greedy, bytes});
  st.pending_bytes += bytes;
  if (!options_.background) {  // compared here, at once
    KVP_CHECK(current() == &st);
    Pending& p = st.jobs.back();
    ++st.next;
    compare(p);
    p.done = true;
    st.pending_bytes -= bytes;
    return;
  }
  lock.unlock();
  cv_.notify_all();
}

void OracleChecks::close(int s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream(s).closed = true;
  }
  cv_.notify_all();
}

void OracleChecks::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Stream* st = nullptr;
    cv_.wait(lock, [&] {
      st = current();
      return stop_ || (st != nullptr && st->next < st->jobs.size());
    });
    if (stop_) return;
    Pending& p = st->jobs[st->next++];  // a reference into the deque survives later push_backs
    lock.unlock();
    compare(p);
    lock.lock();
    p.done = true;
    st->pending_bytes -= p.bytes;
    cv_.notify_all();  // the stream's submitter, and a later stream's (it may be current now)
  }
}

void OracleChecks::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  for (Stream& st : streams_) st.closed = true;
  cv_.notify_all();
  cv_.wait(lock, [&] {
    return std::all_of(streams_.begin(), streams_.end(), [](const Stream& st) {
      return std::all_of(st.jobs.begin(), st.jobs.end(), [](const Pending& p) { return p.done; });
    });
  });
  for (Stream& st : streams_) {
    for (Pending& p : st.jobs) {
      if (p.result) {
        apply_comparisons(p.job, *p.result, p.tolerance, *p.logits, *p.greedy);
      } else if (p.logits->passed) {
        p.logits->passed = false;
        p.logits->detail = p.job.label + ": reference failed: " + p.result.status().message();
      }
    }
  }
  streams_.clear();
}

}  // namespace kvp::verify
