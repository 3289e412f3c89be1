#include "kernel_check/cuda_runtime.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace kvp::verify {

// The runtime's C entry points, with cudaError_t as int and cudaStream_t as void* (the
// runtime's ABI: an enum and an opaque pointer).
struct CudaRuntime::Calls {
  int (*get_device_count)(int*) = nullptr;
  int (*malloc_)(void**, std::size_t) = nullptr;
  int (*free_)(void*) = nullptr;
  int (*memcpy_)(void*, const void*, std::size_t, int) = nullptr;
  int (*stream_create)(void**) = nullptr;
  int (*stream_synchronize)(void*) = nullptr;
  int (*stream_destroy)(void*) = nullptr;
  const char* (*error_string)(int) = nullptr;
};

namespace {

constexpr int kHostToDevice = 1;  // cudaMemcpyKind
constexpr int kDeviceToHost = 2;

template <class Fn>
bool bind(void* handle, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  return fn != nullptr;
}

}  // namespace

CudaRuntime::CudaRuntime(std::string path, std::unique_ptr<Calls> calls)
    : path_(std::move(path)), calls_(std::move(calls)) {}
CudaRuntime::~CudaRuntime() = default;

Result<std::unique_ptr<CudaRuntime>> CudaRuntime::open() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KVPROOF_CUDART"); env != nullptr && env[0] != '\0')
    candidates.emplace_back(env);
  else
    candidates = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  std::string tried;
  for (const std::string& path : candidates) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += (tried.empty() ? "" : "; ") + path + ": " + (why != nullptr ? why : "not loadable");
      continue;
    }
    auto c = std::make_unique<Calls>();
    const char* missing = nullptr;
    if (!bind(handle, "cudaGetDeviceCount", c->get_device_count))
      missing = "cudaGetDeviceCount";
    else if (!bind(handle, "cudaMalloc", c->malloc_))
      missing = "cudaMalloc";
    else if (!bind(handle, "cudaFree", c->free_))
      missing = "cudaFree";
    else if (!bind(handle, "cudaMemcpy", c->memcpy_))
      missing = "cudaMemcpy";
    else if (!bind(handle, "cudaStreamCreate", c->stream_create))
      missing = "cudaStreamCreate";
    else if (!bind(handle, "cudaStreamSynchronize", c->stream_synchronize))
      missing = "cudaStreamSynchronize";
    else if (!bind(handle, "cudaStreamDestroy", c->stream_destroy))
      missing = "cudaStreamDestroy";
    else if (!bind(handle, "cudaGetErrorString", c->error_string))
      missing = "cudaGetErrorString";
    if (missing != nullptr) {
      dlclose(handle);
      return Status::error("CUDA runtime " + path + " has no " + missing);
    }
    // The handle stays open for the process's life (see shared()).
    return std::unique_ptr<CudaRuntime>(new CudaRuntime(path, std::move(c)));
  }
  return Status::error("no CUDA runtime library (" + tried + "; KVPROOF_CUDART names another)");
}

const CudaRuntime* CudaRuntime::shared(std::string& error) {
  static const Result<std::unique_ptr<CudaRuntime>> runtime = open();
  if (!runtime) {
    error = runtime.status().message();
    return nullptr;
  }
  return runtime->get();
}

std::string CudaRuntime::check_device() const {
  int count = 0;
  const int e = calls_->get_device_count(&count);
  if (e != 0) return std::string("no CUDA device: cudaGetDeviceCount: ") + calls_->error_string(e);
  if (count < 1) return "no CUDA device: cudaGetDeviceCount found none";
  return {};
}

namespace {
std::string named(const char* call, int e, const char* (*error_string)(int)) {
  return e == 0 ? std::string() : std::string(call) + ": " + error_string(e);
}
}  // namespace

std::string CudaRuntime::alloc(void** ptr, std::size_t bytes) const {
  return named("cudaMalloc", calls_->malloc_(ptr, bytes == 0 ? 1 : bytes), calls_->error_string);
}
void CudaRuntime::free(void* ptr) const {
  if (ptr != nullptr) calls_->free_(ptr);
}
std::string CudaRuntime::to_device(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0) return {};
  return named("cudaMemcpy (host to device)", calls_->memcpy_(dst, src, bytes, kHostToDevice), calls_->error_string);
}
std::string CudaRuntime::to_host(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0) return {};
  return named("cudaMemcpy (device to host)", calls_->memcpy_(dst, src, bytes, kDeviceToHost), calls_->error_string);
}
std::string CudaRuntime::stream_create(void** stream) const {
  return named("cudaStreamCreate", calls_->stream_create(stream), calls_->error_string);
}
std::string CudaRuntime::stream_synchronize(void* stream) const {
  return named("cudaStreamSynchronize", calls_->stream_synchronize(stream), calls_->error_string);
}
void CudaRuntime::stream_destroy(void* stream) const {
  if (stream != nullptr) calls_->stream_destroy(stream);
}

std::string probe_device_in_child() {
  int fds[2];
  if (pipe(fds) != 0) return std::string("pipe() failed: ") + std::strerror(errno);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return std::string("fork() failed: ") + std::strerror(errno);
  }
  if (pid == 0) {
    close(fds[0]);
    std::string error;
    const CudaRuntime* rt = CudaRuntime::shared(error);
    if (rt != nullptr) error = rt->check_device();
    std::size_t done = 0;
    while (done < error.size()) {
      const ssize_t w = write(fds[1], error.data() + done, error.size() - done);
      if (w <= 0) break;
      done += static_cast<std::size_t>(w);
    }
    _exit(error.empty() ? 0 : 1);
  }
  close(fds[1]);
  std::string text;
  char buf[1024];
  for (;;) {
    const ssize_t got = read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    text.append(buf, static_cast<std::size_t>(got));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  if (!text.empty()) return text;
  return "no CUDA device: the probe's process died (status " + std::to_string(status) + ")";
}

}  // namespace kvp::verify
