// A tiny consumer of fuzzer input bytes (FuzzedDataProvider is clang-only; the corpus is also
// replayed in gcc builds). Past the end it yields zeros.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvp::fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  // Uniform-ish in [0, n). REQUIRES: n > 0.
  int below(int n) { return u8() % n; }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace kvp::fuzz
