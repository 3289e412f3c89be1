// The CUDA backend's kernels and device-memory calls, as a flat C++17 API over raw pointers,
// so that optimized/backends/cuda_backend.cc (C++20, host compiler) never includes a CUDA
// header. One source (model_kernels.cu) builds both flavours:
//   emulated: host compiler through the SIMT layer (kernels/simt), namespace ...::emu,
//             library kvp_cuda_kernels_emu (always built);
//   device:   nvcc (sm_80, sm_90), namespace ...::dev, library kvp_cuda_kernels_dev (when
//             KVPROOF_HAS_CUDA). A host file compiled against it defines KVP_CUDA_DEVICE_FLAVOUR.
// Both flavours link into one program (kvproof): their namespaces differ, and the SIMT
// layer's runtime names live in inline namespaces of their own (kernels/simt/runtime.h).
//
// Every function returns "" on success, else a message naming the call or kernel and the
// CUDA error. Pointers named d_* are device memory, h_* pinned host memory.
//
// Arithmetic: every output element is reduced in the CPU backend's own fixed order
// (kernels/cpu_attention.h: dot, rms_norm, rope, silu, paged_attention_head), an order that
// depends only on the sizes, never on the number of tokens, the batch or the launch shape
// (N1). Attention is parallel over (token, KV head, partition) with the partitions merged by
// a second kernel in order; each step of paged_attention_head's recurrence is done in the
// same order on the same fp32 values, so the emulated flavour gives its bits.
//
// KV pools hold fp32, fp16, bf16 or fp8 (DType kF32, kF16, kBF16, kF8E4M3, kF8E5M2): elements
// are rounded to the pool's type when written and read back as fp32; all arithmetic is fp32.
// fp8 pools are scaled per KV head: a layer's K scales d_k_scale[num_kv_heads] (V likewise);
// x is stored as fp8(x / scale) and read as float(code) * scale (vLLM's convention). Scales
// are optional for the other types (null: 1, which changes no bit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"

#if defined(__CUDACC__) || defined(KVP_CUDA_DEVICE_FLAVOUR)
#define KVP_CUDA_FLAVOUR_NS dev
#define KVP_CUDA_FLAVOUR_NAME "cuda"
#else
#define KVP_CUDA_FLAVOUR_NS emu
#define KVP_CUDA_FLAVOUR_NAME "cuda-emu"
#endif

namespace kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS {

// Largest head_dim the attention kernel's per-thread accumulator holds.
inline constexpr int64_t kMaxHeadDim = 256;

// A weight matrix (or the embedding table) in device memory: fp32, or bf16 (the engine's
// --weight-dtype bf16: raw bf16 bits, each element widened to fp32 exactly as it is read, so a
// kernel gives the bits of fp32 weights of the same values and reads half the bytes). Implicit
// from a const float*: fp32.
struct Weights {
  const void* data = nullptr;
  bool bf16 = false;
  Weights() = default;
  Weights(std::nullptr_t) {}            // NOLINT: implicit, as a null pointer
  Weights(const float* f) : data(f) {}  // NOLINT: implicit, fp32 weights
  Weights(const void* p, bool is_bf16) : data(p), bf16(is_bf16) {}
};

// "" when a device is present, else "no CUDA device: ..." (the emulated device always is).
std::string check_device();

std::string device_alloc(void** d_ptr, std::size_t bytes);
void device_free(void* d_ptr);
std::string pinned_alloc(void** h_ptr, std::size_t bytes);
void pinned_free(void* h_ptr);
std::string copy_to_device(void* d_dst, const void* src, std::size_t bytes);
std::string copy_to_host(void* dst, const void* d_src, std::size_t bytes);
std::string copy_device_to_device(void* d_dst, const void* d_src, std::size_t bytes);
// Waits for all work; reports an asynchronous kernel fault.
std::string synchronize();

// The KV element types the kernels take: f32, f16, bf16, fp8-e4m3, fp8-e5m2.
bool kv_dtype_supported(DType dtype);
// Elements d_x[0, n) of a KV pool of `dtype` = that type's quiet NaN (poison fill).
std::string fill_kv_nan(void* d_x, int64_t n, DType dtype);
// d_x[t, :] = d_table[d_ids[t], :] (times `scale` unless it is 1: Gemma's sqrt(hidden)), t < n.
std::string embed(Weights d_table, const int32_t* d_ids, int64_t n, int64_t hidden, float* d_x, float scale = 1.0f);
// Row r of d_out = rms_norm(row d_rows[r] of d_x) (d_rows null: row r), r < n. d_out may be
// d_x (in place) when d_rows is null.
std::string rms_norm(const float* d_x, const int32_t* d_rows, const float* d_weight, int64_t n, int64_t hidden,
                     float eps, float* d_out);
// Lanes reducing one projection row in every projection kernel: 16 (a half-warp, lane l the
// definition's partial sum l, coalesced weight reads, a shuffle butterfly: the GPU's default)
// or 1 (one thread per row: the emulated default, the host's GEMM). The same bits either way
// (kernels/gemm.h's definition). Process-wide, not thread-safe: set it before launching.
// Returns false (changing nothing) for any other count.
bool set_project_lanes(int lanes);
int project_lanes();

// CUDA graphs (the engine's decode steps). Between begin_capture(stream) and
// end_capture(stream, &exec) every kernel the functions here launch on the calling thread is
// captured into `stream`'s graph instead of running (their pointer and size arguments are
// frozen as given: later contents of the buffers are read at each replay); no allocation or
// copy may happen on this thread in between (CUDA refuses it and invalidates the capture;
// other threads are free: thread-local capture mode). end_capture
// instantiates the graph (*exec; null on an error), graph_replay waits for the legacy stream
// (where uploads and every eager launch go), runs the graph on the stream and waits for it.
// stream_create makes a non-blocking stream: legacy-stream work on other threads does not
// conflict with its captures.
std::string stream_create(void** stream);
void stream_destroy(void* stream);
std::string begin_capture(void* stream);
std::string end_capture(void* stream, void** graph_exec);
std::string graph_replay(void* graph_exec, void* stream);
void graph_destroy(void* graph_exec);

// d_y[t, r] = dot(d_w[r, :], d_x[t, :]) (+ d_bias[r], one fp32 add after the dot, when d_bias
// is not null) for t < n, r < out_dim: one thread per element, each reduced over in_dim in
// dot()'s fixed order whatever n (batch-invariant).
std::string project(Weights d_w, const float* d_bias, int64_t out_dim, int64_t in_dim, const float* d_x, int64_t n,
                    float* d_y);
// Rotary embedding in place of d_x [n, heads, head_dim] at d_positions[t].
std::string rope(float* d_x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* d_positions,
                 const float* d_inv_freq);
// K/V of token t into slot d_slots[t] of the pools ([slots, kv_dim] of `kv_dtype`, divided
// by the KV head's scale when d_k_scale/d_v_scale are given (kv_dim = KV heads * head_dim),
// rounded to nearest even, fp8 saturated); slot -1 is skipped.
std::string write_kv(const float* d_k, const float* d_v, const int64_t* d_slots, int64_t n, int64_t kv_dim,
                     DType kv_dtype, void* d_k_pool, void* d_v_pool, int64_t head_dim = 0,
                     const float* d_k_scale = nullptr, const float* d_v_scale = nullptr);

// Planted bugs for the checks that must catch them (never a user option): kExact is the
// kernel; kBf16Accumulator keeps the attention accumulator and softmax sum in bf16 (rounded
// after every add: the reduced-precision accumulation that made vLLM's long-context FP8
// attention fail, "The State of FP8 KV-Cache and Attention Quantization in vLLM", 2026);
// kDropKvScales reads the pools without their scales (the scales never reach the kernel:
// TensorRT-LLM PR #16916's class).
enum class AttentionVariant { kExact, kBf16Accumulator, kDropKvScales };

// Paged attention, decode and chunked prefill alike: token t (sequence d_seq_of_token[t],
// position d_positions[t]) attends causally to positions [first, position] of its sequence
// (first = kernels::window_first(position, window): 0 without a window; with one, the blocks
// wholly before it are never read), each score soft-capped when softcap > 0 (Gemma 2's
// kernels::soft_cap, after the scale)
// through its block table row; query head h reads KV head h / (num_heads / num_kv_heads).
// Positions are cut into partitions of `partition` positions (fixed in positions, never a
// number of splits). Kernel 1 runs one thread block per (token, KV head, partition): it loads
// each K/V row once into shared memory for every query head of the group, and leaves the
// partition's online-softmax state (accumulator, max, sum) in d_workspace. Kernel 2 merges a
// token's partitions in order. A token's result depends only on its own K/V and query.
//
// With d_merge_counters (n * num_kv_heads words, all zero; left zero) there is no kernel 2:
// the last block of a (token, KV head) to finish, by an atomic ticket, merges its partitions
// with kernel 2's arithmetic (the same bits; one launch).
//
// max_partitions: at least attention_partitions(max position in the batch, partition).
// d_workspace: attention_workspace_floats(n, num_heads, head_dim, max_partitions) floats.
int64_t attention_partitions(int64_t max_position, int64_t partition);
int64_t attention_workspace_floats(int64_t n, int64_t num_heads, int64_t head_dim, int64_t max_partitions);
// "" when the attention kernels take this shape, else why not (head_dim, group size).
std::string check_attention_shape(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim);
std::string attention(const float* d_q, DType kv_dtype, const void* d_k_pool, const void* d_v_pool,
                      const int32_t* d_block_tables, int64_t max_blocks_per_seq, const int32_t* d_seq_of_token,
                      const int32_t* d_positions, int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                      int64_t block_size, float scale, int64_t partition, int64_t max_partitions, float* d_workspace,
                      float* d_out, const float* d_k_scale = nullptr, const float* d_v_scale = nullptr,
                      AttentionVariant variant = AttentionVariant::kExact, int64_t window = 0, float softcap = 0.0f,
                      int32_t* d_merge_counters = nullptr);

// Fused kernels: each gives the bits of the unfused calls it replaces, in one launch (the
// engine's layer is 7 launches: project_qkv_rope_kv, attention with merge counters, project
// (o), add_norm, project_gated, project (down), add_norm; with Gemma 3's q/k norms, which need
// a whole head, project_qkv and heads_rope_kv instead of the first: 8).
//
// The fused projections take weights of one dtype (an error otherwise).
//
// project(wq, bq, q_dim, ...) into d_q, project(wk, ...) into d_k, project(wv, ...) into d_v.
std::string project_qkv(Weights d_wq, const float* d_bq, Weights d_wk, const float* d_bk, Weights d_wv,
                        const float* d_bv, int64_t q_dim, int64_t kv_dim, int64_t in_dim, const float* d_x, int64_t n,
                        float* d_q, float* d_k, float* d_v);
// project(wg, ...) into d_gate, project(wu, ...) into d_up, then gelu_tanh_mul (gelu_tanh) or
// silu_mul on them.
std::string project_gated(Weights d_wg, const float* d_bg, Weights d_wu, const float* d_bu, int64_t out_dim,
                          int64_t in_dim, const float* d_x, int64_t n, bool gelu_tanh, float* d_gate, float* d_up);
// rms_norm of every q and k head in place (d_q_norm, d_k_norm given: both or neither), rope
// of q and k (d_q [n, num_heads, head_dim], d_k [n, num_kv_heads, head_dim]), then write_kv
// of the roped K and d_v into the pools.
std::string heads_rope_kv(float* d_q, float* d_k, const float* d_v, int64_t n, int64_t num_heads, int64_t num_kv_heads,
                          int64_t head_dim, const float* d_q_norm, const float* d_k_norm, float eps,
                          const int32_t* d_positions, const float* d_inv_freq, const int64_t* d_slots, DType kv_dtype,
                          void* d_k_pool, void* d_v_pool, const float* d_k_scale = nullptr,
                          const float* d_v_scale = nullptr);
// project_qkv then heads_rope_kv without q/k norms, in one launch (a thread per rotary pair
// of q and of k, and per row of v). REQUIRES: head_dim even.
std::string project_qkv_rope_kv(Weights d_wq, const float* d_bq, Weights d_wk, const float* d_bk, Weights d_wv,
                                const float* d_bv, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                int64_t in_dim, const float* d_x, int64_t n, const int32_t* d_positions,
                                const float* d_inv_freq, const int64_t* d_slots, float* d_q, float* d_k, float* d_v,
                                DType kv_dtype, void* d_k_pool, void* d_v_pool, const float* d_k_scale = nullptr,
                                const float* d_v_scale = nullptr);
// Rows r < n of [n, hidden]: rms_norm(d_y, d_post_norm) in place when d_post_norm is given,
// then add_in_place(d_x, d_y), then rms_norm(d_x, d_next_norm) into d_h when d_next_norm is.
std::string add_norm(float* d_y, const float* d_post_norm, float* d_x, const float* d_next_norm, int64_t n,
                     int64_t hidden, float eps, float* d_h);

// d_gate[i] = silu(d_gate[i]) * d_up[i], i < n.
std::string silu_mul(float* d_gate, const float* d_up, int64_t n);
// d_gate[i] = gelu_tanh(d_gate[i]) * d_up[i], i < n (Gemma's GeGLU).
std::string gelu_tanh_mul(float* d_gate, const float* d_up, int64_t n);
// d_x[i] += d_y[i], i < n.
std::string add_in_place(float* d_x, const float* d_y, int64_t n);

}  // namespace kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS
