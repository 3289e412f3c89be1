// See cpu_kernels_scalar.h. This file is compiled with KVP_NO_VECTOR_EXTENSIONS
// (tests/CMakeLists.txt); the check below stops it from silently using the vector loops.
#ifndef KVP_NO_VECTOR_EXTENSIONS
#error "tests/cpu_kernels_scalar.cc must be compiled with -DKVP_NO_VECTOR_EXTENSIONS"
#endif
#include "tests/cpu_kernels_scalar.h"

#include <vector>

#include "kernels/cpu_attention.h"

namespace kvp::scalar_loops_test {
namespace kk = kvp::kernels::scalar_loops;

float dot(const float* a, const float* b, int64_t n) { return kk::dot(a, b, n); }
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  kk::rms_norm(x, weight, n, eps, out);
}

namespace {
template <typename KvT>
void attention_typed(const float* q, const KvT* k_pool, const KvT* v_pool, const int32_t* table, int64_t block_size,
                     int64_t num_kv_heads, int64_t kv_head, int64_t head_dim, int64_t position, float scale,
                     int64_t partition, float* out) {
  std::vector<float> scratch(static_cast<std::size_t>(kk::attention_scratch_size<KvT>(head_dim)));
  kk::paged_attention_head(q, k_pool, v_pool, table, block_size, num_kv_heads, kv_head, head_dim, position, scale,
                           partition, scratch.data(), out);
}
}  // namespace

void attention(const float* q, const float* k_pool, const float* v_pool, const int32_t* table, int64_t block_size,
               int64_t num_kv_heads, int64_t kv_head, int64_t head_dim, int64_t position, float scale,
               int64_t partition, float* out) {
  attention_typed(q, k_pool, v_pool, table, block_size, num_kv_heads, kv_head, head_dim, position, scale, partition,
                  out);
}
void attention(const float* q, const kernels::F16Bits* k_pool, const kernels::F16Bits* v_pool, const int32_t* table,
               int64_t block_size, int64_t num_kv_heads, int64_t kv_head, int64_t head_dim, int64_t position,
               float scale, int64_t partition, float* out) {
  attention_typed(q, k_pool, v_pool, table, block_size, num_kv_heads, kv_head, head_dim, position, scale, partition,
                  out);
}

}  // namespace kvp::scalar_loops_test
