// The SIMT emulation layer's thread flavour (KVP_SIMT_THREADS, the ThreadSanitizer build):
// every CUDA thread is an OS thread, barriers are real barriers, and a launch runs up to four
// blocks at once on pools of OS threads reused across blocks and launches.
#include "kernels/simt/internal.h"

#if defined(KVP_SIMT_THREADS)
#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace kvp::simt {
inline namespace emulated {
namespace detail {

void block_until_woken(Block& b, Thread& t, std::unique_lock<std::mutex>& lock) {
  t.wake.wait(lock, [&] { return t.state == State::kRunning; });
  if (b.aborted) throw BlockAborted{};
}

namespace {

void thread_main(Thread& t) {
  Block& b = *t.block;
  tls_thread = &t;
  threadIdx = t.idx;
  set_builtins(b);
  run_body(b);
  {
    TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(b.mu);
    finish(b, t);
  }
  tls_thread = nullptr;
}

// A launch runs up to kSlots blocks at once, each on its own slot: a pool of OS threads, one
// per CUDA thread of the slot's current block. Block i runs on slot i % slots, so two blocks
// on different slots are unordered for TSan, and a race between them (global memory one
// writes and the other reads or writes without an atomic) is reported whether or not they
// happen to overlap in time. Blocks that one slot runs one after another are ordered (its
// OS threads are reused). Slots: as many as keep the launch's running CUDA threads within
// kThreadBudget, but between 2 and 4, so that every launch of two or more blocks checks
// races between its blocks: 4 slots for blocks of up to 128 threads, 2 for larger ones. The
// pools then hold at most 2 x 1024 + 2 x 128 OS threads. More threads at once cost memory
// (TSan state per thread) and time on the 2-core CI machine, which has no cores to spare.
constexpr int kSlots = 4;
constexpr uint64_t kThreadBudget = 512;

}  // namespace

int slots_for(uint64_t threads_per_block, uint64_t blocks) {
  const uint64_t slots = std::clamp<uint64_t>(kThreadBudget / threads_per_block, 2, kSlots);
  return static_cast<int>(std::min(blocks, slots));
}

namespace {

// OS threads are created once and reused by every block of their slot: creating and
// joining a thread costs milliseconds under TSan. Worker i runs CUDA thread i of the
// slot's current block.
class WorkerPool {
 public:
  static WorkerPool& slot(int s) {
    static WorkerPool* pools = new WorkerPool[kSlots];  // never destroyed: its workers wait forever
    return pools[s];
  }

  // Runs b on this slot's workers. The edges TSan sees: what the calling thread did before
  // (the launch, and the slot's earlier blocks) happens before every thread of b; every
  // thread of b happens before the return.
  void run(Block& b) {
    std::lock_guard<std::mutex> one_block_at_a_time(block_mu_);
    __tsan_release(&start_sync_);
    {
      TsanQuiet quiet;
      std::unique_lock<std::mutex> lock(mu_);
      while (workers_ < b.nthreads) spawn(workers_++);
      block_ = &b;
      active_ = b.nthreads;
      remaining_ = b.nthreads;
      generation_++;
      work_.notify_all();
      done_.wait(lock, [&] { return remaining_ == 0; });
    }
    __tsan_acquire(&done_sync_);
  }

 private:
  struct Start {
    WorkerPool* pool;
    int index;
  };
  static void* thread_start(void* arg) {
    const Start start = *static_cast<Start*>(arg);
    delete static_cast<Start*>(arg);
    start.pool->work(start.index);
    return nullptr;
  }

  void spawn(int index) {
    constexpr std::size_t kStackBytes = 256 * 1024;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, kStackBytes);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t handle;
    if (pthread_create(&handle, &attr, &WorkerPool::thread_start, new Start{this, index}) != 0) {
      std::fprintf(stderr, "kvp::simt: cannot create OS thread %d\n", index);
      std::abort();
    }
    pthread_attr_destroy(&attr);
  }

  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      Thread* t = nullptr;
      {
        TsanQuiet quiet;
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index < active_) t = &block_->threads[index];
      }
      if (t == nullptr) continue;
      __tsan_acquire(&start_sync_);
      thread_main(*t);
      __tsan_release(&done_sync_);
      TsanQuiet quiet;
      std::lock_guard<std::mutex> lock(mu_);
      if (--remaining_ == 0) done_.notify_all();
    }
  }

  std::mutex block_mu_;
  std::mutex mu_;
  std::condition_variable work_, done_;
  int workers_ = 0;
  uint64_t generation_ = 0;
  Block* block_ = nullptr;
  int active_ = 0;
  int remaining_ = 0;
  char start_sync_ = 0;
  char done_sync_ = 0;
};

}  // namespace

void run_block_threads(Block& b, int slot) { WorkerPool::slot(slot).run(b); }

}  // namespace detail
}  // namespace emulated
}  // namespace kvp::simt
#endif
