// The CUDA backend's kernels, one source for both flavours (see model_kernels.h): nvcc
// builds kvp_cuda_kernels_dev, the host compiler builds kvp_cuda_kernels_emu through
// model_kernels_emulated.cc and the SIMT layer. Kernel bodies hold no flavour #ifdefs.
//
// Each kernel gives one output element (or one (token, head) pair) to one CUDA thread and
// computes it with the CPU backend's loops from kernels/cpu_attention.h, so the reduction
// order of every value is fixed by the sizes alone (N1), and the emulated flavour gives the
// CPU backend's bits. The GPU flavour may differ in the last bits (nvcc contracts a*b+c into
// FMA; see kernels/simt/simt.h, "Fidelity"), but is as deterministic.
#include "kernels/cuda/model_kernels.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cpu_attention.h"
#include "kernels/kv_index.h"
#include "kernels/simt/simt.h"

namespace kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS {
namespace {

constexpr int kThreads = 128;

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

__global__ void fill_nan_kernel(float* x, int64_t n) {
  const int64_t i = global_index();
  if (i < n) x[i] = __int_as_float(0x7fc00000);
}

__global__ void embed_kernel(const float* table, const int32_t* ids, int64_t n, int64_t hidden, float* x) {
  const int64_t i = global_index();
  if (i >= n * hidden) return;
  const int64_t t = i / hidden;
  const int64_t c = i % hidden;
  x[i] = table[static_cast<int64_t>(ids[t]) * hidden + c];
}

// One thread per row: rms_norm's reduction is dot(x, x) in its fixed order.
__global__ void rms_norm_kernel(const float* x, const int32_t* rows, const float* weight, int64_t n, int64_t hidden,
                                float eps, float* out) {
  const int64_t r = global_index();
  if (r >= n) return;
  const int64_t src = rows == nullptr ? r : static_cast<int64_t>(rows[r]);
  kvp::kernels::rms_norm(x + src * hidden, weight, hidden, eps, out + r * hidden);
}

// One thread per output element (t, r); adjacent threads take adjacent rows r of the same
// token, so they share the token's activations.
__global__ void project_kernel(const float* w, int64_t out_dim, int64_t in_dim, const float* x, int64_t n, float* y) {
  const int64_t i = global_index();
  if (i >= n * out_dim) return;
  const int64_t t = i / out_dim;
  const int64_t r = i % out_dim;
  y[i] = kvp::kernels::dot(w + r * in_dim, x + t * in_dim, in_dim);
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

__global__ void write_kv_kernel(const float* k, const float* v, const int64_t* slots, int64_t n, int64_t kv_dim,
                                float* k_pool, float* v_pool) {
  const int64_t i = global_index();
  if (i >= n * kv_dim) return;
  const int64_t t = i / kv_dim;
  const int64_t c = i % kv_dim;
  const int64_t slot = slots[t];
  if (slot == kvp::kernels::kSkipSlot) return;
  // kv_pool_offset(slot, 0, ...) + c: the token's row, KV head major.
  const int64_t at = slot * kv_dim + c;
  k_pool[at] = k[i];
  v_pool[at] = v[i];
}

// One thread per (token, query head). Threads of one token are adjacent and query heads of
// one group are adjacent, so a group's threads read the same K/V rows at the same time.
__global__ void attention_kernel(const float* q, const float* k_pool, const float* v_pool, const int32_t* block_tables,
                                 int64_t max_blocks_per_seq, const int32_t* seq_of_token, const int32_t* positions,
                                 int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                 int64_t block_size, float scale, int64_t partition, float* out) {
  const int64_t i = global_index();
  if (i >= n * num_heads) return;
  const int64_t t = i / num_heads;
  const int64_t head = i % num_heads;
  const int64_t group = num_heads / num_kv_heads;
  const int32_t* table = block_tables + static_cast<int64_t>(seq_of_token[t]) * max_blocks_per_seq;
  float scratch[kMaxHeadDim];
  kvp::kernels::paged_attention_head(q + i * head_dim, k_pool, v_pool, table, block_size, num_kv_heads, head / group,
                                     head_dim, static_cast<int64_t>(positions[t]), scale, partition, scratch,
                                     out + i * head_dim);
}

__global__ void silu_mul_kernel(float* gate, const float* up, int64_t n) {
  const int64_t i = global_index();
  if (i < n) gate[i] = kvp::kernels::silu(gate[i]) * up[i];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = global_index();
  if (i < n) x[i] += y[i];
}

}  // namespace

std::string check_device() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return std::string("no CUDA device: cudaGetDeviceCount: ") +
           (e == cudaSuccess ? std::string("0 devices") : kvp::simt::error_message(e));
  return {};
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

std::string fill_nan(float* d_x, int64_t n) {
  if (n <= 0) return {};
  KVP_LAUNCH(fill_nan_kernel, grid_for(n), dim3(kThreads), 0, nullptr)(d_x, n);
  return launched("fill_nan_kernel");
}

std::string embed(const float* d_table, const int32_t* d_ids, int64_t n, int64_t hidden, float* d_x) {
  if (n <= 0) return {};
  KVP_LAUNCH(embed_kernel, grid_for(n * hidden), dim3(kThreads), 0, nullptr)(d_table, d_ids, n, hidden, d_x);
  return launched("embed_kernel");
}

std::string rms_norm(const float* d_x, const int32_t* d_rows, const float* d_weight, int64_t n, int64_t hidden,
                     float eps, float* d_out) {
  if (n <= 0) return {};
  KVP_LAUNCH(rms_norm_kernel, grid_for(n), dim3(kThreads), 0, nullptr)(d_x, d_rows, d_weight, n, hidden, eps, d_out);
  return launched("rms_norm_kernel");
}

std::string project(const float* d_w, int64_t out_dim, int64_t in_dim, const float* d_x, int64_t n, float* d_y) {
  if (n <= 0) return {};
  KVP_LAUNCH(project_kernel, grid_for(n * out_dim), dim3(kThreads), 0, nullptr)(d_w, out_dim, in_dim, d_x, n, d_y);
  return launched("project_kernel");
}

std::string rope(float* d_x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* d_positions,
                 const float* d_inv_freq) {
  if (n <= 0) return {};
  if (head_dim > kMaxHeadDim) return "rope: head_dim " + std::to_string(head_dim) + " > " + std::to_string(kMaxHeadDim);
  KVP_LAUNCH(rope_kernel, grid_for(n * heads), dim3(kThreads), 0, nullptr)
  (d_x, n, heads, head_dim, d_positions, d_inv_freq);
  return launched("rope_kernel");
}

std::string write_kv(const float* d_k, const float* d_v, const int64_t* d_slots, int64_t n, int64_t kv_dim,
                     float* d_k_pool, float* d_v_pool) {
  if (n <= 0) return {};
  KVP_LAUNCH(write_kv_kernel, grid_for(n * kv_dim), dim3(kThreads), 0, nullptr)
  (d_k, d_v, d_slots, n, kv_dim, d_k_pool, d_v_pool);
  return launched("write_kv_kernel");
}

std::string attention(const float* d_q, const float* d_k_pool, const float* d_v_pool, const int32_t* d_block_tables,
                      int64_t max_blocks_per_seq, const int32_t* d_seq_of_token, const int32_t* d_positions, int64_t n,
                      int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size, float scale,
                      int64_t partition, float* d_out) {
  if (n <= 0) return {};
  if (head_dim > kMaxHeadDim)
    return "attention: head_dim " + std::to_string(head_dim) + " > " + std::to_string(kMaxHeadDim);
  KVP_LAUNCH(attention_kernel, grid_for(n * num_heads), dim3(kThreads), 0, nullptr)
  (d_q, d_k_pool, d_v_pool, d_block_tables, max_blocks_per_seq, d_seq_of_token, d_positions, n, num_heads, num_kv_heads,
   head_dim, block_size, scale, partition, d_out);
  return launched("attention_kernel");
}

std::string silu_mul(float* d_gate, const float* d_up, int64_t n) {
  if (n <= 0) return {};
  KVP_LAUNCH(silu_mul_kernel, grid_for(n), dim3(kThreads), 0, nullptr)(d_gate, d_up, n);
  return launched("silu_mul_kernel");
}

std::string add_in_place(float* d_x, const float* d_y, int64_t n) {
  if (n <= 0) return {};
  KVP_LAUNCH(add_kernel, grid_for(n), dim3(kThreads), 0, nullptr)(d_x, d_y, n);
  return launched("add_kernel");
}

}  // namespace kvp::cuda_kernels::KVP_CUDA_FLAVOUR_NS
