// The backend conformance suite's fixture: a named factory that builds a backend for a
// model and a pool. tests/backend_conformance_test.cc holds the tests and one
// INSTANTIATE_TEST_SUITE_P line per backend.
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "kernels/cpu_attention.h"
#include "model/weights.h"
#include "optimized/backends/backend.h"
#include "optimized/backends/plan_validation.h"

namespace kvp::testing {

// What a conformance test asks of a backend beside the model.
struct BackendParams {
  KvPoolShape pool;
  int num_threads = 1;
  // Positions per attention partition (the split points that make results independent of
  // the batch); a backend without partitions ignores it.
  int64_t attention_partition = kernels::kDefaultAttentionPartition;
  // The CUDA backends' weight storage (the cpu backend computes with the model's fp32 values).
  DType weight_dtype = DType::kF32;
  // The CUDA backends' decode graphs (CudaBackendConfig::max_graph_tokens; 0: eager).
  int64_t max_graph_tokens = 64;
};

struct BackendFactory {
  std::string name;
  std::function<Result<std::unique_ptr<Backend>>(const Model&, const BackendParams&)> make;
};

// So that gtest names a failing instantiation's backend instead of dumping its bytes.
inline void PrintTo(const BackendFactory& f, std::ostream* os) { *os << f.name; }

class BackendConformance : public ::testing::TestWithParam<BackendFactory> {
 protected:
  std::unique_ptr<Backend> make_backend(const Model& m, int32_t num_blocks, int32_t block_size, int num_threads = 1,
                                        int64_t partition = kernels::kDefaultAttentionPartition,
                                        int32_t host_blocks = 0) {
    BackendParams p;
    p.pool = pool_shape_for(m.config, block_size, num_blocks, host_blocks);
    p.num_threads = num_threads;
    p.attention_partition = partition;
    auto b = GetParam().make(m, p);
    EXPECT_TRUE(b.is_ok()) << GetParam().name << ": " << b.status().message();
    if (!b.is_ok()) return nullptr;
    return std::move(*b);
  }
};

}  // namespace kvp::testing
