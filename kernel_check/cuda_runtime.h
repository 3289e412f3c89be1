// The CUDA runtime calls kernel-check makes for a CUDA attention plug-in (device pointers and a
// stream, include/kvproof/attention_plugin.h), loaded with dlopen when such a plug-in is
// checked and not before: kvproof needs no CUDA to build or to start, and a plug-in linked
// against the shared runtime (libcudart.so.13 or .12) shares that one library with the
// harness (dlopen finds the one already loaded by its soname), so its pointers and stream are
// the harness's.
//
// Which library: $KVPROOF_CUDART when set (a path), else the first of libcudart.so.13,
// libcudart.so.12 and libcudart.so that loads.
// The tests set KVPROOF_CUDART to a host-memory stand-in (plugins/fake_cudart.c), so that
// kernel-check's device path (uploads, guard zones and pools read back from the device) runs
// on a machine without a GPU.
//
// Fork: CUDA cannot be used in a child forked after the parent initialised it. Opening the
// library initialises nothing; check_device() does, so kernel-check calls it in a child
// (probe_device_in_child) when it forks per case.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"

namespace kvp::verify {

class CudaRuntime {
 public:
  // Errors: no library found (naming each tried) or one without the calls below.
  static Result<std::unique_ptr<CudaRuntime>> open();
  // The process's runtime, opened on first use (nullptr and the error in `error` when it
  // cannot be). Never closed: a plug-in's device code may still be registered with it.
  static const CudaRuntime* shared(std::string& error);

  const std::string& path() const { return path_; }
  // "" when a device is present, else "no CUDA device: <the runtime's words>".
  std::string check_device() const;
  // Each returns "" or "<call>: <the runtime's error string>".
  std::string alloc(void** ptr, std::size_t bytes) const;
  void free(void* ptr) const;
  std::string to_device(void* dst, const void* src, std::size_t bytes) const;
  std::string to_host(void* dst, const void* src, std::size_t bytes) const;
  std::string stream_create(void** stream) const;
  std::string stream_synchronize(void* stream) const;
  void stream_destroy(void* stream) const;

 private:
  struct Calls;
  CudaRuntime(std::string path, std::unique_ptr<Calls> calls);
  std::string path_;
  std::unique_ptr<Calls> calls_;

 public:
  ~CudaRuntime();
  CudaRuntime(const CudaRuntime&) = delete;
  CudaRuntime& operator=(const CudaRuntime&) = delete;
};

// check_device() run in a forked child, so this process never initialises CUDA (its per-case
// children can then use it). "" when a device is present, else why not.
std::string probe_device_in_child();

}  // namespace kvp::verify
