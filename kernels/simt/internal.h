// Private to the SIMT emulation layer's engine (library kvp_simt): what its files share.
//
//   block.cc    the block state machine (barriers and warp collectives, with divergence and
//               deadlock diagnosis) and the calls kernel code makes
//   fibers.cc   the fiber flavour: a block's CUDA threads are fibers on one host thread
//   threads.cc  the thread flavour (KVP_SIMT_THREADS): one OS thread per CUDA thread
//   runtime.cc  launches and the runtime shim (allocation, copies, streams, events, errors)
#pragma once

#include "kernels/simt/simt.h"

#include <ucontext.h>  // fiber switch where not x86-64

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#if defined(KVP_SIMT_THREADS)
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

namespace kvp::simt {
inline namespace emulated {
namespace detail {

constexpr uint32_t kFillWord = 0x7FA07FA0u;

// Fills with the uninitialised-memory pattern, kFillWord.
void fill_pattern(void* p, std::size_t bytes);

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Stream capture (runtime.h). A potentially unsafe call (`legacy`: one that is also work on
// the legacy stream) while a capture it conflicts with is active: refused, the error set as
// the thread's naming `call` and returned, and every such capture invalidated; else
// cudaSuccess.
cudaError_t refused_during_capture(const char* call, bool legacy);
// Where an operation on `stream` (a launch, an async copy; `what` names it) goes now.
LaunchMode operation_mode(const std::string& what, cudaStream_t stream);

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
// A fiber's saved context (fibers.cc switches between them).
#if defined(__x86_64__)
struct FiberContext {
  void* sp = nullptr;
};
#else
struct FiberContext {
  ucontext_t uc{};
};
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
  // cp.async (__pipeline_memcpy_async) copies issued and not yet completed: each holds the
  // source bytes read when it was issued (its destination was filled with the uninitialised
  // pattern then) and the group it belongs to (its index among this thread's commits; copies
  // issued since the last commit are in group `async_groups_committed`, not yet committed).
  struct AsyncCopy {
    void* dst = nullptr;
    unsigned char bytes[16] = {};
    uint8_t size = 0;
    uint32_t group = 0;
  };
  std::vector<AsyncCopy> async_copies;
  uint32_t async_groups_committed = 0;
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
  // Threads 0 .. next_unstarted - 1 have started (fibers.cc, run_block_fibers).
  int next_unstarted = 0;
#if defined(KVP_SIMT_ASAN)
  const void* scheduler_stack = nullptr;
  std::size_t scheduler_stack_size = 0;
#endif
#endif
};

// The CUDA thread this host thread runs (block.cc).
extern constinit thread_local Thread* tls_thread;

// "kernel K, block (x,y,z)", for error messages.
std::string where(const Block& b);

// ---- block.cc: the block state machine ----
// Called with the block's mutex held in the thread flavour.

// A thread exits: its block's state records it, and a barrier or collective it leaves
// waiting fails the block.
void finish(Block& b, Thread& t);
// Sets blockIdx, blockDim and gridDim for the calling host thread.
void set_builtins(const Block& b);
// Runs the kernel body for the current thread; a BlockAborted ends it quietly.
void run_body(Block& b);

// Runs one block to completion (under KVP_SIMT_THREADS on the given slot's OS threads);
// returns its error ("" when it succeeded).
std::string run_block(const char* kernel, dim3 grid, dim3 dim, uint3 idx, std::size_t shmem_bytes, KernelBody body,
                      int slot);

#if defined(KVP_SIMT_THREADS)
// ---- threads.cc: the thread flavour ----

// Sleeps until t runs again (called with the block's mutex held); throws BlockAborted if
// the block failed meanwhile.
void block_until_woken(Block& b, Thread& t, std::unique_lock<std::mutex>& lock);
// How many slots (pools of OS threads) a launch of `blocks` blocks of
// `threads_per_block` threads runs on: 2 to 4, never more than `blocks`.
int slots_for(uint64_t threads_per_block, uint64_t blocks);
// Runs b on the given slot's OS threads, one per CUDA thread.
void run_block_threads(Block& b, int slot);
#else
// ---- fibers.cc: the fiber flavour ----

// Yields to the block's scheduler until t runs again; throws BlockAborted if the block
// failed meanwhile.
void block_until_woken(Block& b, Thread& t);
// Runs b's threads as fibers on the calling host thread until every one has exited.
void run_block_fibers(Block& b);
#endif

}  // namespace detail
}  // namespace emulated
}  // namespace kvp::simt
