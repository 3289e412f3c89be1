// main() for RapidCheck property tests: CI's case count unless RC_PARAMS says otherwise.
// RapidCheck reads RC_PARAMS once, on first use, so the default is set before any test.
#include <cstdlib>

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::setenv("RC_PARAMS", "max_success=500 seed=1 verbose_progress=0", /*overwrite=*/0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
