// Loading an attention plug-in (include/kvproof/attention_plugin.h) from a shared library.
// The library is not trusted: every way it can be unusable is an error naming the library,
// found before any kernel runs.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "kvproof/attention_plugin.h"

namespace kvp::verify {

// A loaded plug-in: the library stays open as long as this object lives.
class AttentionPlugin {
 public:
  ~AttentionPlugin();
  AttentionPlugin(const AttentionPlugin&) = delete;
  AttentionPlugin& operator=(const AttentionPlugin&) = delete;

  const kvp_attention_plugin& descriptor() const { return *descriptor_; }
  const std::string& path() const { return path_; }
  std::string name() const { return descriptor_->name; }

  // dlopen()s `path`, calls its KVP_ATTENTION_PLUGIN_ENTRY and checks the descriptor.
  // Errors (each message starts with the path): the file is missing or not a loadable library
  // (dlerror's words); the entry point is absent; it returns NULL; the descriptor's
  // abi_version is not KVP_ATTENTION_PLUGIN_ABI_VERSION; a bad descriptor (no name, no
  // run(), an unknown device, no dtype or layout, or bits for unknown ones).
  // `python:FILE.py:FUNCTION` (or python:MODULE:FUNCTION; FUNCTION defaults to
  // paged_attention) loads kvproof's Python adapter (plugins/python_adapter.cc: next to the
  // binary in ../plugins/, or KVPROOF_PYTHON_ADAPTER) and has it import the kernel; its errors
  // (no such file, an import error with its traceback, a bad KVPROOF_PLUGIN dict) are the same.
  static Result<std::unique_ptr<AttentionPlugin>> load(const std::string& path);

 private:
  AttentionPlugin(std::string path, void* handle, const kvp_attention_plugin* descriptor)
      : path_(std::move(path)), handle_(handle), descriptor_(descriptor) {}
  std::string path_;
  void* handle_;
  const kvp_attention_plugin* descriptor_;
};

}  // namespace kvp::verify
