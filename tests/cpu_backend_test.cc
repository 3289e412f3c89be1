// What is particular to the CPU backend (its config); everything a backend must do is in
// the conformance suite (backend_conformance_test.cc), which runs the CPU backend too.
#include "optimized/backends/cpu_backend.h"

#include <string>

#include <gtest/gtest.h>

#include "model/presets.h"
#include "optimized/backends/plan_validation.h"

namespace kvp {
namespace {

const Model& tiny() {
  static const Model m = *make_preset("tiny", 0);
  return m;
}

TEST(CpuBackend, CreateRejectsBadConfigs) {
  CpuBackendConfig c;
  c.pool = pool_shape_for(tiny().config, 4, 4, 0);
  c.pool.num_layers += 1;  // a pool laid out for another model
  auto wrong_model = CpuBackend::create(tiny(), c);
  ASSERT_FALSE(wrong_model.is_ok());
  EXPECT_NE(wrong_model.status().message().find("num_layers"), std::string::npos) << wrong_model.status().message();
  c.pool.num_layers -= 1;
  c.pool.kv_dtype = DType::kBF16;
  EXPECT_FALSE(CpuBackend::create(tiny(), c).is_ok());
  c.pool.kv_dtype = DType::kF32;
  c.pool.block_size = 0;
  EXPECT_FALSE(CpuBackend::create(tiny(), c).is_ok());
  c.pool.block_size = 4;
  c.num_threads = 0;
  EXPECT_FALSE(CpuBackend::create(tiny(), c).is_ok());
  c.num_threads = 2;
  c.pool.num_device_blocks = 0;
  EXPECT_FALSE(CpuBackend::create(tiny(), c).is_ok());
  c.pool.num_device_blocks = 4;
  auto ok = CpuBackend::create(tiny(), c);
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ((*ok)->num_device_slots(), 16);
  EXPECT_STREQ((*ok)->name(), "cpu");
}

}  // namespace
}  // namespace kvp
