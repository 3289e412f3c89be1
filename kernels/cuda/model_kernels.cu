// The CUDA backend's kernels, one source for both flavours (see model_kernels.h): nvcc
// builds kvp_cuda_kernels_dev, the host compiler builds kvp_cuda_kernels_emu through
// model_kernels_emulated.cc and the SIMT layer. Kernel bodies hold no flavour #ifdefs.
//
// The per-token kernels give one output element (or one (token, head) pair) to one CUDA
// thread and compute it with the CPU backend's loops from kernels/cpu_attention.h; attention
// runs paged_attention_head's recurrence spread over a thread block, step for step in the
// same order. So the reduction order of every value is fixed by the sizes alone (N1), and
// the emulated flavour gives the CPU backend's bits. The GPU flavour may differ in the last bits (nvcc contracts a*b+c
// into FMA; see kernels/simt/simt.h, "Fidelity"), but is as deterministic.
#include "kernels/cuda/model_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "kernels/cpu_attention.h"
#include "kernels/gemm.h"
#include "kernels/kv_element.h"
#include "kernels/kv_index.h"
#include "kernels/simt/simt.h"

namespace kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS {
namespace {

constexpr int kThreads = 128;
// Attention kernel 1: positions per shared-memory tile, accumulator elements per thread (in
// registers: more spills), and threads per block: at least kAttentionMinThreads, and enough
// for group * head_dim accumulator elements, up to kAttentionMaxThreads. The block's shape
// follows the model's shape only; no element's arithmetic depends on it.
constexpr int64_t kAttentionTile = 16;
constexpr int kAttentionAccPerThread = 16;
constexpr int64_t kAttentionMinThreads = 128;
constexpr int64_t kAttentionMaxThreads = 512;  // x 128 registers (ptxas, sm_90) = an SM's 64K

// One thread also per query head of the group: thread h < group carries head h's softmax
// recurrence (a group over the thread count would leave heads without one).
int64_t attention_threads(int64_t group, int64_t head_dim) {
  const int64_t for_acc = (group * head_dim + kAttentionAccPerThread - 1) / kAttentionAccPerThread;
  const int64_t needed = for_acc > group ? for_acc : group;
  const int64_t warps = (needed + 31) / 32;
  return std::max<int64_t>(kAttentionMinThreads, warps * 32);
}
constexpr int64_t kAttentionMaxShared = 48 * 1024;  // the default dynamic shared memory limit

std::size_t attention_shared_bytes(int64_t group, int64_t head_dim) {
  return static_cast<std::size_t>(2 * kAttentionTile * head_dim + 2 * group * kAttentionTile) * sizeof(float);
}

std::string fail(const char* what, cudaError_t e) { return std::string(what) + ": " + kvp::simt::error_message(e); }

// The launch's own error (configuration, or under emulation the kernel's fault).
std::string launched(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : fail(kernel, e);
}

dim3 grid_for(int64_t items) { return dim3(static_cast<unsigned>((items + kThreads - 1) / kThreads)); }

__device__ __forceinline__ int64_t global_index() {
  return static_cast<int64_t>(blockIdx.x) * static_cast<int64_t>(blockDim.x) + static_cast<int64_t>(threadIdx.x);
}

// kFillPerThread consecutive elements per thread: a pool is large, and a thread per element
// costs the emulator one fiber each.
constexpr int64_t kFillPerThread = 8;
template <typename KvT>
__global__ void fill_kv_nan_kernel(KvT* x, int64_t n) {
  const int64_t first = global_index() * kFillPerThread;
  for (int64_t i = first; i < n && i < first + kFillPerThread; ++i) kvp::kernels::kv_store_nan(x + i);
}

template <typename W>
__global__ void embed_kernel(const W* table, const int32_t* ids, int64_t n, int64_t hidden, float scale, float* x) {
  const int64_t i = global_index();
  if (i >= n * hidden) return;
  const int64_t t = i / hidden;
  const int64_t c = i % hidden;
  const float e = kvp::kernels::kv_to_float(table[static_cast<int64_t>(ids[t]) * hidden + c]);
  x[i] = scale == 1.0f ? e : e * scale;
}

// One thread per row: rms_norm's reduction is dot(x, x) in its fixed order.
__global__ void rms_norm_kernel(const float* x, const int32_t* rows, const float* weight, int64_t n, int64_t hidden,
                                float eps, float* out) {
  const int64_t r = global_index();
  if (r >= n) return;
  const int64_t src = rows == nullptr ? r : static_cast<int64_t>(rows[r]);
  kvp::kernels::rms_norm(x + src * hidden, weight, hidden, eps, out + r * hidden);
}

// One thread per output row r and tile of up to kProjectTokens tokens; adjacent threads
// take adjacent rows of the same tile, so they share the tile's activations, and a thread
// reads its weight row once for the whole tile (emulated on the host, one element per
// thread read the weights once per token: half of `verify --backend cuda-emu`'s time on
// SmolLM2-135M). Each element's arithmetic is the CPU backend's (kernels/gemm.h), so the
// two give the same bits.
constexpr int64_t kProjectTokens = 8;

// A projection row's lanes. Lanes = 1: one thread reduces the row (projection_row: the scalar
// definition on a GPU, the host's GEMM emulated). Lanes = kRowLanes = 16, the GPU's default: a
// half-warp reduces it, lane l taking the definition's partial sum l (kernels/gemm.h:
// elements l, l + 16, ... of the row, so the 16 lanes read 64 consecutive bytes at a time,
// coalesced), a fused multiply-add chain per token of the tile; the halving tree is a
// butterfly over the 16 lanes (__shfl_xor_sync 8, 4, 2, 1: lane l < w adds lane l + w, as
// the tree does, so lane 0 ends with the tree's value) and lane 0 adds the tail chain and the
// bias. The same bits either way (dot_fma_scalar's), which the emulated flavour checks by
// running the engine with both (set_project_lanes).
constexpr int kRowLanes = 16;

// A projection kernel's compile-time choices as one type (one template argument, which
// KVP_LAUNCH's macro argument can carry): the weights' element type W (float, or BF16Bits
// widened exactly as read) and the lanes per row.
template <typename W_, int Lanes_>
struct ProjectCfg {
  using W = W_;
  static constexpr int kLanes = Lanes_;
};

template <int Lanes>
__device__ __forceinline__ unsigned row_lane_mask() {
  return Lanes == 1 ? 0u : (0xffffu << (threadIdx.x & 16u));
}

// y[t * out_dim + r] for t < tokens (x: the tile's rows), by the unit's lanes; lane 0 writes.
template <int Lanes, typename W>
__device__ __forceinline__ void lane_row(int lane, const W* w, const float* bias, int64_t out_dim, int64_t in_dim,
                                         const float* x, int64_t tokens, float* y, int64_t r) {
  if constexpr (Lanes == 1) {
    (void)lane;
    kvp::kernels::projection_row(w, bias, out_dim, in_dim, x, tokens, y, r);
  } else {
    static_assert(Lanes == kRowLanes, "a row's lanes are the definition's 16 partial sums");
    const unsigned mask = row_lane_mask<Lanes>();
    const W* wr = w + r * in_dim;
    const int64_t body = in_dim / kRowLanes * kRowLanes;
    float acc[kProjectTokens];
    KVP_UNROLL
    for (int t = 0; t < kProjectTokens; ++t) acc[t] = 0.0f;
    for (int64_t i = lane; i < body; i += kRowLanes) {
      const float wi = kvp::kernels::kv_to_float(wr[i]);
      KVP_UNROLL
      for (int t = 0; t < kProjectTokens; ++t)
        if (t < tokens) acc[t] = kvp::kernels::fma_rn(wi, x[t * in_dim + i], acc[t]);
    }
    for (int width = kRowLanes / 2; width > 0; width /= 2) {
      KVP_UNROLL
      for (int t = 0; t < kProjectTokens; ++t) acc[t] += __shfl_xor_sync(mask, acc[t], width, kRowLanes);
    }
    if (lane != 0) return;
    for (int64_t t = 0; t < tokens; ++t) {
      float tail = 0.0f;
      for (int64_t i = body; i < in_dim; ++i)
        tail = kvp::kernels::fma_rn(kvp::kernels::kv_to_float(wr[i]), x[t * in_dim + i], tail);
      float value = acc[t] + tail;
      if (bias != nullptr) value += bias[r];
      y[t * out_dim + r] = value;
    }
  }
}

// The (tile of kProjectTokens tokens, unit) a projection thread serves, a unit being `lanes`
// consecutive threads; false for the threads past the last unit (a unit's threads alike).
struct ProjectUnit {
  int64_t t0 = 0;      // the tile's first token
  int64_t unit = 0;    // the unit within the tile, < units
  int64_t tokens = 0;  // the tile's tokens, <= kProjectTokens
  int lane = 0;        // this thread within the unit, < lanes
};
__device__ __forceinline__ bool project_unit(int lanes, int64_t units, int64_t n, ProjectUnit& p) {
  const int64_t i = global_index() / lanes;
  if (i >= (n + kProjectTokens - 1) / kProjectTokens * units) return false;
  p.t0 = i / units * kProjectTokens;
  p.unit = i % units;
  p.tokens = n - p.t0 < kProjectTokens ? n - p.t0 : kProjectTokens;
  p.lane = static_cast<int>(threadIdx.x % static_cast<unsigned>(lanes));
  return true;
}

// The grid of a projection launch: `lanes` threads per (tile, unit).
dim3 project_grid(int64_t units, int64_t n, int lanes) {
  return grid_for((n + kProjectTokens - 1) / kProjectTokens * units * lanes);
}

template <class P>
__global__ void project_kernel(const typename P::W* w, const float* bias, int64_t out_dim, int64_t in_dim,
                               const float* x, int64_t n, float* y) {
  ProjectUnit p;
  if (!project_unit(P::kLanes, out_dim, n, p)) return;
  lane_row<P::kLanes>(p.lane, w, bias, out_dim, in_dim, x + p.t0 * in_dim, p.tokens, y + p.t0 * out_dim, p.unit);
}

// lane_row with the lanes chosen at run time (uniform across the grid).
template <typename W>
__device__ __forceinline__ void lane_row_n(int lanes, int lane, const W* w, const float* bias, int64_t out_dim,
                                           int64_t in_dim, const float* x, int64_t tokens, float* y, int64_t r) {
  if (lanes == 1) {
    lane_row<1>(lane, w, bias, out_dim, in_dim, x, tokens, y, r);
  } else {
    lane_row<kRowLanes>(lane, w, bias, out_dim, in_dim, x, tokens, y, r);
  }
}

// The q, k and v projections in one launch: one thread per (tile of kProjectTokens tokens,
// row of q, k or v), each row the projection_kernel's arithmetic on its own matrix.
template <class P>
__global__ void project_qkv_kernel(const typename P::W* wq, const float* bq, const typename P::W* wk, const float* bk,
                                   const typename P::W* wv, const float* bv, int64_t q_dim, int64_t kv_dim,
                                   int64_t in_dim, const float* x, int64_t n, float* q, float* k, float* v) {
  constexpr int Lanes = P::kLanes;
  ProjectUnit p;
  if (!project_unit(Lanes, q_dim + 2 * kv_dim, n, p)) return;
  const int lane = p.lane;
  const int64_t t0 = p.t0;
  const int64_t tokens = p.tokens;
  int64_t r = p.unit;
  const float* xt = x + t0 * in_dim;
  if (r < q_dim) {
    lane_row<Lanes>(lane, wq, bq, q_dim, in_dim, xt, tokens, q + t0 * q_dim, r);
    return;
  }
  r -= q_dim;
  if (r < kv_dim) {
    lane_row<Lanes>(lane, wk, bk, kv_dim, in_dim, xt, tokens, k + t0 * kv_dim, r);
    return;
  }
  lane_row<Lanes>(lane, wv, bv, kv_dim, in_dim, xt, tokens, v + t0 * kv_dim, r - kv_dim);
}

// project_qkv and heads_rope_kv (without q/k norms) in one launch: a thread per (tile, unit),
// the units being the rotary pairs of q (rows i and i + head_dim / 2 of a head), the rotary
// pairs of k, then the rows of v. A pair's thread projects both rows (projection_kernel's
// arithmetic), rotates each token's pair (apply_rope's), and a K pair or a V row goes into the
// token's slot (write_kv_kernel's rounding and scales); q stays in d_q for attention.
// P: the pool's element type P::Kv and the weights' P::W (a KvWeightsCfg).
template <typename Kv_, typename W_>
struct KvWeightsCfg {
  using Kv = Kv_;
  using W = W_;
};
template <class P>
__global__ void project_qkv_rope_kv_kernel(int lanes, const typename P::W* wq, const float* bq, const typename P::W* wk,
                                           const float* bk, const typename P::W* wv, const float* bv, int64_t num_heads,
                                           int64_t num_kv_heads, int64_t head_dim, int64_t in_dim, const float* x,
                                           int64_t n, const int32_t* positions, const float* inv_freq,
                                           const int64_t* slots, float* q, float* k, float* v, typename P::Kv* k_pool,
                                           typename P::Kv* v_pool, const float* k_scale, const float* v_scale) {
  const int64_t half = head_dim / 2;
  const int64_t q_dim = num_heads * head_dim;
  const int64_t kv_dim = num_kv_heads * head_dim;
  const int64_t q_pairs = num_heads * half;
  const int64_t k_pairs = num_kv_heads * half;
  ProjectUnit p;
  if (!project_unit(lanes, q_pairs + k_pairs + kv_dim, n, p)) return;
  const int lane = p.lane;
  const int64_t t0 = p.t0;
  const int64_t tokens = p.tokens;
  const int64_t u = p.unit;
  const float* xt = x + t0 * in_dim;
  if (u >= q_pairs + k_pairs) {  // a V row
    const int64_t r = u - q_pairs - k_pairs;
    float* vt = v + t0 * kv_dim;
    lane_row_n(lanes, lane, wv, bv, kv_dim, in_dim, xt, tokens, vt, r);
    if (lane != 0) return;  // lane 0 wrote the row: the epilogue is its
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t slot = slots[t0 + t];
      if (slot == kvp::kernels::kSkipSlot) continue;
      const float value = vt[t * kv_dim + r];
      kvp::kernels::kv_store(v_pool + slot * kv_dim + r, v_scale == nullptr ? value : value / v_scale[r / head_dim]);
    }
    return;
  }
  const bool is_q = u < q_pairs;
  const int64_t pair = is_q ? u : u - q_pairs;
  const int64_t head = pair / half;
  const int64_t d = pair % half;
  const int64_t r1 = head * head_dim + d;
  const int64_t r2 = r1 + half;
  const int64_t dim = is_q ? q_dim : kv_dim;
  float* y = (is_q ? q : k) + t0 * dim;
  lane_row_n(lanes, lane, is_q ? wq : wk, is_q ? bq : bk, dim, in_dim, xt, tokens, y, r1);
  lane_row_n(lanes, lane, is_q ? wq : wk, is_q ? bq : bk, dim, in_dim, xt, tokens, y, r2);
  if (lane != 0) return;
  for (int64_t t = 0; t < tokens; ++t) {
    float cs, sn;
    kvp::kernels::rope_angle_cos_sin(positions[t0 + t], inv_freq[d], cs, sn);
    float& x1 = y[t * dim + r1];
    float& x2 = y[t * dim + r2];
    kvp::kernels::rope_pair(x1, x2, cs, sn);
    if (is_q) continue;
    const int64_t slot = slots[t0 + t];
    if (slot == kvp::kernels::kSkipSlot) continue;
    if (k_scale == nullptr) {
      kvp::kernels::kv_store(k_pool + slot * kv_dim + r1, x1);
      kvp::kernels::kv_store(k_pool + slot * kv_dim + r2, x2);
    } else {
      kvp::kernels::kv_store(k_pool + slot * kv_dim + r1, x1 / k_scale[head]);
      kvp::kernels::kv_store(k_pool + slot * kv_dim + r2, x2 / k_scale[head]);
    }
  }
}

// The gate and up projections and the activation in one launch: one thread per (tile, row)
// computes the row of both (projection_kernel's arithmetic) and then, per token,
// gate = act(gate) * up as silu_mul_kernel / gelu_tanh_mul_kernel do.
template <class P>
__global__ void project_gated_kernel(const typename P::W* wg, const float* bg, const typename P::W* wu, const float* bu,
                                     int64_t out_dim, int64_t in_dim, const float* x, int64_t n, bool gelu_tanh,
                                     float* gate, float* up) {
  constexpr int Lanes = P::kLanes;
  ProjectUnit p;
  if (!project_unit(Lanes, out_dim, n, p)) return;
  const int64_t r = p.unit;
  const int64_t tokens = p.tokens;
  float* g = gate + p.t0 * out_dim;
  float* u = up + p.t0 * out_dim;
  lane_row<Lanes>(p.lane, wg, bg, out_dim, in_dim, x + p.t0 * in_dim, tokens, g, r);
  lane_row<Lanes>(p.lane, wu, bu, out_dim, in_dim, x + p.t0 * in_dim, tokens, u, r);
  if (p.lane != 0) return;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t at = t * out_dim + r;
    g[at] = (gelu_tanh ? kvp::kernels::gelu_tanh(g[at]) : kvp::kernels::silu(g[at])) * u[at];
  }
}

// One thread per (token, head) over the query heads, then the KV heads: the head's RMSNorm
// in place when a weight is given (Gemma 3's q/k norms), its rotary embedding, and for a KV
// head its K and V rows into the token's slot (write_kv_kernel's rounding and scales); slot
// -1 is skipped. The rms_norm, rope and write_kv kernels' arithmetic, in one launch.
template <typename KvT>
__global__ void heads_rope_kv_kernel(float* q, float* k, const float* v, int64_t n, int64_t num_heads,
                                     int64_t num_kv_heads, int64_t head_dim, const float* q_norm, const float* k_norm,
                                     float eps, const int32_t* positions, const float* inv_freq, const int64_t* slots,
                                     KvT* k_pool, KvT* v_pool, const float* k_scale, const float* v_scale) {
  const int64_t i = global_index();
  const int64_t heads = num_heads + num_kv_heads;
  if (i >= n * heads) return;
  const int64_t t = i / heads;
  const int64_t hd = i % heads;
  const bool is_q = hd < num_heads;
  const int64_t kv_head = hd - num_heads;
  float* x = is_q ? q + (t * num_heads + hd) * head_dim : k + (t * num_kv_heads + kv_head) * head_dim;
  const float* norm = is_q ? q_norm : k_norm;
  if (norm != nullptr) kvp::kernels::rms_norm(x, norm, head_dim, eps, x);
  const int64_t half = head_dim / 2;
  float cs[kMaxHeadDim / 2];
  float sn[kMaxHeadDim / 2];
  kvp::kernels::rope_cos_sin(positions[t], inv_freq, half, cs, sn);
  kvp::kernels::apply_rope(x, cs, sn, half);
  if (is_q) return;
  const int64_t slot = slots[t];
  if (slot == kvp::kernels::kSkipSlot) return;
  const int64_t kv_dim = num_kv_heads * head_dim;
  const int64_t at = slot * kv_dim + kv_head * head_dim;  // kv_pool_offset(slot, kv_head, ...)
  const float* vh = v + (t * num_kv_heads + kv_head) * head_dim;
  for (int64_t d = 0; d < head_dim; ++d) {
    if (k_scale == nullptr) {
      kvp::kernels::kv_store(k_pool + at + d, x[d]);
      kvp::kernels::kv_store(v_pool + at + d, vh[d]);
    } else {
      kvp::kernels::kv_store(k_pool + at + d, x[d] / k_scale[kv_head]);
      kvp::kernels::kv_store(v_pool + at + d, vh[d] / v_scale[kv_head]);
    }
  }
}

// One thread per row r of the residual stream: the sublayer's output d_y row normalised in
// place (Gemma's post-norms, when post_norm is given), added into x (add_kernel's add), and
// x's new row normalised into h for the next sublayer (when next_norm is given): the
// rms_norm and add kernels' arithmetic in one launch.
__global__ void add_norm_kernel(float* y, const float* post_norm, float* x, const float* next_norm, int64_t n,
                                int64_t hidden, float eps, float* h) {
  const int64_t r = global_index();
  if (r >= n) return;
  float* yr = y + r * hidden;
  float* xr = x + r * hidden;
  if (post_norm != nullptr) kvp::kernels::rms_norm(yr, post_norm, hidden, eps, yr);
  for (int64_t c = 0; c < hidden; ++c) xr[c] += yr[c];
  if (next_norm != nullptr) kvp::kernels::rms_norm(xr, next_norm, hidden, eps, h + r * hidden);
}

// One thread per (token, head); cos/sin as the CPU backend computes them.
__global__ void rope_kernel(float* x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* positions,
                            const float* inv_freq) {
  const int64_t i = global_index();
  if (i >= n * heads) return;
  const int64_t t = i / heads;
  const int64_t half = head_dim / 2;
  float cs[kMaxHeadDim / 2];
  float sn[kMaxHeadDim / 2];
  kvp::kernels::rope_cos_sin(positions[t], inv_freq, half, cs, sn);
  kvp::kernels::apply_rope(x + i * head_dim, cs, sn, half);
}

template <typename KvT>
__global__ void write_kv_kernel(const float* k, const float* v, const int64_t* slots, int64_t n, int64_t kv_dim,
                                KvT* k_pool, KvT* v_pool, int64_t head_dim, const float* k_scale,
                                const float* v_scale) {
  const int64_t i = global_index();
  if (i >= n * kv_dim) return;
  const int64_t t = i / kv_dim;
  const int64_t c = i % kv_dim;
  const int64_t slot = slots[t];
  if (slot == kvp::kernels::kSkipSlot) return;
  // kv_pool_offset(slot, 0, ...) + c: the token's row, KV head major.
  const int64_t at = slot * kv_dim + c;
  if (k_scale == nullptr) {
    kvp::kernels::kv_store(k_pool + at, k[i]);
    kvp::kernels::kv_store(v_pool + at, v[i]);
  } else {
    kvp::kernels::kv_store(k_pool + at, k[i] / k_scale[c / head_dim]);
    kvp::kernels::kv_store(v_pool + at, v[i] / v_scale[c / head_dim]);
  }
}

// Element d of one (token, query head)'s output: its partitions' states ws[p] = (accumulator
// [head_dim], max, sum), p in [first_part, parts), merged in partition order as
// paged_attention_head does, then divided by the sum. Loads bypass L1: under the one-launch
// merge other blocks of the launch wrote them.
__device__ __forceinline__ float merge_partitions(const float* ws, int64_t d, int64_t head_dim, int64_t first_part,
                                                  int64_t parts) {
  const int64_t stride = head_dim + 2;
  float o = __ldcg(ws + first_part * stride + d);
  float running_max = __ldcg(ws + first_part * stride + head_dim);
  float running_sum = __ldcg(ws + first_part * stride + head_dim + 1);
  for (int64_t p = first_part + 1; p < parts; ++p) {
    const float* w = ws + p * stride;
    const float part_max = __ldcg(w + head_dim);
    const float new_max = part_max > running_max ? part_max : running_max;
    const float a = std::exp(running_max - new_max);
    const float b = std::exp(part_max - new_max);
    running_sum = running_sum * a + __ldcg(w + head_dim + 1) * b;
    o = o * a + __ldcg(w + d) * b;
    running_max = new_max;
  }
  const float inv_sum = 1.0f / running_sum;
  return o * inv_sum;
}

// Attention, kernel 1: one thread block per (token, KV head, partition), blockIdx.x = token *
// num_kv_heads + KV head, blockIdx.y = partition. For each tile of kAttentionTile positions:
//   1. the block loads the tile's K and V rows (converted to fp32) into shared memory once,
//      for all `group` query heads that read this KV head (GQA);
//   2. a thread per (query head, position) computes the score dot(q, k) * scale;
//   3. a thread per query head runs paged_attention_head's online-softmax recurrence over the
//      tile in position order (max, rescale, p, sum): the same operations on the same values;
//   4. a thread per (query head, dimension) applies each position's rescale and p * v to its
//      accumulator element, in position order.
// The partition's state (accumulator, max, sum) goes to the workspace for kernel 2.
// Shared memory: K and V tiles [kAttentionTile][head_dim], p and rescale [group][kAttentionTile].
template <typename KvT>
__global__ void attention_partition_kernel(const float* q, const KvT* k_pool, const KvT* v_pool,
                                           const int32_t* block_tables, int64_t max_blocks_per_seq,
                                           const int32_t* seq_of_token, const int32_t* positions, int64_t num_heads,
                                           int64_t num_kv_heads, int64_t head_dim, int64_t block_size, float scale,
                                           int64_t partition, int64_t max_partitions, float* workspace,
                                           const float* k_scale, const float* v_scale, bool bf16_accumulator,
                                           int64_t window, float softcap, int32_t* merge_counters, float* out) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) / num_kv_heads;
  const int64_t kv_head = static_cast<int64_t>(blockIdx.x) % num_kv_heads;
  const int64_t part = static_cast<int64_t>(blockIdx.y);
  const int64_t position = positions[t];
  const int64_t part_begin = part * partition;
  if (part_begin > position) return;  // the whole block: this token has fewer partitions
  // A sliding window's first position: partitions wholly before it are not read (nor merged),
  // the one holding it starts there (paged_attention_kv_heads).
  const int64_t first = kvp::kernels::window_first(position, window);
  if (part_begin + partition <= first) return;
  const int64_t begin = part_begin > first ? part_begin : first;
  const int64_t end = position + 1 - part_begin < partition ? position + 1 : part_begin + partition;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t tid = threadIdx.x;
  const int64_t threads = blockDim.x;
  const int32_t* table = block_tables + static_cast<int64_t>(seq_of_token[t]) * max_blocks_per_seq;
  const float* q_group = q + (t * num_heads + kv_head * group) * head_dim;

  KVP_DYNAMIC_SHARED(float, shared);
  float* k_tile = shared;                              // [kAttentionTile][head_dim]
  float* v_tile = k_tile + kAttentionTile * head_dim;  // [kAttentionTile][head_dim]
  float* p_tile = v_tile + kAttentionTile * head_dim;  // [group][kAttentionTile]: score, then p
  float* rescale = p_tile + group * kAttentionTile;    // [group][kAttentionTile]

  // Thread `tid` owns accumulator elements e = tid + i * threads of [group][head_dim].
  const int64_t elements = group * head_dim;
  float acc[kAttentionAccPerThread];
  KVP_UNROLL
  for (int i = 0; i < kAttentionAccPerThread; ++i) acc[i] = 0.0f;
  // The recurrence's state of head `tid` (threads tid < group).
  float part_max = 0.0f;
  float part_sum = 0.0f;
  // The KV head's dequantisation scales (x * 1 == x: no scale changes no bit).
  const float ks = k_scale == nullptr ? 1.0f : k_scale[kv_head];
  const float vs = v_scale == nullptr ? 1.0f : v_scale[kv_head];

  for (int64_t tile = begin; tile < end; tile += kAttentionTile) {
    const int64_t count = end - tile < kAttentionTile ? end - tile : kAttentionTile;
    for (int64_t e = tid; e < count * head_dim; e += threads) {
      const int64_t j = e / head_dim;
      const int64_t d = e % head_dim;
      const int64_t slot = kvp::kernels::slot_of(table, tile + j, block_size);
      const int64_t at = kvp::kernels::kv_pool_offset(slot, kv_head, num_kv_heads, head_dim) + d;
      k_tile[e] = kvp::kernels::kv_to_float(k_pool[at]) * ks;
      v_tile[e] = kvp::kernels::kv_to_float(v_pool[at]) * vs;
    }
    __syncthreads();
    for (int64_t e = tid; e < group * count; e += threads) {
      const int64_t h = e / count;
      const int64_t j = e % count;
      const float score = kvp::kernels::dot(q_group + h * head_dim, k_tile + j * head_dim, head_dim) * scale;
      p_tile[h * kAttentionTile + j] = softcap > 0.0f ? kvp::kernels::soft_cap(score, softcap) : score;
    }
    __syncthreads();
    if (tid < group) {
      for (int64_t j = 0; j < count; ++j) {
        float* score_then_p = &p_tile[tid * kAttentionTile + j];
        *score_then_p = kvp::kernels::online_softmax_step(*score_then_p, tile + j == begin, part_max, part_sum,
                                                          rescale[tid * kAttentionTile + j]);
        if (bf16_accumulator) part_sum = kvp::bf16_to_float(kvp::float_to_bf16(part_sum));  // planted
      }
    }
    __syncthreads();
    KVP_UNROLL
    for (int i = 0; i < kAttentionAccPerThread; ++i) {
      const int64_t e = tid + i * threads;
      if (e < elements) {
        const int64_t h = e / head_dim;
        const int64_t d = e % head_dim;
        for (int64_t j = 0; j < count; ++j) {
          const float r = rescale[h * kAttentionTile + j];
          if (r != 1.0f) acc[i] *= r;  // x * 1 == x: skipping it changes no bit
          acc[i] += p_tile[h * kAttentionTile + j] * v_tile[j * head_dim + d];
          if (bf16_accumulator) acc[i] = kvp::bf16_to_float(kvp::float_to_bf16(acc[i]));  // planted
        }
      }
    }
    __syncthreads();  // before the next tile overwrites the shared arrays
  }
  const int64_t stride = head_dim + 2;
  float* ws = workspace + ((t * num_heads + kv_head * group) * max_partitions + part) * stride;
  KVP_UNROLL
  for (int i = 0; i < kAttentionAccPerThread; ++i) {
    const int64_t e = tid + i * threads;
    if (e < elements) ws[(e / head_dim) * max_partitions * stride + e % head_dim] = acc[i];
  }
  if (tid < group) {
    ws[tid * max_partitions * stride + head_dim] = part_max;
    ws[tid * max_partitions * stride + head_dim + 1] = part_sum;
  }
  if (merge_counters == nullptr) return;  // kernel 2 merges
  // One launch: the last of the token's partitions to finish (for this KV head) merges them,
  // in partition order, with kernel 2's arithmetic. Every thread's workspace writes are
  // fenced before thread 0 takes a ticket; the block whose ticket is the last one leaves
  // the counter at zero for the next launch and reads the other blocks' states past L1.
  __threadfence();
  __syncthreads();
  const int64_t parts = position / partition + 1;
  const int64_t first_part = first / partition;
  if (tid == 0) {
    const int32_t ticket = atomicAdd(merge_counters + blockIdx.x, 1);
    const bool last = ticket == static_cast<int32_t>(parts - first_part - 1);
    if (last) merge_counters[blockIdx.x] = 0;
    rescale[0] = last ? 1.0f : 0.0f;
  }
  __syncthreads();
  if (rescale[0] == 0.0f) return;
  __threadfence();
  for (int64_t e = tid; e < elements; e += threads) {
    const int64_t token_head = t * num_heads + kv_head * group + e / head_dim;
    const int64_t d = e % head_dim;
    out[token_head * head_dim + d] =
        merge_partitions(workspace + token_head * max_partitions * stride, d, head_dim, first_part, parts);
  }
}

// Attention, kernel 2: one thread per (token, query head, dimension) merges the token's
// partitions in order, from the one holding the window's first position, as
// paged_attention_head does, and divides by the sum.
__global__ void attention_merge_kernel(const float* workspace, const int32_t* positions, int64_t n, int64_t num_heads,
                                       int64_t head_dim, int64_t partition, int64_t max_partitions, int64_t window,
                                       float* out) {
  const int64_t i = global_index();
  if (i >= n * num_heads * head_dim) return;
  const int64_t d = i % head_dim;
  const int64_t token_head = i / head_dim;
  const int64_t position = positions[token_head / num_heads];
  const int64_t parts = position / partition + 1;
  const int64_t first_part = kvp::kernels::window_first(position, window) / partition;
  out[i] = merge_partitions(workspace + token_head * max_partitions * (head_dim + 2), d, head_dim, first_part, parts);
}

__global__ void silu_mul_kernel(float* gate, const float* up, int64_t n) {
  const int64_t i = global_index();
  if (i < n) gate[i] = kvp::kernels::silu(gate[i]) * up[i];
}

__global__ void gelu_tanh_mul_kernel(float* gate, const float* up, int64_t n) {
  const int64_t i = global_index();
  if (i < n) gate[i] = kvp::kernels::gelu_tanh(gate[i]) * up[i];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = global_index();
  if (i < n) x[i] += y[i];
}

// The stream every launch above goes on: the legacy stream 0, except on a thread between
// begin_capture and end_capture (a CUDA graph of the engine's decode step).
thread_local cudaStream_t g_stream = nullptr;

// The projections' lanes per row (see lane_row): 16 on a GPU, 1 emulated (the host's GEMM
// per row is the emulator's fast path); set_project_lanes switches either.
#if defined(__CUDACC__)
int g_project_lanes = kRowLanes;
#else
int g_project_lanes = 1;
#endif

}  // namespace

bool set_project_lanes(int lanes) {
  if (lanes != 1 && lanes != kRowLanes) return false;
  g_project_lanes = lanes;
  return true;
}
int project_lanes() { return g_project_lanes; }

// Non-blocking: the legacy stream, which every other launch and copy uses (this backend's
// eager steps, other backends' on other threads), does not synchronise with it, so their work
// does not conflict with a capture on it (cudaErrorStreamCaptureImplicit); graph_replay orders
// the two explicitly.
std::string stream_create(void** stream) {
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = s;
  return e == cudaSuccess ? std::string() : fail("cudaStreamCreateWithFlags", e);
}
void stream_destroy(void* stream) {
  if (stream != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}
// Thread-local mode: only this thread is barred from synchronising calls while it captures.
// (Global mode bars every thread: with several backends in one process, as verify runs its
// runs side by side, one's upload would invalidate another's capture, as found emulated.)
std::string begin_capture(void* stream) {
  const cudaError_t e = cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return fail("cudaStreamBeginCapture", e);
  g_stream = static_cast<cudaStream_t>(stream);
  return {};
}
std::string end_capture(void* stream, void** graph_exec) {
  g_stream = nullptr;
  *graph_exec = nullptr;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
  if (e != cudaSuccess) return fail("cudaStreamEndCapture", e);
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (e != cudaSuccess) return fail("cudaGraphInstantiate", e);
  *graph_exec = exec;
  return {};
}
std::string graph_replay(void* graph_exec, void* stream) {
  // The step's uploads and block operations ran on the legacy stream (a pageable upload may
  // return before its DMA lands): wait for them, as nothing orders a non-blocking stream after.
  cudaError_t e = cudaStreamSynchronize(nullptr);
  if (e != cudaSuccess) return fail("cudaStreamSynchronize of the legacy stream before cudaGraphLaunch", e);
  e = cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec), static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) return fail("cudaGraphLaunch", e);
  e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? std::string() : fail("cudaStreamSynchronize after cudaGraphLaunch", e);
}
void graph_destroy(void* graph_exec) {
  if (graph_exec != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec));
}

std::string check_device() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return {};
  std::string why =
      e == cudaSuccess ? std::string("0 devices") : cudaGetErrorName(e) + (": " + kvp::simt::error_message(e));
  // What the static runtime reports when it finds no libcuda.so.1 at all.
  if (e == cudaErrorInsufficientDriver) why += " (no NVIDIA driver loaded, or one older than this CUDA runtime)";
  return "no CUDA device: cudaGetDeviceCount: " + why;
}

std::string device_alloc(void** d_ptr, std::size_t bytes) {
  const cudaError_t e = cudaMalloc(d_ptr, bytes == 0 ? 1 : bytes);
  return e == cudaSuccess ? std::string() : fail("cudaMalloc", e);
}
void device_free(void* d_ptr) { (void)cudaFree(d_ptr); }
std::string pinned_alloc(void** h_ptr, std::size_t bytes) {
  const cudaError_t e = cudaMallocHost(h_ptr, bytes == 0 ? 1 : bytes);
  return e == cudaSuccess ? std::string() : fail("cudaMallocHost", e);
}
void pinned_free(void* h_ptr) { (void)cudaFreeHost(h_ptr); }

std::string copy_to_device(void* d_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return {};
  const cudaError_t e = cudaMemcpy(d_dst, src, bytes, cudaMemcpyHostToDevice);
  return e == cudaSuccess ? std::string() : fail("cudaMemcpy host to device", e);
}
std::string copy_to_host(void* dst, const void* d_src, std::size_t bytes) {
  if (bytes == 0) return {};
  const cudaError_t e = cudaMemcpy(dst, d_src, bytes, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? std::string() : fail("cudaMemcpy device to host", e);
}
std::string copy_device_to_device(void* d_dst, const void* d_src, std::size_t bytes) {
  if (bytes == 0) return {};
  const cudaError_t e = cudaMemcpy(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice);
  return e == cudaSuccess ? std::string() : fail("cudaMemcpy device to device", e);
}
std::string synchronize() {
  const cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? std::string() : fail("cudaDeviceSynchronize", e);
}

bool kv_dtype_supported(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF8E4M3 ||
         dtype == DType::kF8E5M2;
}

namespace {
std::string unsupported(const char* what, DType dtype) {
  return std::string(what) + ": KV dtype " + std::string(dtype_name(dtype)) +
         " is not one of F32, F16, BF16, F8_E4M3, F8_E5M2";
}
template <typename KvT>
std::string fill_kv_nan_typed(KvT* d_x, int64_t n) {
  KVP_LAUNCH(fill_kv_nan_kernel<KvT>, grid_for((n + kFillPerThread - 1) / kFillPerThread), dim3(kThreads), 0, g_stream)
  (d_x, n);
  return launched("fill_kv_nan_kernel");
}
}  // namespace

std::string fill_kv_nan(void* d_x, int64_t n, DType dtype) {
  if (n <= 0) return {};
  switch (dtype) {
    case DType::kF32: return fill_kv_nan_typed(static_cast<float*>(d_x), n);
    case DType::kF16: return fill_kv_nan_typed(static_cast<kvp::kernels::F16Bits*>(d_x), n);
    case DType::kBF16: return fill_kv_nan_typed(static_cast<kvp::kernels::BF16Bits*>(d_x), n);
    case DType::kF8E4M3: return fill_kv_nan_typed(static_cast<kvp::kernels::F8E4M3Bits*>(d_x), n);
    case DType::kF8E5M2: return fill_kv_nan_typed(static_cast<kvp::kernels::F8E5M2Bits*>(d_x), n);
    default: return unsupported("fill_kv_nan", dtype);
  }
}

namespace {
template <typename W>
std::string embed_typed(const void* d_table, const int32_t* d_ids, int64_t n, int64_t hidden, float* d_x, float scale) {
  KVP_LAUNCH(embed_kernel<W>, grid_for(n * hidden), dim3(kThreads), 0, g_stream)
  (static_cast<const W*>(d_table), d_ids, n, hidden, scale, d_x);
  return launched("embed_kernel");
}

// Calls f(tag) with tag a null `const W*` for the weights' element type.
template <typename F>
std::string with_weight_type(bool bf16, F&& f) {
  return bf16 ? f(static_cast<const kvp::kernels::BF16Bits*>(nullptr)) : f(static_cast<const float*>(nullptr));
}
// Calls f(cfg) with cfg a null ProjectCfg<W, lanes>* for the weights' type and the lanes.
template <typename F>
std::string with_project_cfg(bool bf16, F&& f) {
  return with_weight_type(bf16, [&](auto* wtag) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(wtag)>>;
    return g_project_lanes == 1 ? f(static_cast<ProjectCfg<W, 1>*>(nullptr))
                                : f(static_cast<ProjectCfg<W, kRowLanes>*>(nullptr));
  });
}
}  // namespace

std::string embed(Weights d_table, const int32_t* d_ids, int64_t n, int64_t hidden, float* d_x, float scale) {
  if (n <= 0) return {};
  return with_weight_type(d_table.bf16, [&](auto* wtag) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(wtag)>>;
    return embed_typed<W>(d_table.data, d_ids, n, hidden, d_x, scale);
  });
}

std::string rms_norm(const float* d_x, const int32_t* d_rows, const float* d_weight, int64_t n, int64_t hidden,
                     float eps, float* d_out) {
  if (n <= 0) return {};
  KVP_LAUNCH(rms_norm_kernel, grid_for(n), dim3(kThreads), 0, g_stream)(d_x, d_rows, d_weight, n, hidden, eps, d_out);
  return launched("rms_norm_kernel");
}

namespace {
template <class P>
std::string project_typed(const void* d_w, const float* d_bias, int64_t out_dim, int64_t in_dim, const float* d_x,
                          int64_t n, float* d_y) {
  KVP_LAUNCH(project_kernel<P>, project_grid(out_dim, n, P::kLanes), dim3(kThreads), 0, g_stream)
  (static_cast<const typename P::W*>(d_w), d_bias, out_dim, in_dim, d_x, n, d_y);
  return launched("project_kernel");
}
}  // namespace

std::string project(Weights d_w, const float* d_bias, int64_t out_dim, int64_t in_dim, const float* d_x, int64_t n,
                    float* d_y) {
  if (n <= 0) return {};
  return with_project_cfg(d_w.bf16, [&](auto* cfg) {
    using P = std::remove_pointer_t<decltype(cfg)>;
    return project_typed<P>(d_w.data, d_bias, out_dim, in_dim, d_x, n, d_y);
  });
}

std::string rope(float* d_x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* d_positions,
                 const float* d_inv_freq) {
  if (n <= 0) return {};
  if (head_dim > kMaxHeadDim) return "rope: head_dim " + std::to_string(head_dim) + " > " + std::to_string(kMaxHeadDim);
  KVP_LAUNCH(rope_kernel, grid_for(n * heads), dim3(kThreads), 0, g_stream)
  (d_x, n, heads, head_dim, d_positions, d_inv_freq);
  return launched("rope_kernel");
}

namespace {
template <typename KvT>
std::string write_kv_typed(const float* d_k, const float* d_v, const int64_t* d_slots, int64_t n, int64_t kv_dim,
                           void* d_k_pool, void* d_v_pool, int64_t head_dim, const float* d_k_scale,
                           const float* d_v_scale) {
  KVP_LAUNCH(write_kv_kernel<KvT>, grid_for(n * kv_dim), dim3(kThreads), 0, g_stream)
  (d_k, d_v, d_slots, n, kv_dim, static_cast<KvT*>(d_k_pool), static_cast<KvT*>(d_v_pool), head_dim, d_k_scale,
   d_v_scale);
  return launched("write_kv_kernel");
}

template <typename KvT>
std::string attention_typed(const float* d_q, const void* d_k_pool, const void* d_v_pool, const int32_t* d_block_tables,
                            int64_t max_blocks_per_seq, const int32_t* d_seq_of_token, const int32_t* d_positions,
                            int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                            float scale, int64_t partition, int64_t max_partitions, float* d_workspace,
                            const float* d_k_scale, const float* d_v_scale, bool bf16_accumulator, int64_t window,
                            float softcap, int32_t* d_merge_counters, float* d_out) {
  const dim3 grid(static_cast<unsigned>(n * num_kv_heads), static_cast<unsigned>(max_partitions));
  const int64_t group = num_heads / num_kv_heads;
  KVP_LAUNCH(attention_partition_kernel<KvT>, grid, dim3(static_cast<unsigned>(attention_threads(group, head_dim))),
             attention_shared_bytes(group, head_dim), g_stream)
  (d_q, static_cast<const KvT*>(d_k_pool), static_cast<const KvT*>(d_v_pool), d_block_tables, max_blocks_per_seq,
   d_seq_of_token, d_positions, num_heads, num_kv_heads, head_dim, block_size, scale, partition, max_partitions,
   d_workspace, d_k_scale, d_v_scale, bf16_accumulator, window, softcap, d_merge_counters, d_out);
  return launched("attention_partition_kernel");
}
}  // namespace

std::string write_kv(const float* d_k, const float* d_v, const int64_t* d_slots, int64_t n, int64_t kv_dim,
                     DType kv_dtype, void* d_k_pool, void* d_v_pool, int64_t head_dim, const float* d_k_scale,
                     const float* d_v_scale) {
  if (n <= 0) return {};
  if ((d_k_scale == nullptr) != (d_v_scale == nullptr)) return "write_kv: K and V scales must be given together";
  if (d_k_scale != nullptr && (head_dim <= 0 || kv_dim % head_dim != 0))
    return "write_kv: head_dim " + std::to_string(head_dim) + " does not divide kv_dim " + std::to_string(kv_dim);
  const auto args = [&](auto* tag) {
    using KvT = std::remove_pointer_t<decltype(tag)>;
    return write_kv_typed<KvT>(d_k, d_v, d_slots, n, kv_dim, d_k_pool, d_v_pool, head_dim, d_k_scale, d_v_scale);
  };
  switch (kv_dtype) {
    case DType::kF32: return args(static_cast<float*>(nullptr));
    case DType::kF16: return args(static_cast<kvp::kernels::F16Bits*>(nullptr));
    case DType::kBF16: return args(static_cast<kvp::kernels::BF16Bits*>(nullptr));
    case DType::kF8E4M3: return args(static_cast<kvp::kernels::F8E4M3Bits*>(nullptr));
    case DType::kF8E5M2: return args(static_cast<kvp::kernels::F8E5M2Bits*>(nullptr));
    default: return unsupported("write_kv", kv_dtype);
  }
}

int64_t attention_partitions(int64_t max_position, int64_t partition) { return max_position / partition + 1; }

int64_t attention_workspace_floats(int64_t n, int64_t num_heads, int64_t head_dim, int64_t max_partitions) {
  return n * num_heads * max_partitions * (head_dim + 2);
}

std::string check_attention_shape(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  if (head_dim <= 0 || head_dim > kMaxHeadDim)
    return "attention: head_dim " + std::to_string(head_dim) + " is not in [1, " + std::to_string(kMaxHeadDim) + "]";
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0)
    return "attention: " + std::to_string(num_heads) + " query heads are not a multiple of " +
           std::to_string(num_kv_heads) + " KV heads";
  const int64_t group = num_heads / num_kv_heads;
  if (attention_threads(group, head_dim) > kAttentionMaxThreads)
    return "attention: a KV head's group of " + std::to_string(group) + " query heads of dimension " +
           std::to_string(head_dim) + " needs " + std::to_string(attention_threads(group, head_dim)) +
           " threads per block, over the kernel's " + std::to_string(kAttentionMaxThreads) +
           " (one per query head, and one per " + std::to_string(kAttentionAccPerThread) +
           " of the group's accumulator elements)";
  if (static_cast<int64_t>(attention_shared_bytes(group, head_dim)) > kAttentionMaxShared)
    return "attention: " + std::to_string(attention_shared_bytes(group, head_dim)) +
           " bytes of shared memory per block is over " + std::to_string(kAttentionMaxShared);
  return {};
}

std::string attention(const float* d_q, DType kv_dtype, const void* d_k_pool, const void* d_v_pool,
                      const int32_t* d_block_tables, int64_t max_blocks_per_seq, const int32_t* d_seq_of_token,
                      const int32_t* d_positions, int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                      int64_t block_size, float scale, int64_t partition, int64_t max_partitions, float* d_workspace,
                      float* d_out, const float* d_k_scale, const float* d_v_scale, AttentionVariant variant,
                      int64_t window, float softcap, int32_t* d_merge_counters) {
  if (n <= 0) return {};
  if (window < 0) return "attention: window " + std::to_string(window) + " is negative";
  if (!(softcap >= 0.0f)) return "attention: softcap " + std::to_string(softcap) + " is not >= 0";
  if (std::string shape = check_attention_shape(num_heads, num_kv_heads, head_dim); !shape.empty()) return shape;
  if (partition <= 0 || max_partitions <= 0 || max_partitions > 65535)
    return "attention: " + std::to_string(max_partitions) + " partitions of " + std::to_string(partition) +
           " positions is outside the grid's [1, 65535]";
  if (n * num_kv_heads > 0x7fffffff) return "attention: " + std::to_string(n * num_kv_heads) + " blocks is too many";
  if ((d_k_scale == nullptr) != (d_v_scale == nullptr)) return "attention: K and V scales must be given together";
  if (variant == AttentionVariant::kDropKvScales) d_k_scale = d_v_scale = nullptr;  // planted
  const bool bf16_accumulator = variant == AttentionVariant::kBf16Accumulator;
  const auto launch = [&](auto* tag) {
    using KvT = std::remove_pointer_t<decltype(tag)>;
    return attention_typed<KvT>(d_q, d_k_pool, d_v_pool, d_block_tables, max_blocks_per_seq, d_seq_of_token,
                                d_positions, n, num_heads, num_kv_heads, head_dim, block_size, scale, partition,
                                max_partitions, d_workspace, d_k_scale, d_v_scale, bf16_accumulator, window, softcap,
                                d_merge_counters, d_out);
  };
  std::string launched_error;
  switch (kv_dtype) {
    case DType::kF32: launched_error = launch(static_cast<float*>(nullptr)); break;
    case DType::kF16: launched_error = launch(static_cast<kvp::kernels::F16Bits*>(nullptr)); break;
    case DType::kBF16: launched_error = launch(static_cast<kvp::kernels::BF16Bits*>(nullptr)); break;
    case DType::kF8E4M3: launched_error = launch(static_cast<kvp::kernels::F8E4M3Bits*>(nullptr)); break;
    case DType::kF8E5M2: launched_error = launch(static_cast<kvp::kernels::F8E5M2Bits*>(nullptr)); break;
    default: return unsupported("attention", kv_dtype);
  }
  if (!launched_error.empty() || d_merge_counters != nullptr) return launched_error;
  KVP_LAUNCH(attention_merge_kernel, grid_for(n * num_heads * head_dim), dim3(kThreads), 0, g_stream)
  (d_workspace, d_positions, n, num_heads, head_dim, partition, max_partitions, window, d_out);
  return launched("attention_merge_kernel");
}

namespace {
template <class P>
std::string project_qkv_typed(const void* d_wq, const float* d_bq, const void* d_wk, const float* d_bk,
                              const void* d_wv, const float* d_bv, int64_t q_dim, int64_t kv_dim, int64_t in_dim,
                              const float* d_x, int64_t n, float* d_q, float* d_k, float* d_v) {
  using W = typename P::W;
  KVP_LAUNCH(project_qkv_kernel<P>, project_grid(q_dim + 2 * kv_dim, n, P::kLanes), dim3(kThreads), 0, g_stream)
  (static_cast<const W*>(d_wq), d_bq, static_cast<const W*>(d_wk), d_bk, static_cast<const W*>(d_wv), d_bv, q_dim,
   kv_dim, in_dim, d_x, n, d_q, d_k, d_v);
  return launched("project_qkv_kernel");
}

template <class P>
std::string project_gated_typed(const void* d_wg, const float* d_bg, const void* d_wu, const float* d_bu,
                                int64_t out_dim, int64_t in_dim, const float* d_x, int64_t n, bool gelu_tanh,
                                float* d_gate, float* d_up) {
  using W = typename P::W;
  KVP_LAUNCH(project_gated_kernel<P>, project_grid(out_dim, n, P::kLanes), dim3(kThreads), 0, g_stream)
  (static_cast<const W*>(d_wg), d_bg, static_cast<const W*>(d_wu), d_bu, out_dim, in_dim, d_x, n, gelu_tanh, d_gate,
   d_up);
  return launched("project_gated_kernel");
}

// "" when the weights of one fused call share a dtype.
std::string same_weight_type(const char* call, std::initializer_list<Weights> ws) {
  for (const Weights& w : ws)
    if (w.bf16 != ws.begin()->bf16) return std::string(call) + ": weights of different dtypes (fp32 and bf16)";
  return {};
}
}  // namespace

std::string project_qkv(Weights d_wq, const float* d_bq, Weights d_wk, const float* d_bk, Weights d_wv,
                        const float* d_bv, int64_t q_dim, int64_t kv_dim, int64_t in_dim, const float* d_x, int64_t n,
                        float* d_q, float* d_k, float* d_v) {
  if (n <= 0) return {};
  if (std::string e = same_weight_type("project_qkv", {d_wq, d_wk, d_wv}); !e.empty()) return e;
  return with_project_cfg(d_wq.bf16, [&](auto* cfg) {
    using P = std::remove_pointer_t<decltype(cfg)>;
    return project_qkv_typed<P>(d_wq.data, d_bq, d_wk.data, d_bk, d_wv.data, d_bv, q_dim, kv_dim, in_dim, d_x, n, d_q,
                                d_k, d_v);
  });
}

std::string project_gated(Weights d_wg, const float* d_bg, Weights d_wu, const float* d_bu, int64_t out_dim,
                          int64_t in_dim, const float* d_x, int64_t n, bool gelu_tanh, float* d_gate, float* d_up) {
  if (n <= 0) return {};
  if (std::string e = same_weight_type("project_gated", {d_wg, d_wu}); !e.empty()) return e;
  return with_project_cfg(d_wg.bf16, [&](auto* cfg) {
    using P = std::remove_pointer_t<decltype(cfg)>;
    return project_gated_typed<P>(d_wg.data, d_bg, d_wu.data, d_bu, out_dim, in_dim, d_x, n, gelu_tanh, d_gate, d_up);
  });
}

namespace {
template <typename KvT>
std::string heads_rope_kv_typed(float* d_q, float* d_k, const float* d_v, int64_t n, int64_t num_heads,
                                int64_t num_kv_heads, int64_t head_dim, const float* d_q_norm, const float* d_k_norm,
                                float eps, const int32_t* d_positions, const float* d_inv_freq, const int64_t* d_slots,
                                void* d_k_pool, void* d_v_pool, const float* d_k_scale, const float* d_v_scale) {
  KVP_LAUNCH(heads_rope_kv_kernel<KvT>, grid_for(n * (num_heads + num_kv_heads)), dim3(kThreads), 0, g_stream)
  (d_q, d_k, d_v, n, num_heads, num_kv_heads, head_dim, d_q_norm, d_k_norm, eps, d_positions, d_inv_freq, d_slots,
   static_cast<KvT*>(d_k_pool), static_cast<KvT*>(d_v_pool), d_k_scale, d_v_scale);
  return launched("heads_rope_kv_kernel");
}
}  // namespace

std::string heads_rope_kv(float* d_q, float* d_k, const float* d_v, int64_t n, int64_t num_heads, int64_t num_kv_heads,
                          int64_t head_dim, const float* d_q_norm, const float* d_k_norm, float eps,
                          const int32_t* d_positions, const float* d_inv_freq, const int64_t* d_slots, DType kv_dtype,
                          void* d_k_pool, void* d_v_pool, const float* d_k_scale, const float* d_v_scale) {
  if (n <= 0) return {};
  if (head_dim > kMaxHeadDim)
    return "heads_rope_kv: head_dim " + std::to_string(head_dim) + " > " + std::to_string(kMaxHeadDim);
  if ((d_k_scale == nullptr) != (d_v_scale == nullptr)) return "heads_rope_kv: K and V scales must be given together";
  if ((d_q_norm == nullptr) != (d_k_norm == nullptr)) return "heads_rope_kv: q and k norms must be given together";
  const auto args = [&](auto* tag) {
    using KvT = std::remove_pointer_t<decltype(tag)>;
    return heads_rope_kv_typed<KvT>(d_q, d_k, d_v, n, num_heads, num_kv_heads, head_dim, d_q_norm, d_k_norm, eps,
                                    d_positions, d_inv_freq, d_slots, d_k_pool, d_v_pool, d_k_scale, d_v_scale);
  };
  switch (kv_dtype) {
    case DType::kF32: return args(static_cast<float*>(nullptr));
    case DType::kF16: return args(static_cast<kvp::kernels::F16Bits*>(nullptr));
    case DType::kBF16: return args(static_cast<kvp::kernels::BF16Bits*>(nullptr));
    case DType::kF8E4M3: return args(static_cast<kvp::kernels::F8E4M3Bits*>(nullptr));
    case DType::kF8E5M2: return args(static_cast<kvp::kernels::F8E5M2Bits*>(nullptr));
    default: return unsupported("heads_rope_kv", kv_dtype);
  }
}

namespace {
template <class P>
std::string project_qkv_rope_kv_typed(const void* d_wq, const float* d_bq, const void* d_wk, const float* d_bk,
                                      const void* d_wv, const float* d_bv, int64_t num_heads, int64_t num_kv_heads,
                                      int64_t head_dim, int64_t in_dim, const float* d_x, int64_t n,
                                      const int32_t* d_positions, const float* d_inv_freq, const int64_t* d_slots,
                                      float* d_q, float* d_k, float* d_v, void* d_k_pool, void* d_v_pool,
                                      const float* d_k_scale, const float* d_v_scale) {
  const int64_t units = num_heads * (head_dim / 2) + num_kv_heads * (head_dim / 2) + num_kv_heads * head_dim;
  using W = typename P::W;
  using KvT = typename P::Kv;
  KVP_LAUNCH(project_qkv_rope_kv_kernel<P>, project_grid(units, n, g_project_lanes), dim3(kThreads), 0, g_stream)
  (g_project_lanes, static_cast<const W*>(d_wq), d_bq, static_cast<const W*>(d_wk), d_bk, static_cast<const W*>(d_wv),
   d_bv, num_heads, num_kv_heads, head_dim, in_dim, d_x, n, d_positions, d_inv_freq, d_slots, d_q, d_k, d_v,
   static_cast<KvT*>(d_k_pool), static_cast<KvT*>(d_v_pool), d_k_scale, d_v_scale);
  return launched("project_qkv_rope_kv_kernel");
}
}  // namespace

std::string project_qkv_rope_kv(Weights d_wq, const float* d_bq, Weights d_wk, const float* d_bk, Weights d_wv,
                                const float* d_bv, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                int64_t in_dim, const float* d_x, int64_t n, const int32_t* d_positions,
                                const float* d_inv_freq, const int64_t* d_slots, float* d_q, float* d_k, float* d_v,
                                DType kv_dtype, void* d_k_pool, void* d_v_pool, const float* d_k_scale,
                                const float* d_v_scale) {
  if (n <= 0) return {};
  if (head_dim % 2 != 0) return "project_qkv_rope_kv: head_dim " + std::to_string(head_dim) + " is odd";
  if ((d_k_scale == nullptr) != (d_v_scale == nullptr))
    return "project_qkv_rope_kv: K and V scales must be given together";
  if (std::string e = same_weight_type("project_qkv_rope_kv", {d_wq, d_wk, d_wv}); !e.empty()) return e;
  const auto args = [&](auto* tag) {
    using KvT = std::remove_pointer_t<decltype(tag)>;
    return with_weight_type(d_wq.bf16, [&](auto* wtag) {
      using W = std::remove_const_t<std::remove_pointer_t<decltype(wtag)>>;
      return project_qkv_rope_kv_typed<KvWeightsCfg<KvT, W>>(
          d_wq.data, d_bq, d_wk.data, d_bk, d_wv.data, d_bv, num_heads, num_kv_heads, head_dim, in_dim, d_x, n,
          d_positions, d_inv_freq, d_slots, d_q, d_k, d_v, d_k_pool, d_v_pool, d_k_scale, d_v_scale);
    });
  };
  switch (kv_dtype) {
    case DType::kF32: return args(static_cast<float*>(nullptr));
    case DType::kF16: return args(static_cast<kvp::kernels::F16Bits*>(nullptr));
    case DType::kBF16: return args(static_cast<kvp::kernels::BF16Bits*>(nullptr));
    case DType::kF8E4M3: return args(static_cast<kvp::kernels::F8E4M3Bits*>(nullptr));
    case DType::kF8E5M2: return args(static_cast<kvp::kernels::F8E5M2Bits*>(nullptr));
    default: return unsupported("project_qkv_rope_kv", kv_dtype);
  }
}

std::string add_norm(float* d_y, const float* d_post_norm, float* d_x, const float* d_next_norm, int64_t n,
                     int64_t hidden, float eps, float* d_h) {
  if (n <= 0) return {};
  KVP_LAUNCH(add_norm_kernel, grid_for(n), dim3(kThreads), 0, g_stream)
  (d_y, d_post_norm, d_x, d_next_norm, n, hidden, eps, d_h);
  return launched("add_norm_kernel");
}

std::string silu_mul(float* d_gate, const float* d_up, int64_t n) {
  if (n <= 0) return {};
  KVP_LAUNCH(silu_mul_kernel, grid_for(n), dim3(kThreads), 0, g_stream)(d_gate, d_up, n);
  return launched("silu_mul_kernel");
}

std::string gelu_tanh_mul(float* d_gate, const float* d_up, int64_t n) {
  if (n <= 0) return {};
  KVP_LAUNCH(gelu_tanh_mul_kernel, grid_for(n), dim3(kThreads), 0, g_stream)(d_gate, d_up, n);
  return launched("gelu_tanh_mul_kernel");
}

std::string add_in_place(float* d_x, const float* d_y, int64_t n) {
  if (n <= 0) return {};
  KVP_LAUNCH(add_kernel, grid_for(n), dim3(kThreads), 0, g_stream)(d_x, d_y, n);
  return launched("add_kernel");
}

}  // namespace kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS
