#include "model/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fstream>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

namespace kvp {

namespace {

using json = nlohmann::json;

// dtypes defined by the safetensors format that kvproof does not load.
bool is_known_unsupported_dtype(const std::string& d) {
  static const std::set<std::string> known = {"BOOL",    "U8",  "I8",      "I16",    "U16",     "I32",
                                              "U32",     "I64", "U64",     "F64",    "F8_E4M3", "F8_E5M2",
                                              "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2"};
  return known.count(d) > 0;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

Result<SafetensorsEntry> parse_entry(const std::string& name, const json& v) {
  const std::string where = "tensor " + in_quotes(name) + ": ";
  if (!v.is_object()) return Status::error(where + "entry must be an object");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      return Status::error(where + "unexpected field " + in_quotes(it.key()));
  }
  SafetensorsEntry e;
  e.name = name;

  auto d = v.find("dtype");
  if (d == v.end() || !d->is_string()) return Status::error(where + "missing or non-string 'dtype'");
  const std::string dname = d->get<std::string>();
  // Compared by name, not through the optional dtype_from_name returns: GCC 12 at -O2 folds
  // `!d || *d == F64 || is_fp8(*d)` into one branch that reads the empty optional's payload,
  // which Valgrind reports as a jump on an uninitialised value (CI's memcheck, 2026-12-06).
  if (dname != "F32" && dname != "F16" && dname != "BF16") {
    if (is_known_unsupported_dtype(dname))
      return Status::error(where + "dtype " + in_quotes(dname) + " is not supported (F32, F16, BF16 are)");
    return Status::error(where + "unknown dtype " + in_quotes(dname));
  }
  e.dtype = dname == "F32" ? DType::kF32 : dname == "F16" ? DType::kF16 : DType::kBF16;

  auto s = v.find("shape");
  if (s == v.end() || !s->is_array()) return Status::error(where + "missing or non-array 'shape'");
  if (s->size() > 8) return Status::error(where + "shape has " + std::to_string(s->size()) + " dimensions (at most 8)");
  uint64_t elements = 1;
  for (const auto& dim : *s) {
    if (!dim.is_number_unsigned())
      return Status::error(where + "shape entries must be non-negative integers, got " + dim.dump());
    uint64_t x = dim.get<uint64_t>();
    if (x > static_cast<uint64_t>(INT64_MAX))
      return Status::error(where + "shape dimension " + dim.dump() + " is too large");
    if (mul_overflows(elements, x, elements)) return Status::error(where + "shape element count overflows 64 bits");
    e.shape.push_back(static_cast<int64_t>(x));
  }
  uint64_t bytes = 0;
  if (mul_overflows(elements, dtype_size(e.dtype), bytes)) return Status::error(where + "byte size overflows 64 bits");

  auto o = v.find("data_offsets");
  if (o == v.end() || !o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() ||
      !(*o)[1].is_number_unsigned())
    return Status::error(where + "'data_offsets' must be two non-negative integers");
  e.begin = (*o)[0].get<uint64_t>();
  e.end = (*o)[1].get<uint64_t>();
  if (e.end < e.begin)
    return Status::error(where + "data_offsets end " + std::to_string(e.end) + " is before begin " +
                         std::to_string(e.begin));
  if (e.end - e.begin != bytes)
    return Status::error(where + "data_offsets span " + std::to_string(e.end - e.begin) + " bytes but dtype " + dname +
                         " x shape needs " + std::to_string(bytes));
  return e;
}

}  // namespace

uint64_t SafetensorsEntry::num_elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

Result<SafetensorsHeader> parse_safetensors_header(std::span<const uint8_t> prefix, uint64_t file_size) {
  if (file_size < 8 || prefix.size() < 8)
    return Status::error("file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[static_cast<std::size_t>(i)];
  if (n > kSafetensorsMaxHeaderBytes)
    return Status::error("header length " + std::to_string(n) + " exceeds the limit of " +
                         std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  if (n > file_size - 8)
    return Status::error("header length " + std::to_string(n) + " runs past the end of the file (" +
                         std::to_string(file_size) + " bytes)");
  if (prefix.size() < 8 + n) return Status::error("header is truncated");
  if (n == 0 || prefix[8] != '{') return Status::error("header is not a JSON object (must start with '{')");

  // nlohmann keeps the last of duplicate keys silently; a parser callback sees each key.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  const char* begin = reinterpret_cast<const char*>(prefix.data() + 8);
  json header = json::parse(begin, begin + n, on_event, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Status::error("header is not valid JSON");
  if (!header.is_object()) return Status::error("header is not a JSON object");
  if (!duplicate.empty()) return Status::error("tensor name " + in_quotes(duplicate) + " appears twice in the header");

  SafetensorsHeader h;
  h.header_bytes = n;
  h.data_start = 8 + n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Status::error("'__metadata__' must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return Status::error("'__metadata__' value for " + in_quotes(m.key()) + " is not a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    auto e = parse_entry(it.key(), *it);
    if (!e) return e.status();
    h.entries.push_back(std::move(*e));
  }

  std::sort(h.entries.begin(), h.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : h.entries) {
    if (e.begin < expected)
      return Status::error("tensor " + in_quotes(e.name) + " data [" + std::to_string(e.begin) + ", " +
                           std::to_string(e.end) + ") overlaps tensor " + in_quotes(prev->name));
    if (e.begin > expected)
      return Status::error(
          "gap of " + std::to_string(e.begin - expected) + " bytes before tensor " + in_quotes(e.name) +
          (prev ? " (after " + in_quotes(prev->name) + ")" : std::string(" (data must start at offset 0)")));
    expected = e.end;
    prev = &e;
  }
  const uint64_t data_bytes = file_size - h.data_start;
  if (expected < data_bytes)
    return Status::error(std::to_string(data_bytes - expected) + " trailing bytes after the last tensor");
  if (expected > data_bytes)
    return Status::error("data is truncated: tensors need " + std::to_string(expected) + " bytes, the file holds " +
                         std::to_string(data_bytes));
  return h;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    header_ = std::move(other.header_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void SafetensorsFile::read_f32(const SafetensorsEntry& e, std::span<float> out) const {
  KVP_CHECK(out.size() == e.num_elements());
  KVP_CHECK(header_.data_start + e.end <= size_);
  if (out.empty()) return;
  const uint8_t* src = data_ + header_.data_start + e.begin;
  const std::size_t element = dtype_size(e.dtype);
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // Converted a chunk at a time; the whole pages behind each finished chunk are dropped from
  // this process's resident set at once (the page cache keeps them; a later read faults them
  // back in), so a load never holds more than one chunk of file pages beside the fp32 weights.
  constexpr std::size_t kChunk = std::size_t{1} << 22;  // elements
  uintptr_t released = (reinterpret_cast<uintptr_t>(src) + page - 1) / page * page;
  for (std::size_t begin = 0; begin < out.size(); begin += kChunk) {
    const std::size_t end = std::min(out.size(), begin + kChunk);
    for (std::size_t i = begin; i < end; ++i) {
      switch (e.dtype) {
        case DType::kF32: {
          uint32_t u = static_cast<uint32_t>(src[4 * i]) | static_cast<uint32_t>(src[4 * i + 1]) << 8 |
                       static_cast<uint32_t>(src[4 * i + 2]) << 16 | static_cast<uint32_t>(src[4 * i + 3]) << 24;
          out[i] = bits_float(u);
          break;
        }
        case DType::kF16: out[i] = f16_to_float(static_cast<uint16_t>(src[2 * i] | src[2 * i + 1] << 8)); break;
        case DType::kBF16: out[i] = bf16_to_float(static_cast<uint16_t>(src[2 * i] | src[2 * i + 1] << 8)); break;
        case DType::kF64:
        case DType::kF8E4M3:
        case DType::kF8E5M2: KVP_CHECK(false);
      }
    }
    const uintptr_t done = (reinterpret_cast<uintptr_t>(src) + end * element) / page * page;
    if (done > released) {
      ::madvise(reinterpret_cast<void*>(released), done - released, MADV_DONTNEED);
      released = done;
    }
  }
}

Result<SafetensorsFile> read_safetensors(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return Status::error("no such file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(std::string("cannot open for reading: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::error(std::string("cannot stat: ") + std::strerror(err));
  }
  SafetensorsFile f;
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      f.size_ = 0;
      return Status::error(std::string("cannot map: ") + std::strerror(err));
    }
    f.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file
  auto h = parse_safetensors_header(std::span<const uint8_t>(f.data_, f.data_ ? f.size_ : 0), f.size_);
  if (!h) return h.status();
  f.header_ = std::move(*h);
  return f;
}

Status write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsTensorToWrite>& tensors,
                         DType dtype, const std::map<std::string, std::string>& metadata) {
  if (dtype == DType::kF64 || is_fp8(dtype))
    return Status::error("writing " + std::string(dtype_name(dtype)) + " is not supported");
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (!names.insert(t.name).second) return Status::error("tensor " + in_quotes(t.name) + " given twice");
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    if (elements != t.data.size())
      return Status::error("tensor " + in_quotes(t.name) + ": shape does not match data size");
    const uint64_t bytes = elements * dtype_size(dtype);
    header[t.name] = {
        {"dtype", std::string(dtype_name(dtype))}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status::error("cannot open " + tmp.string() + " for writing");
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    f.write(reinterpret_cast<const char*>(length), 8);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    // Data in the order of `tensors`, the order the offsets above were assigned in,
    // converted a chunk at a time.
    constexpr std::size_t kChunk = std::size_t{1} << 20;
    std::vector<uint8_t> out;
    out.reserve(kChunk * 4);
    for (const auto& t : tensors) {
      for (std::size_t begin = 0; begin < t.data.size() && f; begin += kChunk) {
        out.clear();
        const std::size_t end = std::min(t.data.size(), begin + kChunk);
        for (std::size_t i = begin; i < end; ++i) {
          const float v = t.data[i];
          switch (dtype) {
            case DType::kF32: {
              uint32_t u = float_bits(v);
              for (int b = 0; b < 4; ++b) out.push_back(static_cast<uint8_t>(u >> (8 * b)));
              break;
            }
            case DType::kF16:
            case DType::kBF16: {
              uint16_t u = dtype == DType::kF16 ? float_to_f16(v) : float_to_bf16(v);
              out.push_back(static_cast<uint8_t>(u));
              out.push_back(static_cast<uint8_t>(u >> 8));
              break;
            }
            case DType::kF64:
            case DType::kF8E4M3:
            case DType::kF8E5M2: break;
          }
        }
        f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
      }
    }
    f.close();
    if (!f) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return Status::error("write to " + tmp.string() + " failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Status::error("cannot rename into place: " + ec.message());
  }
  return Status::ok();
}

}  // namespace kvp
