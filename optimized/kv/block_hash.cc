#include "optimized/kv/block_hash.h"

#include <openssl/sha.h>

#include <vector>

#include "common/status.h"

namespace kvp {

BlockHash chain_hash(const BlockHash* parent, int64_t salt, std::span<const int32_t> tokens,
                     int hash_bits) {
  KVP_CHECK(hash_bits >= 1 && hash_bits <= 256);
  // Layout (little-endian): parent digest (32 zero bytes for the first block), a presence
  // byte for the parent, the salt (8 bytes), then the tokens (4 bytes each).
  constexpr size_t kHeader = 32 + 1 + 8;
  uint8_t stack_buf[kHeader + 4 * 64];
  std::vector<uint8_t> heap_buf;
  const size_t n = kHeader + 4 * tokens.size();
  uint8_t* buf = stack_buf;
  if (n > sizeof stack_buf) {
    heap_buf.resize(n);
    buf = heap_buf.data();
  }
  if (parent != nullptr) {
    std::memcpy(buf, parent->data(), 32);
  } else {
    std::memset(buf, 0, 32);
  }
  buf[32] = parent != nullptr ? 1 : 0;
  const auto usalt = static_cast<uint64_t>(salt);
  for (int i = 0; i < 8; ++i) buf[33 + i] = static_cast<uint8_t>(usalt >> (8 * i));
  uint8_t* p = buf + kHeader;
  for (int32_t t : tokens) {
    const auto u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) *p++ = static_cast<uint8_t>(u >> (8 * i));
  }
  BlockHash h;
  SHA256(buf, n, h.data());
  if (hash_bits < 256) {
    const int full_bytes = hash_bits / 8;
    const int rem = hash_bits % 8;
    int i = full_bytes;
    if (rem != 0) {
      h[static_cast<size_t>(i)] &= static_cast<uint8_t>(0xFFu << (8 - rem));
      ++i;
    }
    for (; i < 32; ++i) h[static_cast<size_t>(i)] = 0;
  }
  return h;
}

}  // namespace kvp
