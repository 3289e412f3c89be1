// Slices of a job spread over threads: the one loop the oracle's products and conversions and
// the presets' weight draws share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvp {

// Runs fn(0..n-1) on up to `threads` threads, slice i on thread i mod the thread count (the
// caller's thread is one of them). Callers whose slices write disjoint outputs get the same
// bits whichever thread runs a slice.
template <typename Fn>
void for_each_slice(int64_t n, int threads, const Fn& fn) {
  const int64_t workers = std::min<int64_t>(std::max(threads, 1), std::max<int64_t>(n, 1));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < workers; ++t) {
    pool.emplace_back([&fn, n, t, workers] {
      for (int64_t i = t; i < n; i += workers) fn(i);
    });
  }
  for (int64_t i = 0; i < n; i += workers) fn(i);
  for (std::thread& th : pool) th.join();
}

}  // namespace kvp
