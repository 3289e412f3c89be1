// The one friend of KvCacheManager (kv_cache_manager.h): tests corrupt the manager's state
// through it to prove that the invariant checkers see each corruption.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optimized/kv/kv_cache_manager.h"

namespace kvp {

class KvCacheManagerTestPeer {
 public:
  static BlockAllocator& device(KvCacheManager& m) { return m.device_; }
  static PrefixCache& cache(KvCacheManager& m) { return m.cache_; }
  static SequenceState& seq(KvCacheManager& m, SeqId s) { return m.seqs_.at(s); }
  // I9's bookkeeping: `block` as if its current contents had been rolled back.
  static void mark_rolled_back(KvCacheManager& m, int32_t block) {
    m.rolled_back_generation_[static_cast<std::size_t>(block)] = m.device_allocator().generation(block);
  }
};

}  // namespace kvp
