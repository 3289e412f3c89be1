// Slices of a job spread over threads: the one loop the oracle's products and conversions and
// the presets' weight draws share, with threads started per job (for_each_slice) or kept
// across jobs (SliceWorkers).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvp {

// Runs fn(0..n-1) on up to `threads` threads (the caller's thread is one of them), each
// claiming the next unclaimed slice until none is left: slices of unequal cost (the last,
// short chunk of each tensor) or a thread the OS runs late leave no thread idle while
// another still has a queue of its own. Callers whose slices write disjoint outputs get the
// same bits whichever thread runs a slice.
template <typename Fn>
void for_each_slice(int64_t n, int threads, const Fn& fn) {
  const int64_t workers = std::min<int64_t>(std::max(threads, 1), std::max<int64_t>(n, 1));
  std::atomic<int64_t> next{0};
  const auto claim = [&fn, &next, n] {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed))
      fn(i);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < workers; ++t) pool.emplace_back(claim);
  claim();
  for (std::thread& th : pool) th.join();
}

// threads - 1 worker threads kept for the object's life, which run the slices of one job at
// a time together with the job's caller: each claims the next unclaimed slice until none is
// left, so a slow or late thread takes fewer. For the many short jobs of one computation
// (the oracle's products), where starting threads per job (for_each_slice) costs a thread's
// creation, its stack's first touch and its exit every time. Slices that write disjoint
// outputs give the same bits whichever thread runs them.
//
// run() may be called from several threads at once: a caller that finds the workers serving
// another caller's job runs all of its own slices alone. A forked child must not call run()
// on an object its parent made (the workers are not in the child).
class SliceWorkers {
 public:
  explicit SliceWorkers(int threads);
  ~SliceWorkers();
  SliceWorkers(const SliceWorkers&) = delete;
  SliceWorkers& operator=(const SliceWorkers&) = delete;

  // The caller and the workers.
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(0..n-1), each once; returns when all have returned.
  void run(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void work();
  // Claims and runs slices of the current job until none is left.
  void run_slices();

  std::mutex busy_;  // held by the caller whose job the workers serve, for the whole job
  std::mutex mu_;    // guards the fields below, except next_
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};  // the next unclaimed slice of the current job
  int64_t pending_ = 0;           // workers yet to finish the current job
  uint64_t generation_ = 0;       // jobs started
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvp
