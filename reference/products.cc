#include "reference/products.h"

#include <cstdlib>

#include <Eigen/Core>

#include "common/status.h"

namespace kvp::ref {
namespace {
#include "reference/products_body.inc"

bool cpu_has_avx512() {
#if defined(KVP_ORACLE_AVX512) && (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__GNUC__) || defined(__clang__))
  // libgcc's checks include the OS's: the ZMM state enabled in XCR0.
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

ProductIsa choose_isa() {
  ProductIsa widest = product_isa_supported(ProductIsa::kAvx512) ? ProductIsa::kAvx512 : ProductIsa::kHost;
  if (const char* env = std::getenv("KVP_ORACLE_ISA"); env != nullptr) {
    for (ProductIsa isa : {ProductIsa::kHost, ProductIsa::kAvx512}) {
      if (product_isa_name(isa) == env && product_isa_supported(isa)) return isa;
    }
  }
  return widest;
}

}  // namespace

std::string_view product_isa_name(ProductIsa isa) {
  switch (isa) {
    case ProductIsa::kHost: return "host";
    case ProductIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

bool product_isa_supported(ProductIsa isa) {
  if (isa == ProductIsa::kHost) return true;
  static const bool avx512 = cpu_has_avx512();
  return avx512;
}

ProductIsa default_product_isa() {
  static const ProductIsa chosen = choose_isa();
  return chosen;
}

// Runs a product's host version, or its AVX-512 copy where `isa` says so (the one place
// that knows whether this build has the copies). REQUIRES: product_isa_supported(isa).
template <typename Host, typename Wide>
void run_on(ProductIsa isa, const Host& host, [[maybe_unused]] const Wide& wide) {
  KVP_CHECK(product_isa_supported(isa));
#if defined(KVP_ORACLE_AVX512)
  if (isa == ProductIsa::kAvx512) return wide();
#endif
  host();
}

template <typename T>
void product_abt(ProductIsa isa, const T* a, int64_t lda, const T* b, int64_t ldb, int64_t m, int64_t n, int64_t k,
                 T* c, int64_t ldc) {
  run_on(
      isa, [&] { abt<T>(a, lda, b, ldb, m, n, k, c, ldc); },
      [&] { avx512::product_abt(a, lda, b, ldb, m, n, k, c, ldc); });
}

template <typename T>
void product_ab(ProductIsa isa, const T* a, int64_t lda, const T* b, int64_t ldb, int64_t m, int64_t n, int64_t k, T* c,
                int64_t ldc) {
  run_on(
      isa, [&] { ab<T>(a, lda, b, ldb, m, n, k, c, ldc); },
      [&] { avx512::product_ab(a, lda, b, ldb, m, n, k, c, ldc); });
}

template void product_abt<float>(ProductIsa, const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                                 float*, int64_t);
template void product_abt<double>(ProductIsa, const double*, int64_t, const double*, int64_t, int64_t, int64_t, int64_t,
                                  double*, int64_t);
template void product_ab<float>(ProductIsa, const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                                float*, int64_t);
template void product_ab<double>(ProductIsa, const double*, int64_t, const double*, int64_t, int64_t, int64_t, int64_t,
                                 double*, int64_t);

}  // namespace kvp::ref
