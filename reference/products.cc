#include "reference/products.h"

#include <cstdlib>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

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

// AMD's Zen 4 (family 0x19; earlier families have no AVX-512) runs a 512-bit FMA as two
// 256-bit halves, and Eigen's fp64 AVX-512 kernel (24 x 4 blocks) is slower there than its
// AVX2 one: on this project's CI machine (AMD EPYC, 2 cores), X W^T for 16, 48 and 64 tokens
// of a 576 -> 49,152 projection took 68, 112-117 and 141-146 ms with AVX-512 against 39-46,
// 83-85 and 94-106 ms with AVX2, and `kvproof verify --preset smollm2-135m` 36.7-37.4 s
// against 31.8-32.3 s. The choice is the CPU's, never a timing's: the oracle's bits are the
// same on every run on one machine.
bool avx512_runs_half_width() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool amd = ebx == 0x68747541 && edx == 0x69746e65 && ecx == 0x444d4163;  // "AuthenticAMD"
  if (!amd || __get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  unsigned family = (eax >> 8) & 0xf;
  if (family == 0xf) family += (eax >> 20) & 0xff;
  return family <= 0x19;
#else
  return false;
#endif
}

ProductIsa choose_isa() {
  if (const char* env = std::getenv("KVP_ORACLE_ISA"); env != nullptr) {
    for (ProductIsa isa : {ProductIsa::kHost, ProductIsa::kAvx512}) {
      if (product_isa_name(isa) == env && product_isa_supported(isa)) return isa;
    }
  }
  const bool wide = product_isa_supported(ProductIsa::kAvx512) && !avx512_runs_half_width();
  return wide ? ProductIsa::kAvx512 : ProductIsa::kHost;
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
