#include "common/parallel.h"

namespace kvp {

SliceWorkers::SliceWorkers(int threads) {
  for (int t = 1; t < threads; ++t) workers_.emplace_back([this] { work(); });
}

SliceWorkers::~SliceWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void SliceWorkers::run_slices() {
  for (int64_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) (*fn_)(i);
}

void SliceWorkers::run(int64_t n, const std::function<void(int64_t)>& fn) {
  std::unique_lock<std::mutex> busy(busy_, std::defer_lock);
  if (workers_.empty() || n <= 1 || !busy.try_lock()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0);
    pending_ = static_cast<int64_t>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  run_slices();
  // Every worker takes part in every job (possibly finding no slice left), so that none can
  // still be reading fn_ or n_ when the next job sets them.
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void SliceWorkers::work() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_slices();
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace kvp
