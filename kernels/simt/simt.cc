// The SIMT emulation layer's engine: launches, the block state machine (barriers and warp
// collectives, with divergence and deadlock diagnosis), the two execution flavours (fibers,
// or one OS thread per CUDA thread under TSan), and the runtime shim.
//
// One block is a state machine over its threads: each is running, waiting at a barrier,
// waiting at a warp collective, or done. A thread that arrives at a barrier or collective
// completes it when it is the last one needed (eagerly), or blocks. When no thread of the
// block is running and some are not done, nothing can ever proceed: that is a divergent
// barrier or a mask naming an absent lane, diagnosed from the states without any timeout.
// The same transitions serve both flavours; under KVP_SIMT_THREADS they run under the
// block's mutex and blocked threads sleep on their own condition variable, otherwise the
// block's fibers all live on one host thread and a blocked fiber yields to the scheduler.
#include "kernels/simt/simt.h"

#include <sys/mman.h>
#include <ucontext.h>  // fiber switch where not x86-64

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#if defined(KVP_SIMT_THREADS)
#include <pthread.h>
#include <sanitizer/tsan_interface.h>
extern "C" {
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
void AnnotateIgnoreSyncBegin(const char* file, int line);
void AnnotateIgnoreSyncEnd(const char* file, int line);
}
#endif
#if defined(KVP_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace kvp::simt {
inline namespace emulated {
namespace detail {
namespace {

constexpr uint32_t kFillWord = 0x7FA07FA0u;

void fill_pattern(void* p, std::size_t bytes) {
  auto* b = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 4 <= bytes; i += 4) std::memcpy(b + i, &kFillWord, 4);
  for (; i < bytes; ++i) b[i] = static_cast<unsigned char>(kFillWord >> (8 * (i % 4)));
}

bool same_site(const char* file_a, int line_a, const char* file_b, int line_b) {
  return line_a == line_b && (file_a == file_b || std::strcmp(file_a, file_b) == 0);
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kSyncWarp: return "__syncwarp";
    case WarpOp::kShfl: return "__shfl_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
    case WarpOp::kBallot: return "__ballot_sync";
    case WarpOp::kAny: return "__any_sync";
    case WarpOp::kAll: return "__all_sync";
  }
  return "?";
}

// Thrown inside a CUDA thread when its block has failed, to unwind the kernel's frames.
struct BlockAborted {};

#if defined(KVP_SIMT_THREADS)
// The layer's own bookkeeping is invisible to TSan while one of these lives: its mutexes
// order nothing and its reads and writes of the block's state are not checked. Otherwise a
// thread that merely took the block's mutex after another would be ordered after all that
// thread had done, hiding exactly the races we want reported. The only happens-before
// edges between CUDA threads are then the ones CUDA promises (the launch, __syncthreads,
// __syncwarp), added explicitly with __tsan_release / __tsan_acquire.
struct TsanQuiet {
  TsanQuiet() {
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~TsanQuiet() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
  }
  TsanQuiet(const TsanQuiet&) = delete;
  TsanQuiet& operator=(const TsanQuiet&) = delete;
};
#endif

#if !defined(KVP_SIMT_THREADS)
// ---- fiber context switch ----
// On x86-64 a fiber switch saves the callee-saved registers and the FP control words on
// the old stack and loads them from the new one: no system call (swapcontext makes one to
// save the signal mask, and ASan warns that it does not fully support it). Elsewhere,
// ucontext.
void fiber_main();

#if defined(__x86_64__)
extern "C" void kvp_simt_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl kvp_simt_switch
  .hidden kvp_simt_switch
  .type kvp_simt_switch, @function
kvp_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kvp_simt_switch, .-kvp_simt_switch
)");

struct FiberContext {
  void* sp = nullptr;
};
void fiber_switch(FiberContext& from, const FiberContext& to) { kvp_simt_switch(&from.sp, to.sp); }
// Lays out a new stack as kvp_simt_switch leaves an old one, so that switching to it
// "returns" into fiber_main with the stack aligned as after a call.
void fiber_init(FiberContext& c, void* stack, std::size_t bytes) {
  auto top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                        // fiber_main's return address: none
  *--sp = reinterpret_cast<uint64_t>(&fiber_main);  // where kvp_simt_switch returns to
  for (int i = 0; i < 6; ++i) *--sp = 0;            // rbp rbx r12 r13 r14 r15
  *--sp = uint64_t{0x037F} << 32 | 0x1F80;          // default x87 control word, MXCSR
  c.sp = sp;
}
#else
struct FiberContext {
  ucontext_t uc{};
};
void fiber_switch(FiberContext& from, const FiberContext& to) { swapcontext(&from.uc, &to.uc); }
void fiber_init(FiberContext& c, void* stack, std::size_t bytes) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fiber_main, 0);
}
#endif
#endif

enum class State : uint8_t { kRunning, kBarrier, kWarp, kDone };

struct Block;

struct Thread {
  Block* block = nullptr;
  uint3 idx{};
  int tid = 0;
  State state = State::kRunning;
  // Where it waits, and with what.
  const char* file = "";
  int line = 0;
  WarpOp op = WarpOp::kSyncWarp;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0;
  int width = 32;
  uint64_t result = 0;
  std::size_t shared_decls = 0;
#if defined(KVP_SIMT_THREADS)
  std::condition_variable wake;
  unsigned barriers_passed = 0;  // this thread's own count: selects the barrier's sync object
#else
  FiberContext context;
  void* stack = nullptr;
  bool started = false;
#if defined(KVP_SIMT_ASAN)
  void* fake_stack = nullptr;
#endif
#endif
};

struct Block {
  const char* kernel = "";
  uint3 idx{};
  dim3 dim, grid;
  int nthreads = 0;
  std::unique_ptr<Thread[]> threads;
  int running = 0;
  int at_barrier = 0;
  // Per warp, the lanes waiting at a warp collective and the lanes that exited.
  unsigned warp_waiting[32] = {};
  unsigned warp_done[32] = {};
  int done = 0;
  bool aborted = false;
  std::string error;
  std::unique_ptr<unsigned char[]> dynamic_shared;
  std::vector<std::pair<std::unique_ptr<unsigned char[]>, std::size_t>> static_shared;
  KernelBody body{};
#if defined(KVP_SIMT_THREADS)
  std::mutex mu;
  // TSan sync objects: barrier k releases and acquires barrier_sync[k % 2] (a thread can be
  // at most one barrier ahead of another); __syncwarp of warp w uses warp_sync[w].
  char barrier_sync[2] = {};
  char warp_sync[32] = {};
#else
  FiberContext scheduler;
#if defined(KVP_SIMT_ASAN)
  const void* scheduler_stack = nullptr;
  std::size_t scheduler_stack_size = 0;
#endif
#endif
};

thread_local Thread* tls_thread = nullptr;

std::string where(const Block& b) { return format("kernel %s, block (%u,%u,%u)", b.kernel, b.idx.x, b.idx.y, b.idx.z); }
std::string who(const Thread& t) {
  return format("thread (%u,%u,%u) [warp %d lane %d]", t.idx.x, t.idx.y, t.idx.z, t.tid / 32, t.tid % 32);
}
std::string site(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return format("%s:%d", slash ? slash + 1 : file, line);
}
std::string waits_at(const Thread& t) {
  switch (t.state) {
    case State::kRunning: return "is running";
    case State::kDone: return "has exited";
    case State::kBarrier: return "waits at __syncthreads (" + site(t.file, t.line) + ")";
    case State::kWarp: return format("waits at %s(mask=0x%08x) (", op_name(t.op), t.mask) + site(t.file, t.line) + ")";
  }
  return "?";
}

// ---- the block state machine (called with the block's mutex held in the thread flavour) ----

void wake(Thread& t) {
  if (t.state == State::kWarp) t.block->warp_waiting[t.tid / 32] &= ~(1u << (t.tid % 32));
  t.state = State::kRunning;
  t.block->running++;
#if defined(KVP_SIMT_THREADS)
  t.wake.notify_one();
#endif
}

// Records the block's first error and wakes every blocked thread so that it unwinds.
void fail(Block& b, const std::string& why) {
  if (b.aborted) return;
  b.aborted = true;
  b.error = where(b) + ": " + why;
  for (int i = 0; i < b.nthreads; ++i) {
    Thread& t = b.threads[i];
    if (t.state == State::kBarrier || t.state == State::kWarp) wake(t);
  }
  b.at_barrier = 0;
}

// Every live thread is blocked and no barrier or collective can complete: say why.
void diagnose_deadlock(Block& b) {
  const Thread* barrier_waiter = nullptr;
  const Thread* warp_waiter = nullptr;
  const Thread* exited = nullptr;
  for (int i = 0; i < b.nthreads; ++i) {
    const Thread& t = b.threads[i];
    if (t.state == State::kBarrier && !barrier_waiter) barrier_waiter = &t;
    if (t.state == State::kWarp && !warp_waiter) warp_waiter = &t;
    if (t.state == State::kDone && !exited) exited = &t;
  }
  if (warp_waiter) {
    // Find a lane of its mask that is not at the same collective.
    const int base = warp_waiter->tid / 32 * 32;
    for (int lane = 0; lane < 32; ++lane) {
      if (!(warp_waiter->mask >> lane & 1u)) continue;
      const Thread& u = b.threads[base + lane];
      if (u.state != State::kWarp || !same_site(u.file, u.line, warp_waiter->file, warp_waiter->line) ||
          u.mask != warp_waiter->mask) {
        fail(b, format("%s mask 0x%08x names lane %d, which does not take part: ", op_name(warp_waiter->op),
                       warp_waiter->mask, lane) +
                    who(*warp_waiter) + " " + waits_at(*warp_waiter) + " while " + who(u) + " " + waits_at(u));
        return;
      }
    }
  }
  if (barrier_waiter) {
    fail(b, format("barrier not reached by every thread: %d of %d threads wait, ", b.at_barrier, b.nthreads) +
                who(*barrier_waiter) + " " + waits_at(*barrier_waiter) +
                (exited ? " while " + who(*exited) + " has exited" : std::string()));
    return;
  }
  fail(b, "deadlock: every live thread is blocked");
}

void after_block(Block& b) {
  if (!b.aborted && b.running == 0 && b.done < b.nthreads) diagnose_deadlock(b);
}

void arrive_barrier(Block& b, Thread& t, const char* file, int line) {
  t.state = State::kBarrier;
  t.file = file;
  t.line = line;
  b.running--;
  b.at_barrier++;
  if (b.done > 0) {
    const Thread* exited = nullptr;
    for (int i = 0; i < b.nthreads && !exited; ++i)
      if (b.threads[i].state == State::kDone) exited = &b.threads[i];
    fail(b, "divergent barrier: " + who(t) + " waits at __syncthreads (" + site(file, line) + ") but " + who(*exited) +
                " has exited and will never reach it");
    return;
  }
  if (b.at_barrier == b.nthreads) {
    for (int i = 0; i < b.nthreads; ++i) {
      const Thread& u = b.threads[i];
      if (!same_site(u.file, u.line, file, line)) {
        fail(b, "divergent barrier: threads wait at different __syncthreads: " + who(t) + " at " + site(file, line) +
                    ", " + who(u) + " at " + site(u.file, u.line));
        return;
      }
    }
    b.at_barrier = 0;
    for (int i = 0; i < b.nthreads; ++i) wake(b.threads[i]);
    return;
  }
  after_block(b);
}

uint64_t collective_result(const Block& b, const Thread& t, int base) {
  const int lane = t.tid - base;
  switch (t.op) {
    case WarpOp::kSyncWarp: return 0;
    case WarpOp::kBallot:
    case WarpOp::kAny:
    case WarpOp::kAll: {
      uint64_t ballot = 0;
      for (int l = 0; l < 32; ++l)
        if ((t.mask >> l & 1u) && b.threads[base + l].value) ballot |= uint64_t{1} << l;
      if (t.op == WarpOp::kBallot) return ballot;
      if (t.op == WarpOp::kAny) return ballot != 0;
      return ballot == t.mask;
    }
    case WarpOp::kShfl:
    case WarpOp::kShflUp:
    case WarpOp::kShflDown:
    case WarpOp::kShflXor: {
      const int w = t.width;
      const int group = lane & ~(w - 1);
      int src = lane;
      if (t.op == WarpOp::kShfl) src = group + (t.arg & (w - 1));
      if (t.op == WarpOp::kShflUp && (lane - group) - t.arg >= 0) src = lane - t.arg;
      if (t.op == WarpOp::kShflDown && (lane - group) + t.arg < w) src = lane + t.arg;
      if (t.op == WarpOp::kShflXor) {
        const int x = lane ^ t.arg;
        if (x >= 0 && x < 32 && x < group + w) src = x;
      }
      // Reading a lane outside the mask is legal on the GPU but yields an undefined value:
      // return the uninitialised-memory pattern so that using it shows in the results.
      if (!(t.mask >> src & 1u)) return uint64_t{kFillWord} << 32 | kFillWord;
      return b.threads[base + src].value;
    }
  }
  return 0;
}

void arrive_warp(Block& b, Thread& t) {
  const int base = t.tid / 32 * 32;
  const int lane = t.tid - base;
  t.state = State::kWarp;
  b.running--;
  b.warp_waiting[t.tid / 32] |= 1u << lane;
  const int lanes_in_warp = std::min(32, b.nthreads - base);
  auto call = [&] { return std::string(op_name(t.op)) + "(" + site(t.file, t.line) + ")"; };
  if (t.width < 1 || t.width > 32 || (t.width & (t.width - 1)) != 0) {
    fail(b, call() + ": width " + std::to_string(t.width) + " is not a power of two in [1, 32]");
    return;
  }
  if (!(t.mask >> lane & 1u)) {
    fail(b, call() + format(" mask 0x%08x does not name the calling lane %d (", t.mask, lane) + who(t) + ")");
    return;
  }
  if (lanes_in_warp < 32 && (t.mask >> lanes_in_warp) != 0) {
    fail(b, call() + format(" mask 0x%08x names lanes beyond the block: warp %d has only %d threads", t.mask,
                            t.tid / 32, lanes_in_warp));
    return;
  }
  if (const unsigned exited = t.mask & b.warp_done[t.tid / 32]) {
    const int l = std::countr_zero(exited);
    fail(b, call() + format(" mask 0x%08x names lane %d, which does not take part: ", t.mask, l) +
                who(b.threads[base + l]) + " has exited");
    return;
  }
  // Complete only when every lane of the mask waits at this very collective.
  bool all_here = (b.warp_waiting[t.tid / 32] & t.mask) == t.mask;
  for (int l = 0; l < 32 && all_here; ++l) {
    if (!(t.mask >> l & 1u)) continue;
    const Thread& u = b.threads[base + l];
    if (!same_site(u.file, u.line, t.file, t.line) || u.mask != t.mask || u.op != t.op) all_here = false;
  }
  if (all_here) {
    for (int l = 0; l < 32; ++l)
      if (t.mask >> l & 1u) b.threads[base + l].result = collective_result(b, b.threads[base + l], base);
    for (int l = 0; l < 32; ++l)
      if (t.mask >> l & 1u) wake(b.threads[base + l]);
    return;
  }
  after_block(b);
}

void finish(Block& b, Thread& t) {
  b.warp_done[t.tid / 32] |= 1u << (t.tid % 32);
  t.state = State::kDone;
  b.running--;
  b.done++;
  if (b.aborted) return;
  if (b.at_barrier > 0) {
    const Thread* waiter = nullptr;
    for (int i = 0; i < b.nthreads && !waiter; ++i)
      if (b.threads[i].state == State::kBarrier) waiter = &b.threads[i];
    fail(b, "divergent barrier: " + who(t) + " exited while " + who(*waiter) + " " + waits_at(*waiter) +
                " (a __syncthreads every thread of the block must reach)");
    return;
  }
  const int base = t.tid / 32 * 32;
  const int lane = t.tid - base;
  for (int l = 0; l < 32 && base + l < b.nthreads; ++l) {
    const Thread& u = b.threads[base + l];
    if (u.state == State::kWarp && (u.mask >> lane & 1u)) {
      fail(b, std::string(op_name(u.op)) +
                  format(" mask 0x%08x names lane %d, which does not take part: ", u.mask, lane) + who(t) +
                  " exited while " + who(u) + " " + waits_at(u));
      return;
    }
  }
  after_block(b);
}

void set_builtins(const Block& b) {
  blockIdx = b.idx;
  blockDim = b.dim;
  gridDim = b.grid;
}

void run_body(Block& b) {
  try {
    b.body.run(b.body.context);
  } catch (const BlockAborted&) {
  }
}

// ---- fault naming: ASan prints the stack, this adds which CUDA thread it was ----

#if defined(KVP_SIMT_ASAN)
void on_asan_death() {
  const Thread* t = tls_thread;
  if (t == nullptr) return;
  std::fprintf(stderr, "kvp::simt: fault in %s, %s\n", where(*t->block).c_str(), who(*t).c_str());
}
struct AsanDeathHook {
  AsanDeathHook() { __asan_set_death_callback(on_asan_death); }
} asan_death_hook;
#endif

#if defined(KVP_SIMT_THREADS)
// ---- thread flavour: one OS thread per CUDA thread ----

void block_until_woken(Block& b, Thread& t, std::unique_lock<std::mutex>& lock) {
  t.wake.wait(lock, [&] { return t.state == State::kRunning; });
  if (b.aborted) throw BlockAborted{};
}

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

int slots_for(uint64_t threads_per_block, uint64_t blocks) {
  const uint64_t slots = std::clamp<uint64_t>(kThreadBudget / threads_per_block, 2, kSlots);
  return static_cast<int>(std::min(blocks, slots));
}

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

void run_block_threads(Block& b, int slot) { WorkerPool::slot(slot).run(b); }

#else
// ---- fiber flavour: the block's threads are fibers on one host thread ----

#if defined(KVP_SIMT_ASAN)
constexpr std::size_t kStackBytes = 256 * 1024;
#else
constexpr std::size_t kStackBytes = 128 * 1024;
#endif
constexpr std::size_t kGuardBytes = 4096;

// Fiber stacks are reused across blocks and launches; each has a guard page below it.
class StackPool {
 public:
  void* take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        void* s = free_.back();
        free_.pop_back();
        return s;
      }
    }
    void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    mprotect(p, kGuardBytes, PROT_NONE);
    return static_cast<unsigned char*>(p) + kGuardBytes;
  }
  void give(void* s) {
#if defined(KVP_SIMT_ASAN)
    // A fiber's last frames never returned; their redzones must not poison the next user.
    ASAN_UNPOISON_MEMORY_REGION(s, kStackBytes);
#endif
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }

 private:
  std::mutex mu_;
  std::vector<void*> free_;
};
StackPool& stack_pool() {
  static StackPool* pool = new StackPool;  // never destroyed: fibers may outlive static destruction order
  return *pool;
}

// Switches from the current fiber back to its block's scheduler.
void yield_to_scheduler(Thread& t, bool exiting) {
  Block& b = *t.block;
#if defined(KVP_SIMT_ASAN)
  __sanitizer_start_switch_fiber(exiting ? nullptr : &t.fake_stack, b.scheduler_stack, b.scheduler_stack_size);
#else
  (void)exiting;
#endif
  fiber_switch(t.context, b.scheduler);
#if defined(KVP_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(t.fake_stack, nullptr, nullptr);
#endif
}

void block_until_woken(Block& b, Thread& t) {
  while (t.state != State::kRunning) yield_to_scheduler(t, false);
  if (b.aborted) throw BlockAborted{};
}

void fiber_main() {
  Thread& t = *tls_thread;
  Block& b = *t.block;
#if defined(KVP_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &b.scheduler_stack, &b.scheduler_stack_size);
#endif
  run_body(b);
  finish(b, t);
  yield_to_scheduler(t, true);
  std::abort();  // a finished fiber is never resumed
}

void resume(Block& b, Thread& t) {
  tls_thread = &t;
  threadIdx = t.idx;
#if defined(KVP_SIMT_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, t.stack, kStackBytes);
#endif
  fiber_switch(b.scheduler, t.context);
#if defined(KVP_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  tls_thread = nullptr;
}

void run_block_fibers(Block& b) {
  for (int i = 0; i < b.nthreads; ++i) {
    Thread& t = b.threads[i];
    t.stack = stack_pool().take();
    fiber_init(t.context, t.stack, kStackBytes);
  }
  // Round robin in thread order: each runnable fiber runs until it blocks or exits.
  while (b.done < b.nthreads) {
    bool progressed = false;
    for (int i = 0; i < b.nthreads; ++i) {
      if (b.threads[i].state != State::kRunning) continue;
      resume(b, b.threads[i]);
      progressed = true;
    }
    if (!progressed) {
      std::fprintf(stderr, "kvp::simt: internal error: %s made no progress\n", where(b).c_str());
      std::abort();
    }
  }
  for (int i = 0; i < b.nthreads; ++i) stack_pool().give(b.threads[i].stack);
}
#endif

// Runs one block to completion (under KVP_SIMT_THREADS on the given slot's OS threads);
// returns its error ("" when it succeeded).
std::string run_block(const char* kernel, dim3 grid, dim3 dim, uint3 idx, std::size_t shmem_bytes, KernelBody body,
                      [[maybe_unused]] int slot) {
  Block b;
  b.kernel = kernel;
  b.idx = idx;
  b.dim = dim;
  b.grid = grid;
  b.nthreads = static_cast<int>(dim.x * dim.y * dim.z);
  b.threads = std::make_unique<Thread[]>(static_cast<std::size_t>(b.nthreads));
  b.running = b.nthreads;
  b.body = body;
  b.dynamic_shared.reset(new unsigned char[shmem_bytes]);
  fill_pattern(b.dynamic_shared.get(), shmem_bytes);
  for (int i = 0; i < b.nthreads; ++i) {
    Thread& t = b.threads[i];
    t.block = &b;
    t.tid = i;
    const unsigned u = static_cast<unsigned>(i);
    t.idx = uint3{u % dim.x, u / dim.x % dim.y, u / (dim.x * dim.y)};
  }
  set_builtins(b);
#if defined(KVP_SIMT_THREADS)
  run_block_threads(b, slot);
#else
  run_block_fibers(b);
#endif
  return b.error;
}

std::atomic<int> g_host_threads{0};

struct LastError {
  cudaError_t code = cudaSuccess;
  std::string message;
};
thread_local LastError tls_last_error;

void set_error(cudaError_t code, std::string message) {
  tls_last_error.code = code;
  tls_last_error.message = std::move(message);
}

}  // namespace

// ---- the calls kernel code makes ----

void sync_block(const char* file, int line) {
  Thread& t = *tls_thread;
  Block& b = *t.block;
#if defined(KVP_SIMT_THREADS)
  char* sync = &b.barrier_sync[t.barriers_passed % 2];
  __tsan_release(sync);
  {
    TsanQuiet quiet;
    std::unique_lock<std::mutex> lock(b.mu);
    if (b.aborted) throw BlockAborted{};
    arrive_barrier(b, t, file, line);
    block_until_woken(b, t, lock);
  }
  __tsan_acquire(sync);
  t.barriers_passed++;
#else
  if (b.aborted) throw BlockAborted{};
  arrive_barrier(b, t, file, line);
  block_until_woken(b, t);
#endif
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
  Thread& t = *tls_thread;
  Block& b = *t.block;
#if defined(KVP_SIMT_THREADS)
  // Only __syncwarp orders memory between lanes; shuffles and votes exchange values only.
  char* sync = op == WarpOp::kSyncWarp ? &b.warp_sync[t.tid / 32] : nullptr;
  if (sync) __tsan_release(sync);
  uint64_t result;
  {
    TsanQuiet quiet;
    std::unique_lock<std::mutex> lock(b.mu);
    if (b.aborted) throw BlockAborted{};
    t.op = op;
    t.mask = mask;
    t.value = value;
    t.arg = arg;
    t.width = width;
    t.file = file;
    t.line = line;
    arrive_warp(b, t);
    block_until_woken(b, t, lock);
    result = t.result;
  }
  if (sync) __tsan_acquire(sync);
  return result;
#else
  if (b.aborted) throw BlockAborted{};
  t.op = op;
  t.mask = mask;
  t.value = value;
  t.arg = arg;
  t.width = width;
  t.file = file;
  t.line = line;
  arrive_warp(b, t);
  block_until_woken(b, t);
  return t.result;
#endif
}

void* static_shared(std::size_t bytes, std::size_t align) {
  Thread& t = *tls_thread;
  Block& b = *t.block;
#if defined(KVP_SIMT_THREADS)
  TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(b.mu);
#endif
  if (b.aborted) throw BlockAborted{};
  if (align > __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
    fail(b, "KVP_SHARED array alignment " + std::to_string(align) + " is not supported");
    throw BlockAborted{};
  }
  const std::size_t i = t.shared_decls++;
  if (i == b.static_shared.size()) {
    // The first thread to reach the declaration allocates the block's array.
    std::unique_ptr<unsigned char[]> array(new unsigned char[bytes]);
    fill_pattern(array.get(), bytes);
    b.static_shared.emplace_back(std::move(array), bytes);
  } else if (i > b.static_shared.size() || b.static_shared[i].second != bytes) {
    fail(b, "threads declare different KVP_SHARED arrays (" + who(t) + ", declaration " + std::to_string(i) + ")");
    throw BlockAborted{};
  }
  return b.static_shared[i].first.get();
}

void* dynamic_shared() { return tls_thread->block->dynamic_shared.get(); }

void launch(const char* kernel, dim3 grid, dim3 block, std::size_t shmem_bytes, cudaStream_t /*stream*/,
            KernelBody body) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || blocks == 0 ||
      grid.y > 65535 || grid.z > 65535 || shmem_bytes > 228 * 1024) {
    set_error(cudaErrorInvalidConfiguration,
              format("kernel %s: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u) shared %zu bytes",
                     kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z, shmem_bytes));
    return;
  }
  tls_last_error.message.clear();
  std::vector<std::string> errors(blocks);
  auto run = [&](uint64_t i, int slot) {
    const uint3 idx{static_cast<unsigned>(i % grid.x), static_cast<unsigned>(i / grid.x % grid.y),
                    static_cast<unsigned>(i / (uint64_t{grid.x} * grid.y))};
    errors[i] = run_block(kernel, grid, block, idx, shmem_bytes, body, slot);
  };
#if defined(KVP_SIMT_THREADS)
  // Slot s runs blocks s, s + slots, ...: slot 0 on this thread, each other slot on a thread
  // created here (about 0.2 ms each under TSan on the CI machine). Creating and joining
  // them are the launch's only edges to and from the other slots' blocks, as CUDA promises:
  // the launch happens before every block and every block before the launch returns, but
  // nothing orders blocks on different slots (no shared counter hands out block indices).
  const int slots = slots_for(threads, blocks);
  auto run_slot = [&](int s) {
    for (uint64_t i = static_cast<uint64_t>(s); i < blocks; i += static_cast<uint64_t>(slots)) run(i, s);
  };
  std::vector<std::thread> others;
  for (int s = 1; s < slots; ++s) others.emplace_back(run_slot, s);
  run_slot(0);
  for (std::thread& th : others) th.join();
#else
  const uint64_t workers = std::min<uint64_t>(blocks, static_cast<uint64_t>(host_threads()));
  if (workers <= 1) {
    for (uint64_t i = 0; i < blocks; ++i) run(i, 0);
  } else {
    std::atomic<uint64_t> next{0};
    std::vector<std::thread> pool;
    for (uint64_t w = 0; w < workers; ++w)
      pool.emplace_back([&] {
        for (uint64_t i = next++; i < blocks; i = next++) run(i, 0);
      });
    for (std::thread& th : pool) th.join();
  }
#endif
  // The lowest failing block is reported, whatever the number of host threads.
  for (const std::string& e : errors) {
    if (!e.empty()) {
      set_error(cudaErrorLaunchFailure, e);
      return;
    }
  }
}

}  // namespace detail

// ---- runtime shim ----

std::string last_error_message() { return detail::tls_last_error.message; }

void set_host_threads(int n) { detail::g_host_threads = n < 1 ? 1 : n; }
int host_threads() {
  const int n = detail::g_host_threads.load();
  if (n > 0) return n;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace emulated
}  // namespace kvp::simt

inline namespace kvp_simt_emulated {

struct kvp_simt_stream {};
struct kvp_simt_event {
  std::chrono::steady_clock::time_point at{};
};

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  auto* p = new (std::nothrow) unsigned char[bytes];
  if (p == nullptr) return cudaErrorMemoryAllocation;
  kvp::simt::detail::fill_pattern(p, bytes);
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  delete[] static_cast<unsigned char*>(ptr);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  *ptr = new (std::nothrow) unsigned char[bytes];
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* ptr) {
  delete[] static_cast<unsigned char*>(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr) return cudaErrorInvalidValue;
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t) {
  return cudaMemset(dst, value, bytes);
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  *stream = new kvp_simt_stream;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (event == nullptr) return cudaErrorInvalidValue;
  *event = new kvp_simt_event;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  event->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return event == nullptr ? cudaErrorInvalidResourceHandle : cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return cudaErrorInvalidValue;
  if (start == nullptr || end == nullptr) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = kvp::simt::detail::tls_last_error.code;
  kvp::simt::detail::tls_last_error.code = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return kvp::simt::detail::tls_last_error.code; }
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

}  // namespace kvp_simt_emulated
