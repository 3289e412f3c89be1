// The SIMT emulation layer's fiber flavour (the default and ASan builds): a block's CUDA
// threads are cooperative fibers on one host thread, run round robin by the block's
// scheduler; a fiber runs until it blocks at a barrier or collective, or exits.
#include "kernels/simt/internal.h"

#if !defined(KVP_SIMT_THREADS)
#include <sys/mman.h>
#include <ucontext.h>  // fiber switch where not x86-64

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#if defined(KVP_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace kvp::simt {
inline namespace emulated {
namespace detail {
namespace {

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
void fiber_switch(FiberContext& from, const FiberContext& to) { swapcontext(&from.uc, &to.uc); }
void fiber_init(FiberContext& c, void* stack, std::size_t bytes) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fiber_main, 0);
}
#endif

#if defined(KVP_SIMT_ASAN)
constexpr std::size_t kStackBytes = 256 * 1024;
#else
constexpr std::size_t kStackBytes = 128 * 1024;
#endif
constexpr std::size_t kGuardBytes = 4096;

// Fiber stacks are reused across blocks and launches; each has a guard page below it.
// Taken and given back in batches, under one lock each.
class StackPool {
 public:
  // Appends n stacks to `out`.
  void take(int n, std::vector<void*>& out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (; n > 0 && !free_.empty(); --n) {
        out.push_back(free_.back());
        free_.pop_back();
      }
    }
    for (; n > 0; --n) out.push_back(map_stack());
  }
  // Takes back every stack of `stacks` (unpoisoned under ASan).
  void give(std::vector<void*>& stacks) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.insert(free_.end(), stacks.begin(), stacks.end());
    stacks.clear();
  }

 private:
  static void* map_stack() {
    void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    mprotect(p, kGuardBytes, PROT_NONE);
    return static_cast<unsigned char*>(p) + kGuardBytes;
  }

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

}  // namespace

void block_until_woken(Block& b, Thread& t) {
  while (t.state != State::kRunning) yield_to_scheduler(t, false);
  if (b.aborted) throw BlockAborted{};
}

namespace {

// A fiber runs its first thread and, each time the thread it runs exits, the next thread
// that has not started, if that thread is also the next one the scheduler would run (see
// run_block_fibers); it goes back to the scheduler when its thread blocks, or when it
// has no such thread to run.
void fiber_main() {
  Thread* t = tls_thread;
  Block& b = *t->block;
  void* const stack = t->stack;
#if defined(KVP_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &b.scheduler_stack, &b.scheduler_stack_size);
#endif
  for (;;) {
    run_body(b);
    finish(b, *t);
    const int next = b.next_unstarted;
    if (next >= b.nthreads || next != t->tid + 1 || b.threads[next].state != State::kRunning) break;
    b.next_unstarted = next + 1;
    t = &b.threads[next];
    t->stack = stack;
    tls_thread = t;
    threadIdx = t->idx;
  }
  yield_to_scheduler(*t, true);
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

}  // namespace

void run_block_fibers(Block& b) {
  // Round robin in thread order: each runnable thread runs until it blocks or exits. A thread
  // that has not started gets a fiber (and a stack), and that fiber goes on to run the threads
  // after it for as long as each exits without blocking (fiber_main): the same threads in the
  // same order as the loop below would run them, without a fiber switch per thread. So a
  // kernel without barriers or warp collectives runs each block on one fiber and one stack.
  std::vector<void*> stacks, spare;
  while (b.done < b.nthreads) {
    bool progressed = false;
    for (int i = 0; i < b.nthreads; ++i) {
      Thread& t = b.threads[i];
      if (t.state != State::kRunning) continue;
      if (i >= b.next_unstarted) {  // i == next_unstarted: threads start in order
        if (spare.empty()) stack_pool().take(std::min(b.nthreads - i, 64), spare);
        t.stack = spare.back();
        spare.pop_back();
        stacks.push_back(t.stack);
        b.next_unstarted = i + 1;
        fiber_init(t.context, t.stack, kStackBytes);
      }
      resume(b, t);
      progressed = true;
    }
    if (!progressed) {
      std::fprintf(stderr, "kvp::simt: internal error: %s made no progress\n", where(b).c_str());
      std::abort();
    }
  }
#if defined(KVP_SIMT_ASAN)
  // A fiber's last frames never returned; their redzones must not poison the next user.
  for (void* s : stacks) ASAN_UNPOISON_MEMORY_REGION(s, kStackBytes);
#endif
  stack_pool().give(stacks);
  stack_pool().give(spare);
}

}  // namespace detail
}  // namespace emulated
}  // namespace kvp::simt
#endif
