// The oracle's products compiled for AVX-512 (reference/products.h). This file alone is
// compiled with -mavx512f -mavx512dq -mavx512vl, and is only run where the CPU has them.
//
// Every template Eigen instantiates here would have the same name as its AVX2 twin in the
// rest of the build, and the linker keeps one copy of each: the AVX-512 one could then run
// on a CPU without AVX-512 (SIGILL; Valgrind's CPU is one). So Eigen's namespace is renamed
// for this file, and our own templates live in an unnamed namespace: nothing here can be
// merged with code compiled for the host. The test reference.avx512_object_isolated reads
// this object's symbols and fails on any weak (mergeable) definition.
#if !defined(__AVX512F__)
#error "products_avx512.cc must be compiled with -mavx512f (reference/CMakeLists.txt)"
#endif

#define Eigen kvp_oracle_eigen_avx512
#include <Eigen/Core>

#include "reference/products.h"

namespace kvp::ref {
namespace {
#include "reference/products_body.inc"
}  // namespace

namespace avx512 {

void product_abt(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m, int64_t n, int64_t k, float* c,
                 int64_t ldc) {
  abt<float>(a, lda, b, ldb, m, n, k, c, ldc);
}
void product_abt(const double* a, int64_t lda, const double* b, int64_t ldb, int64_t m, int64_t n, int64_t k, double* c,
                 int64_t ldc) {
  abt<double>(a, lda, b, ldb, m, n, k, c, ldc);
}
void product_ab(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m, int64_t n, int64_t k, float* c,
                int64_t ldc) {
  ab<float>(a, lda, b, ldb, m, n, k, c, ldc);
}
void product_ab(const double* a, int64_t lda, const double* b, int64_t ldb, int64_t m, int64_t n, int64_t k, double* c,
                int64_t ldc) {
  ab<double>(a, lda, b, ldb, m, n, k, c, ldc);
}

}  // namespace avx512
}  // namespace kvp::ref
