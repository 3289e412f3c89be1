// The oracle's matrix-matrix products, with Eigen's kernels compiled for one of two ISAs:
//   host    the ISA the whole build targets (KVPROOF_HOST_ISA: AVX2 + FMA here, or x86-64's
//           baseline), Eigen's products as the rest of the oracle has them;
//   avx512  the same Eigen products compiled for AVX-512 (products_avx512.cc), chosen at
//           run time where the CPU and the OS have it, so one binary still runs anywhere.
// Each is deterministic (the same bits for the same operands and shapes); the two differ by
// rounding (Eigen's AVX-512 kernel sums in other groups). The oracle keeps one ISA for its
// whole life (ReferenceModel::set_product_isa), so its bitwise properties (a prefill equals
// its decodes, threads change no bit) hold on either, and tests/reference_model_test.cc
// checks them on each ISA this CPU has.
//
// Why a second copy of Eigen's products: Eigen chooses its kernels when it is compiled, and
// the batched oracle spends ~60% of its time in the products (SmolLM2-135M, 1,024 tokens).
// products_avx512.cc renames Eigen's namespace, so its templates can never be merged with
// the host ones by the linker (the test reference.avx512_object_isolated checks it).
#pragma once

#include <cstdint>
#include <string_view>

namespace kvp::ref {

enum class ProductIsa { kHost, kAvx512 };

std::string_view product_isa_name(ProductIsa isa);
// Whether this build has the ISA's products and this CPU (and OS) can run them.
bool product_isa_supported(ProductIsa isa);
// The widest supported ISA (but host on AMD Zen 4, whose AVX-512 runs at half width and
// Eigen's AVX-512 kernel slower than its AVX2 one: products.cc), or the one named by the
// environment variable KVP_ORACLE_ISA (host, avx512) where supported; chosen once per
// process, from the CPU alone.
ProductIsa default_product_isa();

// Row-major operands, each with its leading dimension (elements between rows).
// c[m x n] = a[m x k] * b[n x k]^T
template <typename T>
void product_abt(ProductIsa isa, const T* a, int64_t lda, const T* b, int64_t ldb, int64_t m, int64_t n, int64_t k,
                 T* c, int64_t ldc);
// c[m x n] = a[m x k] * b[k x n]
template <typename T>
void product_ab(ProductIsa isa, const T* a, int64_t lda, const T* b, int64_t ldb, int64_t m, int64_t n, int64_t k, T* c,
                int64_t ldc);

// The AVX-512 copies (products_avx512.cc; only in builds that have them): plain functions,
// not templates, so that nothing of them is a weak symbol the linker could merge.
namespace avx512 {
void product_abt(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m, int64_t n, int64_t k, float* c,
                 int64_t ldc);
void product_abt(const double* a, int64_t lda, const double* b, int64_t ldb, int64_t m, int64_t n, int64_t k, double* c,
                 int64_t ldc);
void product_ab(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m, int64_t n, int64_t k, float* c,
                int64_t ldc);
void product_ab(const double* a, int64_t lda, const double* b, int64_t ldb, int64_t m, int64_t n, int64_t k, double* c,
                int64_t ldc);
}  // namespace avx512

}  // namespace kvp::ref
