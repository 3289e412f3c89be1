// common/parallel.h: SliceWorkers runs every slice of every job exactly once, with its
// workers taking part, and from several calling threads at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/parallel.h"

namespace kvp {
namespace {

// Runs `jobs` jobs of n slices on `workers` and expects each slice of each job to have run once.
void expect_each_slice_once(SliceWorkers& workers, int64_t n, int jobs) {
  for (int j = 0; j < jobs; ++j) {
    std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
    workers.run(n, [&](int64_t i) { runs[static_cast<std::size_t>(i)].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(runs[static_cast<std::size_t>(i)].load(), 1) << "job " << j << " slice " << i << " of " << n;
  }
}

TEST(SliceWorkers, RunsEverySliceOnceAtEveryThreadCount) {
  for (int threads : {1, 2, 3, 5}) {
    SliceWorkers workers(threads);
    EXPECT_EQ(workers.threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, " + std::to_string(n) + " slices");
      expect_each_slice_once(workers, n, 20);
    }
  }
}

// Two slices that each wait for the other to start: they finish only if the workers run
// slices beside the caller (a pool that ran every slice on the calling thread would time out).
TEST(SliceWorkers, WorkersRunSlicesBesideTheCaller) {
  SliceWorkers workers(2);
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  bool both = true;
  workers.run(2, [&](int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    ++started;
    cv.notify_all();
    if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return started == 2; })) both = false;
  });
  EXPECT_TRUE(both) << "the two slices never ran at the same time";
}

// Callers on four threads share one object: each job still runs all of its slices once
// (a caller that finds the workers busy runs its own alone).
TEST(SliceWorkers, ConcurrentCallersEachRunAllTheirSlices) {
  SliceWorkers workers(3);
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&workers, &failures, c] {
      for (int j = 0; j < 100; ++j) {
        const int64_t n = 1 + (c * 7 + j) % 13;
        std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
        workers.run(n, [&](int64_t i) { runs[static_cast<std::size_t>(i)].fetch_add(1); });
        for (auto& r : runs) failures += r.load() != 1;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace kvp
