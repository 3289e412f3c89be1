// The safetensors file format, read and written strictly.
//
// Layout: 8-byte little-endian header length N, then N bytes of JSON (an object mapping
// tensor names to {"dtype", "shape", "data_offsets"}, plus an optional "__metadata__"
// object of strings), then the data. Rules enforced here, each with its own error:
// N within the header limit and the file; the header is a JSON object without duplicate
// names; every entry has exactly those three fields with the right types; the dtype is
// F32, F16 or BF16; byte size = dtype size x product(shape), computed with overflow
// checks; data_offsets start at 0, are contiguous, never overlap and exactly fill the
// rest of the file (no gap, no trailing bytes, no truncation).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kvp {

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100u * 1024u * 1024u;

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
  uint64_t end = 0;

  uint64_t num_elements() const;
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;              // N
  uint64_t data_start = 0;                // 8 + N
  std::vector<SafetensorsEntry> entries;  // in data-offset order
  std::map<std::string, std::string> metadata;

  const SafetensorsEntry* find(const std::string& name) const;
};

// Parses and validates the header of a safetensors file whose first bytes are `prefix`
// (at least 8 + N of them, or the whole file when shorter) and whose total size is
// `file_size`. Never reads past `prefix`; errors are plain reasons (the caller adds the
// file name).
Result<SafetensorsHeader> parse_safetensors_header(std::span<const uint8_t> prefix, uint64_t file_size);

// A file memory-mapped read-only (never read whole into a buffer) and validated. Pages are
// read in as tensors are converted and released after each one (read_f32), so loading a
// checkpoint holds little more than the fp32 weights it produces. Move-only.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const SafetensorsHeader& header() const { return header_; }
  uint64_t size() const { return size_; }

  // Converts one tensor to fp32, then lets the kernel drop its pages from this process.
  // REQUIRES: entry from this file's header; out has entry.num_elements() floats.
  void read_f32(const SafetensorsEntry& entry, std::span<float> out) const;

 private:
  friend Result<SafetensorsFile> read_safetensors(const std::filesystem::path& path);
  SafetensorsHeader header_;
  const uint8_t* data_ = nullptr;  // the mapping; null for an empty file
  uint64_t size_ = 0;
};
Result<SafetensorsFile> read_safetensors(const std::filesystem::path& path);

struct SafetensorsTensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;  // converted to the file dtype on write
};

// Writes a file atomically (a temporary file renamed into place): either the complete
// new file exists afterwards or the old state is untouched. The header is padded with
// spaces to a multiple of 8 bytes, as the reference implementation does. The data is
// converted and written in chunks (no whole-file buffer).
Status write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsTensorToWrite>& tensors,
                         DType dtype, const std::map<std::string, std::string>& metadata = {});

}  // namespace kvp
