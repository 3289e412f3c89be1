// The SIMT emulation layer's engine: the block state machine (barriers and warp
// collectives, with divergence and deadlock diagnosis), and the calls kernel code makes.
//
// One block is a state machine over its threads: each is running, waiting at a barrier,
// waiting at a warp collective, or done. A thread that arrives at a barrier or collective
// completes it when it is the last one needed (eagerly), or blocks. When no thread of the
// block is running and some are not done, nothing can ever proceed: that is a divergent
// barrier or a mask naming an absent lane, diagnosed from the states without any timeout.
// The same transitions serve both flavours; under KVP_SIMT_THREADS they run under the
// block's mutex and blocked threads sleep on their own condition variable, otherwise the
// block's fibers all live on one host thread and a blocked fiber yields to the scheduler.
#include "kernels/simt/internal.h"

#include <algorithm>
#include <bit>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#if defined(KVP_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace kvp::simt {
inline namespace emulated {
namespace detail {

void fill_pattern(void* p, std::size_t bytes) {
  auto* b = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 4 <= bytes; i += 4) std::memcpy(b + i, &kFillWord, 4);
  for (; i < bytes; ++i) b[i] = static_cast<unsigned char>(kFillWord >> (8 * (i % 4)));
}

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

constinit thread_local Thread* tls_thread = nullptr;

std::string where(const Block& b) { return format("kernel %s, block (%u,%u,%u)", b.kernel, b.idx.x, b.idx.y, b.idx.z); }

namespace {

bool same_site(const char* file_a, int line_a, const char* file_b, int line_b) {
  return line_a == line_b && (file_a == file_b || std::strcmp(file_a, file_b) == 0);
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

}  // namespace

void finish(Block& b, Thread& t) {
  b.warp_done[t.tid / 32] |= 1u << (t.tid % 32);
  t.state = State::kDone;
  b.running--;
  b.done++;
  if (b.aborted) return;
  if (!t.async_copies.empty()) {
    fail(b, who(t) + format(" exited with %zu cp.async copies (__pipeline_memcpy_async) never waited for: a "
                            "__pipeline_wait_prior (cp.async.wait_group) that completes them is missing",
                            t.async_copies.size()));
    return;
  }
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

namespace {

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

}  // namespace

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

namespace {
// What a lane asks of its warp, recorded on the lane before it arrives.
void post_warp_op(Thread& t, WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
  t.op = op;
  t.mask = mask;
  t.value = value;
  t.arg = arg;
  t.width = width;
  t.file = file;
  t.line = line;
}
}  // namespace

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
    post_warp_op(t, op, mask, value, arg, width, file, line);
    arrive_warp(b, t);
    block_until_woken(b, t, lock);
    result = t.result;
  }
  if (sync) __tsan_acquire(sync);
  return result;
#else
  if (b.aborted) throw BlockAborted{};
  post_warp_op(t, op, mask, value, arg, width, file, line);
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

// cp.async: only the issuing thread touches its copies, so no lock; the failures lock as
// static_shared does.
void pipeline_memcpy_async(void* dst, const void* src, std::size_t size, std::size_t zfill, const char* file,
                           int line) {
  Thread& t = *tls_thread;
  Block& b = *t.block;
  const auto misaligned = [size](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % size != 0; };
  if ((size != 4 && size != 8 && size != 16) || zfill > size || misaligned(dst) || misaligned(src)) {
    {
#if defined(KVP_SIMT_THREADS)
      TsanQuiet quiet;
      std::lock_guard<std::mutex> lock(b.mu);
#endif
      fail(b, who(t) + format(" at %s:%d: __pipeline_memcpy_async of %zu bytes (zero fill %zu) from %p to %p: the size "
                              "must be 4, 8 or 16 and both addresses aligned to it",
                              file, line, size, zfill, src, dst));
    }
    throw BlockAborted{};
  }
  Thread::AsyncCopy c;
  c.dst = dst;
  c.size = static_cast<uint8_t>(size);
  c.group = t.async_groups_committed;
  std::memcpy(c.bytes, src, size - zfill);  // read now; the zero fill is part of the copy
  t.async_copies.push_back(c);
  fill_pattern(dst, size);  // what a read before the wait sees
}

void pipeline_commit() { ++tls_thread->async_groups_committed; }

void pipeline_wait_prior(std::size_t prior) {
  Thread& t = *tls_thread;
  // Every committed group but the newest `prior` completes, in issue order.
  const uint32_t committed = t.async_groups_committed;
  const uint32_t done_below = prior >= committed ? 0 : committed - static_cast<uint32_t>(prior);
  std::size_t kept = 0;
  for (Thread::AsyncCopy& c : t.async_copies) {
    if (c.group < done_below) {
      std::memcpy(c.dst, c.bytes, c.size);
    } else {
      t.async_copies[kept++] = c;
    }
  }
  t.async_copies.resize(kept);
}

}  // namespace detail
}  // namespace emulated
}  // namespace kvp::simt
