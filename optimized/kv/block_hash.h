// The prefix-cache chain hash: H(parent hash, tenant salt, block tokens), SHA-256.
//
// The hash names a full block's content together with everything before it, so equal hashes
// suggest equal prefixes; the prefix cache still compares tokens and the parent chain before
// it accepts a hit (a hash is a hint, never a proof). `hash_bits` < 256 truncates the digest
// (the remaining bits are zero): tests use a few bits to make collisions constant.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>

namespace kvp {

using BlockHash = std::array<uint8_t, 32>;

// REQUIRES: 1 <= hash_bits <= 256. `parent` is nullptr for a sequence's first block.
BlockHash chain_hash(const BlockHash* parent, int64_t salt, std::span<const int32_t> tokens, int hash_bits);

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    uint64_t v;
    std::memcpy(&v, h.data(), sizeof v);
    return static_cast<size_t>(v);
  }
};

}  // namespace kvp
