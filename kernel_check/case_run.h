// kernel-check's machinery for one case, shared by its properties (properties.cc), its grid
// (grid.cc) and its harness (kernel_check.cc): the inputs drawn from a case's seed, the fp64
// reference, and one call of the plug-in with `out` between guard zones (on the device for a
// CUDA plug-in). Internal to kernel_check/; the contract is kernel_check.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_check/kernel_check.h"

namespace kvp::verify::kernel_check {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr uint64_t kGridSeed = 0x6b65726e656c3138ull;  // "kernel18"
constexpr int64_t kGuardFloats = 64;
constexpr uint32_t kGuardBits = 0x7fa5a5a5u;  // a NaN payload no kernel computes
constexpr float kUnwritten = 1.0e30f;         // `out` before the call: a row left unwritten fails accuracy

inline int64_t element_size(int32_t dtype) {
  return dtype == KVP_KV_F32 ? 4 : dtype == KVP_KV_FP8_E4M3 || dtype == KVP_KV_FP8_E5M2 ? 1 : 2;
}
inline bool is_fp8_dtype(int32_t dtype) { return dtype == KVP_KV_FP8_E4M3 || dtype == KVP_KV_FP8_E5M2; }

// Whether a layout keeps K and V in one array (FlashInfer's), so that there is no V pool.
bool combined_pool(int32_t layout);

struct Inputs {
  kvp_attention_shape shape{};
  std::vector<float> query;
  std::vector<int32_t> query_start, token_seq, positions, context_lens, block_tables;
  std::vector<std::vector<float>> k_dense, v_dense;  // per sequence [context][kv head][head_dim]
  std::vector<uint8_t> k_pool, v_pool;               // v_pool empty for a combined layout
  int64_t v_offset_bytes = 0;                        // combined layout: v_cache = k_cache + this
  float scale = 1.0f;
  // fp8 pools: per KV head, powers of two far from 1 (so that x / scale is exact and a kernel
  // that drops them reads other values); empty for the other dtypes.
  std::vector<float> k_scales, v_scales;
  int32_t window = 0;    // the case's sliding window (0: none)
  float softcap = 0.0f;  // the case's score soft-cap (0: none)
  // Per sequence: its leading table entries that a window left behind (blocks wholly before
  // its first new token's window), all naming one block of NaN outside every table; 0 without
  // a window.
  std::vector<int32_t> dead_entries;
};

// The first position token `position` sees through a window of `window` positions (0: none).
inline int64_t first_visible(int64_t position, int32_t window) {
  return window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
}

// A case's inputs, drawn from its seed (the pools not yet filled).
Inputs make_inputs(const KernelCase& c);
// Scatters the dense K/V into the pools through the block tables (past each sequence's dead
// entries); every other slot is NaN (`nan_poison`) or 0.
void fill_pool(const KernelCase& c, Inputs& in, bool nan_poison);
// softmax(cap(scale * q K^T)) V in double on the dense K/V over each token's window, per
// (token, head) row, with cap(x) = c * tanh(x / c) for a soft-capped case.
std::vector<double> reference_attention(const KernelCase& c, const Inputs& in);

struct Output {
  std::vector<float> buffer;  // guard, out, guard
  int status = 0;
  std::string error;
  std::vector<std::string> inputs_changed;  // a CUDA plug-in: device copies read back changed
  float* out() { return buffer.data() + kGuardFloats; }
};

// One run() of the plug-in on `in` (or on a part of it: another shape and arrays, for a
// sequence alone), `out` between guard zones; a CUDA plug-in on device copies read back.
Output call_plugin(const kvp_attention_plugin& plugin, const Inputs& in, const kvp_attention_shape& shape,
                   const float* query, const int32_t* query_start, const int32_t* token_seq, const int32_t* positions,
                   const int32_t* context_lens, const int32_t* block_tables);
Output call_plugin(const kvp_attention_plugin& plugin, const Inputs& in);

bool same_bits(const float* a, const float* b, int64_t n);
int64_t count_non_finite(const float* p, int64_t n);
// One unit in the last place of the KV dtype at magnitude x.
double ulp_of(double x, int32_t dtype);
// "token T (seq S, position P) head H" for an output row.
std::string row_name(const KernelCase& c, const Inputs& in, int64_t row);

}  // namespace kvp::verify::kernel_check
