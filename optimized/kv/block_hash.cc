#include "optimized/kv/block_hash.h"

#include <openssl/evp.h>

#include <cstring>
#include <vector>

#include "common/status.h"

namespace kvp {

namespace {

// OpenSSL's one-shot SHA256() fetches the algorithm and allocates a digest context on every
// call; a sequence's prefix hashes are on the scheduler's hot path, so each thread fetches
// once and reuses one context (the handle and context are never shared across threads).
class Sha256 {
 public:
  Sha256() : md_(EVP_MD_fetch(nullptr, "SHA256", nullptr)), ctx_(EVP_MD_CTX_new()) {
    KVP_CHECK(md_ != nullptr && ctx_ != nullptr);
  }
  ~Sha256() {
    EVP_MD_CTX_free(ctx_);
    EVP_MD_free(md_);
  }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void digest(const uint8_t* data, size_t n, uint8_t* out) {
    unsigned int len = 0;
    KVP_CHECK(EVP_DigestInit_ex2(ctx_, md_, nullptr) == 1 && EVP_DigestUpdate(ctx_, data, n) == 1 &&
              EVP_DigestFinal_ex(ctx_, out, &len) == 1 && len == 32);
  }

 private:
  EVP_MD* md_;
  EVP_MD_CTX* ctx_;
};

}  // namespace

BlockHash chain_hash(const BlockHash* parent, int64_t salt, std::span<const int32_t> tokens, int hash_bits) {
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
  thread_local Sha256 sha256;
  sha256.digest(buf, n, h.data());
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
