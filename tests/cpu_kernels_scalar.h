// kernels/cpu_attention.h's scalar loops (the ones a device build runs), compiled in their
// own translation unit with KVP_NO_VECTOR_EXTENSIONS (tests/cpu_kernels_scalar.cc) so that a
// test can hold them beside the vector loops the host build uses and compare the bits.
#pragma once

#include <cstdint>

#include "kernels/kv_element.h"

namespace kvp::scalar_loops_test {

float dot(const float* a, const float* b, int64_t n);
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out);
// paged_attention_head over fp32 and fp16 pools; `partition` positions per partition.
void attention(const float* q, const float* k_pool, const float* v_pool, const int32_t* table, int64_t block_size,
               int64_t num_kv_heads, int64_t kv_head, int64_t head_dim, int64_t position, float scale,
               int64_t partition, float* out);
void attention(const float* q, const kernels::F16Bits* k_pool, const kernels::F16Bits* v_pool, const int32_t* table,
               int64_t block_size, int64_t num_kv_heads, int64_t kv_head, int64_t head_dim, int64_t position,
               float scale, int64_t partition, float* out);

}  // namespace kvp::scalar_loops_test
