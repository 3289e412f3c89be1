// The SIMT emulation layer's launches and runtime shim: cudaMalloc, copies, streams, events
// and errors for the host compiler (declared in runtime.h), and the launch that runs a
// grid's blocks, on host threads (fibers) or on slots of OS threads (KVP_SIMT_THREADS).
#include "kernels/simt/internal.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

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
