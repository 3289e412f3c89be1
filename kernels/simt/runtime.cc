// The SIMT emulation layer's launches and runtime shim: cudaMalloc, copies, streams, events
// and errors for the host compiler (declared in runtime.h), and the launch that runs a
// grid's blocks, on host threads (fibers) or on slots of OS threads (KVP_SIMT_THREADS).
#include "kernels/simt/internal.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <malloc.h>
#include <unistd.h>

inline namespace kvp_simt_emulated {
// A stream, and what it records while it captures (runtime.h, stream capture). Capture state
// changes only under kvp::simt::detail's capture mutex.
struct kvp_simt_stream {
  bool blocking = true;  // synchronises with the legacy stream (not cudaStreamNonBlocking)
  bool capturing = false;
  bool invalidated = false;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id owner;       // the host thread that began the capture
  std::string invalidated_by;  // the refused call that invalidated it
  std::vector<std::function<void()>> recorded;
};
struct kvp_simt_graph {
  std::vector<std::function<void()>> operations;
};
struct kvp_simt_graph_exec {
  std::vector<std::function<void()>> operations;
};
}  // namespace kvp_simt_emulated

namespace kvp::simt {
inline namespace emulated {
namespace detail {
namespace {

std::atomic<int> g_host_threads{0};

struct LastError {
  cudaError_t code = cudaSuccess;
  std::string message;
};
thread_local LastError tls_last_error;
thread_local uint64_t tls_launches = 0;

void set_error(cudaError_t code, std::string message) {
  tls_last_error.code = code;
  tls_last_error.message = std::move(message);
}

// The streams capturing now; g_num_capturing lets every call skip the mutex when none is.
std::mutex g_capture_mu;
std::vector<kvp_simt_stream*> g_capturing;
std::atomic<int> g_num_capturing{0};

// The captures `call` conflicts with, each invalidated by it; returns cudaSuccess when none.
// A potentially unsafe call (every one this is asked about) conflicts with a capture in
// global mode (any thread's) or thread-local mode (this thread's); work on the legacy stream
// (`legacy`) also conflicts with any capture of a blocking stream, whatever its mode or
// thread, since the legacy stream synchronises with every blocking stream
// (cudaErrorStreamCaptureImplicit). REQUIRES: g_capture_mu held.
cudaError_t capture_conflict_locked(const std::string& call, bool legacy) {
  cudaError_t code = cudaSuccess;
  for (kvp_simt_stream* s : g_capturing) {
    const bool implicit = legacy && s->blocking;
    const bool unsafe = s->mode == cudaStreamCaptureModeGlobal ||
                        (s->mode == cudaStreamCaptureModeThreadLocal && s->owner == std::this_thread::get_id());
    if (!implicit && !unsafe) continue;
    if (code != cudaErrorStreamCaptureImplicit)
      code = implicit ? cudaErrorStreamCaptureImplicit : cudaErrorStreamCaptureUnsupported;
    if (!s->invalidated) {
      s->invalidated = true;
      s->invalidated_by = call;
    }
  }
  return code;
}

#if !defined(KVP_SIMT_THREADS)
// The fiber flavour's host threads, kept across launches (creating and joining threads for
// every launch cost more than the launch's blocks on small grids). A launch claims block
// indices from one counter, on the launching thread and on up to `helpers` pool threads,
// and returns when every block has run and no pool thread still holds the launch.
//   - One launch at a time uses the pool; a launch from another host thread meanwhile runs
//     its blocks on its own thread (results never depend on the number of host threads).
//   - A forked child (kernel-check forks one per case) does not use its parent's pool: its
//     threads do not exist there and its mutex may have been held at the fork. The child
//     runs its blocks on the launching thread.
class BlockPool {
 public:
  static BlockPool& get() {
    static BlockPool* pool = new BlockPool;  // never destroyed: its threads outlive static destruction
    return *pool;
  }

  // Runs run(i) for every i in [0, blocks), each once, on this thread and up to `helpers`
  // pool threads.
  template <typename Run>
  void run(uint64_t blocks, int helpers, const Run& run) {
    const auto alone = [&] {
      for (uint64_t i = 0; i < blocks; ++i) run(i);
    };
    if (helpers < 1 || getpid() != pid_) return alone();
    // Held only for moments (never while blocks run), so waiting for it is short.
    std::unique_lock<std::mutex> lock(mu_);
    if (busy_) {
      lock.unlock();  // not held while this launch runs: the pool's launch needs it
      return alone();
    }
    busy_ = true;
    done_.wait(lock, [&] { return attached_ == 0; });  // a late helper of the last launch
    while (static_cast<int>(threads_.size()) < helpers) threads_.emplace_back([this] { work(); });
    const auto job = [&run](uint64_t i) { run(i); };
    job_ = job;
    blocks_ = blocks;
    helpers_ = helpers;
    next_ = 0;
    completed_ = 0;
    generation_++;
    lock.unlock();
    wake_.notify_all();
    const uint64_t mine = claim_and_run();
    lock.lock();
    completed_ += mine;
    done_.wait(lock, [&] { return completed_ == blocks_ && attached_ == 0; });
    job_ = nullptr;
    busy_ = false;
  }

 private:
  BlockPool() : pid_(getpid()) {}

  uint64_t claim_and_run() {
    uint64_t ran = 0;
    for (uint64_t i = next_++; i < blocks_; i = next_++) {
      job_(i);
      ++ran;
    }
    return ran;
  }

  void work() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (job_ == nullptr || attached_ >= helpers_) continue;
      attached_++;
      lock.unlock();
      const uint64_t ran = claim_and_run();
      lock.lock();
      completed_ += ran;
      attached_--;
      done_.notify_all();
    }
  }

  const pid_t pid_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  bool busy_ = false;
  uint64_t generation_ = 0;
  int attached_ = 0;
  int helpers_ = 0;
  uint64_t completed_ = 0;
  // The current launch; blocks_ and job_ change only under mu_ with no helper attached.
  std::function<void(uint64_t)> job_;
  uint64_t blocks_ = 0;
  std::atomic<uint64_t> next_{0};
};
#endif

}  // namespace

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
  ++tls_launches;
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
  BlockPool::get().run(blocks, static_cast<int>(workers) - 1, [&](uint64_t i) { run(i, 0); });
#endif
  // The lowest failing block is reported, whatever the number of host threads.
  for (const std::string& e : errors) {
    if (!e.empty()) {
      set_error(cudaErrorLaunchFailure, e);
      return;
    }
  }
}

cudaError_t refused_during_capture(const char* call, bool legacy) {
  if (g_num_capturing.load() == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_capture_mu);
  const cudaError_t code = capture_conflict_locked(call, legacy);
  if (code == cudaSuccess) return code;
  set_error(code, format("%s while a stream is being captured: refused, and the capture is invalidated (%s)", call,
                         cudaGetErrorName(code)));
  return code;
}

// Where an operation on `stream` goes now (launches and async copies).
LaunchMode operation_mode(const std::string& what, cudaStream_t stream) {
  if (g_num_capturing.load() == 0) return LaunchMode::kRun;
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (stream == nullptr) {
    const cudaError_t code = capture_conflict_locked(what + " on the legacy stream", true);
    if (code == cudaSuccess) return LaunchMode::kRun;
    set_error(code, format("%s on the legacy stream while a stream is being captured: refused, and the capture is "
                           "invalidated (%s)",
                           what.c_str(), cudaGetErrorName(code)));
    return LaunchMode::kRefused;
  }
  if (!stream->capturing) return LaunchMode::kRun;
  if (stream->invalidated) {
    set_error(cudaErrorStreamCaptureInvalidated, format("%s on a stream whose capture was invalidated by %s",
                                                        what.c_str(), stream->invalidated_by.c_str()));
    return LaunchMode::kRefused;
  }
  return LaunchMode::kRecord;
}

LaunchMode launch_mode(const char* kernel, cudaStream_t stream) {
  return operation_mode(std::string("launch of kernel ") + kernel, stream);
}

void record(cudaStream_t stream, std::function<void()> operation) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  stream->recorded.push_back(std::move(operation));
}
}  // namespace detail

// ---- runtime shim ----

std::string last_error_message() { return detail::tls_last_error.message; }
uint64_t launches_on_this_thread() { return detail::tls_launches; }

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

struct kvp_simt_event {
  std::chrono::steady_clock::time_point at{};
};

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  if (const cudaError_t e = kvp::simt::detail::refused_during_capture("cudaMalloc", false); e != cudaSuccess) return e;
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) return cudaErrorMemoryAllocation;
  kvp::simt::detail::fill_pattern(p, bytes);
  *ptr = p;
  return cudaSuccess;
}
// Freed memory is refilled with the uninitialised pattern first (all malloc_usable_size
// bytes: the request under ASan, at least it elsewhere), so what a stale pointer (a graph
// replayed after its buffers were reallocated) reads before the heap reuses the memory is
// NaN in builds without ASan too; ASan reports the use after free itself. No table of sizes:
// a mutex around one would be held across kernel-check's forks.
cudaError_t cudaFree(void* ptr) {
  if (const cudaError_t e = kvp::simt::detail::refused_during_capture("cudaFree", false); e != cudaSuccess) return e;
  if (ptr == nullptr) return cudaSuccess;
  kvp::simt::detail::fill_pattern(ptr, malloc_usable_size(ptr));
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  if (const cudaError_t e = kvp::simt::detail::refused_during_capture("cudaMallocHost", false); e != cudaSuccess)
    return e;
  *ptr = new (std::nothrow) unsigned char[bytes];
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* ptr) {
  if (const cudaError_t e = kvp::simt::detail::refused_during_capture("cudaFreeHost", false); e != cudaSuccess)
    return e;
  delete[] static_cast<unsigned char*>(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidValue;
  if (const cudaError_t e = kvp::simt::detail::refused_during_capture("cudaMemcpy", true); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
namespace {
// An async copy or set on `stream` (`what` names it): run now, recorded into the stream's
// capture (a graph node: these pointers, read and written at each replay), or refused.
cudaError_t async_operation(const char* what, cudaStream_t stream, const std::function<void()>& operation) {
  using kvp::simt::detail::LaunchMode;
  switch (kvp::simt::detail::operation_mode(what, stream)) {
    case LaunchMode::kRefused: return cudaGetLastError();
    case LaunchMode::kRecord: kvp::simt::detail::record(stream, operation); return cudaSuccess;
    case LaunchMode::kRun: break;
  }
  operation();
  return cudaSuccess;
}
}  // namespace
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidValue;
  if (bytes != 0 && (dst == nullptr || src == nullptr)) return cudaErrorInvalidValue;
  return async_operation("cudaMemcpyAsync", stream, [=] {
    if (bytes != 0) std::memmove(dst, src, bytes);
  });
}
cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) {
  if (const cudaError_t e = kvp::simt::detail::refused_during_capture("cudaMemset", true); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr) return cudaErrorInvalidValue;
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream) {
  if (bytes != 0 && dst == nullptr) return cudaErrorInvalidValue;
  return async_operation("cudaMemsetAsync", stream, [=] {
    if (bytes != 0) std::memset(dst, value, bytes);
  });
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return cudaErrorInvalidValue;
  *stream = new kvp_simt_stream;
  (*stream)->blocking = (flags & cudaStreamNonBlocking) == 0;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream != nullptr && stream->capturing) {  // CUDA ends the capture with the stream
    std::lock_guard<std::mutex> lock(kvp::simt::detail::g_capture_mu);
    std::erase(kvp::simt::detail::g_capturing, stream);
    --kvp::simt::detail::g_num_capturing;
  }
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (stream != nullptr) {
    std::lock_guard<std::mutex> lock(kvp::simt::detail::g_capture_mu);
    if (stream->capturing) {  // a capturing stream has nothing to wait for: CUDA refuses
      kvp::simt::detail::set_error(cudaErrorStreamCaptureUnsupported,
                                   "cudaStreamSynchronize of a stream being captured");
      return cudaErrorStreamCaptureUnsupported;
    }
  }
  return kvp::simt::detail::refused_during_capture("cudaStreamSynchronize", stream == nullptr);
}
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
  if (const cudaError_t e = kvp::simt::detail::refused_during_capture("cudaEventSynchronize", false); e != cudaSuccess)
    return e;
  return event == nullptr ? cudaErrorInvalidResourceHandle : cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return cudaErrorInvalidValue;
  if (start == nullptr || end == nullptr) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (const cudaError_t e = kvp::simt::detail::refused_during_capture("cudaDeviceSynchronize", true); e != cudaSuccess)
    return e;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  namespace d = kvp::simt::detail;
  if (stream == nullptr) return cudaErrorStreamCaptureUnsupported;  // the legacy stream cannot capture
  if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(d::g_capture_mu);
  if (stream->capturing) return cudaErrorInvalidValue;
  stream->capturing = true;
  stream->invalidated = false;
  stream->invalidated_by.clear();
  stream->mode = mode;
  stream->owner = std::this_thread::get_id();
  stream->recorded.clear();
  d::g_capturing.push_back(stream);
  ++d::g_num_capturing;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  namespace d = kvp::simt::detail;
  if (graph == nullptr) return cudaErrorInvalidValue;
  *graph = nullptr;
  if (stream == nullptr) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(d::g_capture_mu);
  if (!stream->capturing) return cudaErrorInvalidValue;
  stream->capturing = false;
  std::erase(d::g_capturing, stream);
  --d::g_num_capturing;
  std::vector<std::function<void()>> recorded = std::move(stream->recorded);
  stream->recorded.clear();
  if (stream->invalidated) {
    d::set_error(cudaErrorStreamCaptureInvalidated,
                 d::format("cudaStreamEndCapture: the capture was invalidated by %s", stream->invalidated_by.c_str()));
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = new kvp_simt_graph{std::move(recorded)};
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return cudaErrorInvalidValue;
  *status = cudaStreamCaptureStatusNone;
  if (stream == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(kvp::simt::detail::g_capture_mu);
  if (stream->capturing)
    *status = stream->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long /*flags*/) {
  if (exec == nullptr) return cudaErrorInvalidValue;
  if (graph == nullptr) return cudaErrorInvalidResourceHandle;
  *exec = new kvp_simt_graph_exec{graph->operations};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  using kvp::simt::detail::LaunchMode;
  if (exec == nullptr) return cudaErrorInvalidResourceHandle;
  switch (kvp::simt::detail::operation_mode("cudaGraphLaunch", stream)) {
    case LaunchMode::kRefused: return cudaGetLastError();
    case LaunchMode::kRecord: return cudaErrorStreamCaptureUnsupported;  // no graph within a graph here
    case LaunchMode::kRun: break;
  }
  // Every operation in its recorded order (one stream's capture is a chain); a kernel that
  // fails ends the replay with its error.
  const cudaError_t pending = cudaPeekAtLastError();
  if (pending != cudaSuccess) return pending;
  for (const std::function<void()>& operation : exec->operations) {
    operation();
    if (cudaPeekAtLastError() != cudaSuccess) return cudaGetLastError();
  }
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

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
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
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
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
  }
  return "unknown error";
}

}  // namespace kvp_simt_emulated
