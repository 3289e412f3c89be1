#include "kernel_check/kernel_check.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "common/dtype.h"
#include "common/report.h"
#include "common/rng.h"
#include "kernel_check/cuda_runtime.h"

namespace kvp::verify::kernel_check {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

constexpr uint64_t kGridSeed = 0x6b65726e656c3138ull;  // "kernel18"
constexpr int64_t kGuardFloats = 64;
constexpr uint32_t kGuardBits = 0x7fa5a5a5u;  // a NaN payload no kernel computes
constexpr float kUnwritten = 1.0e30f;         // `out` before the call: a row left unwritten fails accuracy

int64_t element_size(int32_t dtype) { return dtype == KVP_KV_F32 ? 4 : 2; }

// ---- inputs ----------------------------------------------------------------------------

// Rounds x to the KV dtype (so that the dense K/V the reference reads are the pool's values).
float round_to_dtype(float x, int32_t dtype) {
  if (dtype == KVP_KV_F16) return f16_to_float(float_to_f16(x));
  if (dtype == KVP_KV_BF16) return bf16_to_float(float_to_bf16(x));
  return x;
}

void store_element(uint8_t* pool, int64_t index, int32_t dtype, float x) {
  if (dtype == KVP_KV_F32) {
    std::memcpy(pool + index * 4, &x, 4);
  } else {
    const uint16_t bits = dtype == KVP_KV_F16 ? float_to_f16(x) : float_to_bf16(x);
    std::memcpy(pool + index * 2, &bits, 2);
  }
}

// Element index of dimension d of K (is_value false) or V at (block, offset, kv head) in the
// layout, relative to args.k_cache / args.v_cache (attention_plugin.h draws each layout).
int64_t layout_index(const KernelCase& c, bool is_value, int64_t block, int64_t offset, int64_t head, int64_t d) {
  const int64_t bs = c.block_size, nh = c.num_kv_heads, hd = c.head_dim;
  switch (c.kv_layout) {
    case KVP_LAYOUT_KVPROOF: return ((block * bs + offset) * nh + head) * hd + d;
    case KVP_LAYOUT_FLASHINFER_NHD: return ((block * 2 * bs + offset) * nh + head) * hd + d;
    case KVP_LAYOUT_FLASHINFER_HND: return ((block * 2 * nh + head) * bs + offset) * hd + d;
    default: {  // vLLM: K [nb][H][D/x][bs][x], V [nb][H][D][bs]
      const int64_t x = 16 / element_size(c.kv_dtype);
      if (is_value) return ((block * nh + head) * hd + d) * bs + offset;
      return (((block * nh + head) * (hd / x) + d / x) * bs + offset) * x + d % x;
    }
  }
}

bool combined_pool(int32_t layout) {
  return layout == KVP_LAYOUT_FLASHINFER_NHD || layout == KVP_LAYOUT_FLASHINFER_HND;
}

struct Inputs {
  kvp_attention_shape shape{};
  std::vector<float> query;
  std::vector<int32_t> query_start, token_seq, positions, context_lens, block_tables;
  std::vector<std::vector<float>> k_dense, v_dense;  // per sequence [context][kv head][head_dim]
  std::vector<uint8_t> k_pool, v_pool;               // v_pool empty for a combined layout
  int64_t v_offset_bytes = 0;                        // combined layout: v_cache = k_cache + this
  float scale = 1.0f;
};

// The batch's shape, block tables (a random permutation of a pool larger than needed, dealt
// out in order, each row padded with -1) and metadata.
void make_batch(const KernelCase& c, Rng& rng, Inputs& in) {
  const int64_t num_seqs = static_cast<int64_t>(c.seqs.size());
  const int64_t bs = c.block_size, hd = c.head_dim;
  int64_t total_blocks = 0, max_blocks = 0, num_tokens = 0, max_context = 0;
  for (const SeqSpec& s : c.seqs) {
    const int64_t n = (s.context_len + bs - 1) / bs;
    total_blocks += n;
    max_blocks = std::max(max_blocks, n);
    num_tokens += s.num_new;
    max_context = std::max<int64_t>(max_context, s.context_len);
  }
  const int64_t num_blocks = total_blocks + std::max<int64_t>(3, total_blocks / 2);
  const int64_t stride = max_blocks + 1;  // always at least one -1 padding entry per row
  in.shape = kvp_attention_shape{c.num_heads,
                                 c.num_kv_heads,
                                 c.head_dim,
                                 c.block_size,
                                 c.kv_dtype,
                                 c.kv_layout,
                                 static_cast<int32_t>(num_seqs),
                                 static_cast<int32_t>(num_tokens),
                                 static_cast<int32_t>(max_context),
                                 static_cast<int32_t>(stride),
                                 num_blocks};
  in.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));

  // Block tables: a random permutation of the pool, dealt out in order.
  std::vector<int32_t> ids(static_cast<std::size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) ids[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = num_blocks - 1; i > 0; --i)
    std::swap(ids[static_cast<std::size_t>(i)], ids[rng.below(static_cast<uint64_t>(i + 1))]);
  in.block_tables.assign(static_cast<std::size_t>(num_seqs * stride), -1);
  std::size_t next = 0;
  in.query_start.push_back(0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const SeqSpec& spec = c.seqs[static_cast<std::size_t>(s)];
    const int64_t n = (spec.context_len + bs - 1) / bs;
    for (int64_t j = 0; j < n; ++j) in.block_tables[static_cast<std::size_t>(s * stride + j)] = ids[next++];
    in.context_lens.push_back(spec.context_len);
    for (int32_t i = spec.context_len - spec.num_new; i < spec.context_len; ++i) {
      in.token_seq.push_back(static_cast<int32_t>(s));
      in.positions.push_back(i);
    }
    in.query_start.push_back(static_cast<int32_t>(in.token_seq.size()));
  }
}

// Dense K/V per sequence, rounded to the KV dtype, and the queries; all-equal scores copy the
// first position's keys everywhere.
void draw_values(const KernelCase& c, Rng& rng, Inputs& in) {
  const int64_t kvh = c.num_kv_heads, hd = c.head_dim;
  for (const SeqSpec& spec : c.seqs) {
    const std::size_t n = static_cast<std::size_t>(spec.context_len * kvh * hd);
    std::vector<float> k(n), v(n);
    for (float& x : k) x = round_to_dtype(static_cast<float>(rng.uniform(-1.0, 1.0)), c.kv_dtype);
    for (float& x : v) x = round_to_dtype(static_cast<float>(rng.uniform(-1.0, 1.0)), c.kv_dtype);
    if (c.kind == InputKind::kEqualScores) {
      for (std::size_t i = static_cast<std::size_t>(kvh * hd); i < n; ++i)
        k[i] = k[i % static_cast<std::size_t>(kvh * hd)];
    }
    in.k_dense.push_back(std::move(k));
    in.v_dense.push_back(std::move(v));
  }
  in.query.resize(static_cast<std::size_t>(in.shape.num_tokens * c.num_heads * hd));
  for (float& x : in.query) x = static_cast<float>(rng.uniform(-1.0, 1.0));
}

// One dominant position per sequence: before every new token, a key that is the first new
// token's query (the group's first head) scaled to a score of 30 above the rest.
void plant_dominant(const KernelCase& c, Rng& rng, Inputs& in) {
  const int64_t kvh = c.num_kv_heads, hd = c.head_dim, num_seqs = static_cast<int64_t>(c.seqs.size());
  const int64_t group = c.num_heads / c.num_kv_heads;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t t0 = in.query_start[static_cast<std::size_t>(s)];
    const int64_t j =
        static_cast<int64_t>(rng.below(static_cast<uint64_t>(in.positions[static_cast<std::size_t>(t0)] + 1)));
    for (int64_t g = 0; g < kvh; ++g) {
      const float* q = in.query.data() + (t0 * c.num_heads + g * group) * hd;
      double norm2 = 0.0;
      for (int64_t d = 0; d < hd; ++d) norm2 += static_cast<double>(q[d]) * q[d];
      const double factor = 30.0 / (in.scale * norm2);
      float* k = in.k_dense[static_cast<std::size_t>(s)].data() + (j * kvh + g) * hd;
      for (int64_t d = 0; d < hd; ++d) k[d] = round_to_dtype(static_cast<float>(factor * q[d]), c.kv_dtype);
    }
  }
}

// Each (token, head) query scaled so its largest |score| is 120: exp(120) overflows fp32.
void scale_to_large_scores(const KernelCase& c, Inputs& in) {
  const int64_t kvh = c.num_kv_heads, hd = c.head_dim, num_tokens = in.shape.num_tokens;
  const int64_t group = c.num_heads / c.num_kv_heads;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t s = in.token_seq[static_cast<std::size_t>(t)];
    const std::vector<float>& k = in.k_dense[static_cast<std::size_t>(s)];
    for (int64_t h = 0; h < c.num_heads; ++h) {
      float* q = in.query.data() + (t * c.num_heads + h) * hd;
      double largest = 0.0;
      for (int64_t j = 0; j <= in.positions[static_cast<std::size_t>(t)]; ++j) {
        double score = 0.0;
        for (int64_t d = 0; d < hd; ++d)
          score += static_cast<double>(q[d]) * k[static_cast<std::size_t>((j * kvh + h / group) * hd + d)];
        largest = std::max(largest, std::abs(score * in.scale));
      }
      if (largest > 0.0)
        for (int64_t d = 0; d < hd; ++d) q[d] = static_cast<float>(q[d] * (120.0 / largest));
    }
  }
}

Inputs make_inputs(const KernelCase& c) {
  Rng rng(c.seed);
  Inputs in;
  make_batch(c, rng, in);
  draw_values(c, rng, in);
  if (c.kind == InputKind::kDominant) plant_dominant(c, rng, in);
  if (c.kind == InputKind::kLargeScores) scale_to_large_scores(c, in);
  return in;
}

// The pool in the case's layout: every element `poison` (NaN, or 0 for the leak check), then
// each sequence's positions through its block table.
void fill_pool(const KernelCase& c, Inputs& in, bool nan_poison) {
  const int64_t es = element_size(c.kv_dtype);
  const int64_t block_elems = static_cast<int64_t>(c.block_size) * c.num_kv_heads * c.head_dim;
  const int64_t nb = in.shape.num_blocks;
  const bool combined = combined_pool(c.kv_layout);
  in.k_pool.assign(static_cast<std::size_t>(nb * block_elems * es * (combined ? 2 : 1)), 0);
  in.v_pool.assign(combined ? 0 : static_cast<std::size_t>(nb * block_elems * es), 0);
  in.v_offset_bytes = combined ? block_elems * es : 0;
  if (nan_poison) {
    for (int64_t i = 0; i < static_cast<int64_t>(in.k_pool.size()) / es; ++i)
      store_element(in.k_pool.data(), i, c.kv_dtype, std::nanf(""));
    for (int64_t i = 0; i < static_cast<int64_t>(in.v_pool.size()) / es; ++i)
      store_element(in.v_pool.data(), i, c.kv_dtype, std::nanf(""));
  }
  uint8_t* k_base = in.k_pool.data();
  uint8_t* v_base = combined ? in.k_pool.data() + in.v_offset_bytes : in.v_pool.data();
  const int64_t stride = in.shape.max_blocks_per_seq;
  for (std::size_t s = 0; s < c.seqs.size(); ++s) {
    for (int64_t j = 0; j < c.seqs[s].context_len; ++j) {
      const int64_t block =
          in.block_tables[s * static_cast<std::size_t>(stride) + static_cast<std::size_t>(j / c.block_size)];
      for (int64_t g = 0; g < c.num_kv_heads; ++g) {
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const std::size_t dense = static_cast<std::size_t>((j * c.num_kv_heads + g) * c.head_dim + d);
          store_element(k_base, layout_index(c, false, block, j % c.block_size, g, d), c.kv_dtype,
                        in.k_dense[s][dense]);
          store_element(v_base, layout_index(c, true, block, j % c.block_size, g, d), c.kv_dtype, in.v_dense[s][dense]);
        }
      }
    }
  }
}

// ---- the fp64 reference: softmax(scale * q K^T) V on the dense K/V ---------------------

std::vector<double> reference_attention(const KernelCase& c, const Inputs& in) {
  const int64_t hd = c.head_dim, kvh = c.num_kv_heads, group = c.num_heads / c.num_kv_heads;
  const int64_t num_tokens = in.shape.num_tokens;
  std::vector<double> out(static_cast<std::size_t>(num_tokens * c.num_heads * hd), 0.0);
  std::vector<double> scores;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const std::vector<float>& k = in.k_dense[static_cast<std::size_t>(in.token_seq[static_cast<std::size_t>(t)])];
    const std::vector<float>& v = in.v_dense[static_cast<std::size_t>(in.token_seq[static_cast<std::size_t>(t)])];
    const int64_t n = in.positions[static_cast<std::size_t>(t)] + 1;
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const float* q = in.query.data() + (t * c.num_heads + h) * hd;
      const int64_t g = h / group;
      scores.assign(static_cast<std::size_t>(n), 0.0);
      double largest = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < hd; ++d)
          dot += static_cast<double>(q[d]) * k[static_cast<std::size_t>((j * kvh + g) * hd + d)];
        scores[static_cast<std::size_t>(j)] = dot * static_cast<double>(in.scale);
        largest = std::max(largest, scores[static_cast<std::size_t>(j)]);
      }
      double sum = 0.0;
      double* row = out.data() + (t * c.num_heads + h) * hd;
      for (int64_t j = 0; j < n; ++j) {
        const double w = std::exp(scores[static_cast<std::size_t>(j)] - largest);
        sum += w;
        for (int64_t d = 0; d < hd; ++d) row[d] += w * v[static_cast<std::size_t>((j * kvh + g) * hd + d)];
      }
      for (int64_t d = 0; d < hd; ++d) row[d] /= sum;
    }
  }
  return out;
}

// ---- running the plug-in ---------------------------------------------------------------

struct Output {
  std::vector<float> buffer;  // guard, out, guard
  int status = 0;
  std::string error;
  std::vector<std::string> inputs_changed;  // a CUDA plug-in: device copies read back changed
  float* out() { return buffer.data() + kGuardFloats; }
};

// A CUDA plug-in's call: every array copied to the device, `out` with its guard zones too, and
// all of them read back afterwards, so that guard-zones and inputs-unchanged are checked on
// the device as on the host. The plug-in runs on a stream of its own, synchronised after run()
// (an asynchronous fault is then this call's error).
void call_on_device(const CudaRuntime& rt, const kvp_attention_plugin& plugin, kvp_attention_args args,
                    const Inputs& in, Output& o) {
  const kvp_attention_shape& shape = args.shape;
  const auto ints = [](int64_t n) { return static_cast<std::size_t>(n) * sizeof(int32_t); };
  struct Array {
    const void* host;
    std::size_t bytes;
    const char* name;
    void* device = nullptr;
  };
  const bool combined = in.v_pool.empty();
  std::vector<Array> arrays = {
      {args.query, static_cast<std::size_t>(o.buffer.size() - 2 * kGuardFloats) * sizeof(float), "query"},
      {args.query_start, ints(shape.num_seqs + 1), "the batch metadata"},
      {args.token_seq, ints(shape.num_tokens), "the batch metadata"},
      {args.positions, ints(shape.num_tokens), "the batch metadata"},
      {args.context_lens, ints(shape.num_seqs), "the batch metadata"},
      {args.block_tables, ints(static_cast<int64_t>(shape.num_seqs) * shape.max_blocks_per_seq), "block_tables"},
      {in.k_pool.data(), in.k_pool.size(), combined ? "the KV pool" : "the K pool"},
      {in.v_pool.data(), in.v_pool.size(), "the V pool"},
      {o.buffer.data(), o.buffer.size() * sizeof(float), "out"},
  };
  void* stream = nullptr;
  auto fail = [&](const std::string& why) {
    o.status = -1;
    o.error = why;
  };
  auto run = [&]() {
    for (Array& a : arrays) {
      if (std::string e = rt.alloc(&a.device, a.bytes); !e.empty()) return fail("kernel-check: " + e);
      if (std::string e = rt.to_device(a.device, a.host, a.bytes); !e.empty()) return fail("kernel-check: " + e);
    }
    if (std::string e = rt.stream_create(&stream); !e.empty()) return fail("kernel-check: " + e);
    args.query = static_cast<const float*>(arrays[0].device);
    args.query_start = static_cast<const int32_t*>(arrays[1].device);
    args.token_seq = static_cast<const int32_t*>(arrays[2].device);
    args.positions = static_cast<const int32_t*>(arrays[3].device);
    args.context_lens = static_cast<const int32_t*>(arrays[4].device);
    args.block_tables = static_cast<const int32_t*>(arrays[5].device);
    args.k_cache = arrays[6].device;
    args.v_cache = combined ? static_cast<const uint8_t*>(arrays[6].device) + in.v_offset_bytes : arrays[7].device;
    args.out = static_cast<float*>(arrays[8].device) + kGuardFloats;
    args.stream = stream;
    char err[512] = {};
    o.status = plugin.run(&args, err, sizeof err);
    if (o.status != 0) o.error = err[0] != '\0' ? std::string(err, strnlen(err, sizeof err)) : "(no message)";
    if (std::string e = rt.stream_synchronize(stream); !e.empty())
      return fail("the kernel's stream reported an error after run() returned " + std::to_string(o.status) + ": " + e);
    if (std::string e = rt.to_host(o.buffer.data(), arrays[8].device, arrays[8].bytes); !e.empty())
      return fail("kernel-check: " + e);
    std::vector<uint8_t> back;
    for (std::size_t i = 0; i + 1 < arrays.size(); ++i) {
      back.resize(arrays[i].bytes);
      if (std::string e = rt.to_host(back.data(), arrays[i].device, arrays[i].bytes); !e.empty())
        return fail("kernel-check: " + e);
      if (arrays[i].bytes > 0 && std::memcmp(back.data(), arrays[i].host, arrays[i].bytes) != 0 &&
          std::find(o.inputs_changed.begin(), o.inputs_changed.end(), arrays[i].name) == o.inputs_changed.end())
        o.inputs_changed.emplace_back(arrays[i].name);
    }
  };
  run();
  rt.stream_destroy(stream);
  for (Array& a : arrays) rt.free(a.device);
}

Output call_plugin(const kvp_attention_plugin& plugin, const Inputs& in, const kvp_attention_shape& shape,
                   const float* query, const int32_t* query_start, const int32_t* token_seq, const int32_t* positions,
                   const int32_t* context_lens, const int32_t* block_tables) {
  const int64_t n = static_cast<int64_t>(shape.num_tokens) * shape.num_heads * shape.head_dim;
  Output o;
  o.buffer.assign(static_cast<std::size_t>(n + 2 * kGuardFloats), bits_float(kGuardBits));
  std::fill(o.out(), o.out() + n, kUnwritten);
  kvp_attention_args args{};
  args.shape = shape;
  args.query = query;
  args.out = o.out();
  args.query_start = query_start;
  args.token_seq = token_seq;
  args.positions = positions;
  args.context_lens = context_lens;
  args.block_tables = block_tables;
  args.k_cache = in.k_pool.data();
  args.v_cache = in.v_pool.empty() ? in.k_pool.data() + in.v_offset_bytes : in.v_pool.data();
  args.scale = in.scale;
  args.stream = nullptr;
  if (plugin.device == KVP_DEVICE_CUDA) {
    std::string why;
    const CudaRuntime* rt = CudaRuntime::shared(why);
    if (rt == nullptr) {
      o.status = -1;
      o.error = "kernel-check: " + why;
    } else {
      call_on_device(*rt, plugin, args, in, o);
    }
    return o;
  }
  char err[512] = {};
  o.status = plugin.run(&args, err, sizeof err);
  if (o.status != 0) o.error = err[0] != '\0' ? std::string(err, strnlen(err, sizeof err)) : "(no message)";
  return o;
}

Output call_plugin(const kvp_attention_plugin& plugin, const Inputs& in) {
  return call_plugin(plugin, in, in.shape, in.query.data(), in.query_start.data(), in.token_seq.data(),
                     in.positions.data(), in.context_lens.data(), in.block_tables.data());
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<std::size_t>(n) * 4) == 0;
}

int64_t count_non_finite(const float* p, int64_t n) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) k += std::isfinite(p[i]) ? 0 : 1;
  return k;
}

double ulp_of(double x, int32_t dtype) {
  const int mantissa = dtype == KVP_KV_F32 ? 23 : dtype == KVP_KV_F16 ? 10 : 7;
  if (x <= 0.0) return std::ldexp(1.0, -mantissa - 14);
  return std::ldexp(1.0, std::ilogb(x) - mantissa);
}

std::string row_name(const KernelCase& c, const Inputs& in, int64_t row) {
  const int64_t t = row / c.num_heads;
  std::ostringstream o;
  o << "token " << t << " (seq " << in.token_seq[static_cast<std::size_t>(t)] << ", position "
    << in.positions[static_cast<std::size_t>(t)] << ") head " << row % c.num_heads;
  return o.str();
}

}  // namespace

const char* grid_name(Grid grid) { return grid == Grid::kQuick ? "quick" : "full"; }
const char* input_kind_name(InputKind kind) {
  switch (kind) {
    case InputKind::kRandom: return "random";
    case InputKind::kLargeScores: return "large-scores";
    case InputKind::kEqualScores: return "equal-scores";
    case InputKind::kDominant: return "dominant";
  }
  return "?";
}
const char* dtype_name(int32_t kv_dtype) {
  return kv_dtype == KVP_KV_F32 ? "f32" : kv_dtype == KVP_KV_F16 ? "f16" : kv_dtype == KVP_KV_BF16 ? "bf16" : "?";
}
const char* layout_name(int32_t kv_layout) {
  switch (kv_layout) {
    case KVP_LAYOUT_KVPROOF: return "kvproof";
    case KVP_LAYOUT_FLASHINFER_NHD: return "flashinfer-nhd";
    case KVP_LAYOUT_FLASHINFER_HND: return "flashinfer-hnd";
    case KVP_LAYOUT_VLLM: return "vllm";
  }
  return "?";
}

double tolerance(int32_t kv_dtype) {
  switch (kv_dtype) {
    case KVP_KV_F16: return 2e-3;
    case KVP_KV_BF16: return 1.6e-2;
    default: return 1e-4;
  }
}

int shard_of(int64_t case_id, int shard_count) {
  return static_cast<int>(mix_seed(kGridSeed ^ 0x5348415244ull, static_cast<uint64_t>(case_id)) %
                          static_cast<uint64_t>(shard_count));
}

bool CaseResult::failed(const std::string& property) const {
  return std::any_of(failures.begin(), failures.end(), [&](const Failure& f) { return f.property == property; });
}

std::string KernelCase::describe() const {
  std::ostringstream o;
  o << "case " << id << " [" << label << "] heads " << num_heads << "/" << num_kv_heads << " head_dim " << head_dim
    << " block_size " << block_size << " " << dtype_name(kv_dtype) << " " << layout_name(kv_layout) << " "
    << input_kind_name(kind) << " seqs";
  // Streamed piece by piece: GCC 12 at -O3 (the release preset) reports a false -Wrestrict
  // in a string concatenated here (GCC bug 105651).
  for (const SeqSpec& s : seqs) {
    o << " " << s.context_len;
    if (s.num_new > 1) o << "+" << s.num_new;
  }
  o << " seed " << seed;
  return o.str();
}

nlohmann::json KernelCase::to_json() const {
  nlohmann::json seq_list = nlohmann::json::array();
  for (const SeqSpec& s : seqs) seq_list.push_back({{"context_len", s.context_len}, {"num_new", s.num_new}});
  return {{"id", id},
          {"label", label},
          {"num_heads", num_heads},
          {"num_kv_heads", num_kv_heads},
          {"head_dim", head_dim},
          {"block_size", block_size},
          {"kv_dtype", dtype_name(kv_dtype)},
          {"kv_layout", layout_name(kv_layout)},
          {"kind", input_kind_name(kind)},
          {"seqs", seq_list},
          {"seed", seed}};
}

namespace {

struct GridHeads {
  int32_t q, kv;
};
const std::vector<int32_t> kGridHeadDims = {64, 80, 96, 128, 256};
const std::vector<GridHeads> kGridHeads = {{1, 1}, {4, 4}, {8, 1}, {7, 1}, {14, 2}, {16, 1}, {32, 2}};

int32_t clamp1(int32_t n) { return std::max<int32_t>(1, n); }

// The grid's cases in order, numbered as they are added (a case's id and seed are its index:
// the order below is part of every reproducer, so it does not change).
struct GridBuilder {
  std::vector<int32_t> dtypes, layouts;  // the plug-in's, in enum order
  std::vector<KernelCase> cases;

  void add(KernelCase c) {
    c.id = static_cast<int64_t>(cases.size());
    c.seed = mix_seed(kGridSeed, static_cast<uint64_t>(c.id));
    // vLLM's split-x key layout needs head_dim % x == 0; another declared layout takes the case.
    if (c.kv_layout == KVP_LAYOUT_VLLM && c.head_dim % (16 / element_size(c.kv_dtype)) != 0)
      c.kv_layout = layouts.front();
    cases.push_back(std::move(c));
  }

  // Scenarios for one shape: what sequences a batch holds; `rotation` spreads the dtypes and
  // layouts over the shapes.
  void scenarios(const KernelCase& base, int64_t rotation) {
    const int32_t bs = base.block_size;
    const auto dtype_i = static_cast<std::size_t>(rotation);
    auto with = [&](std::string label, InputKind kind, std::vector<SeqSpec> seqs, std::size_t k) {
      KernelCase c = base;
      c.label = std::move(label);
      c.kind = kind;
      c.seqs = std::move(seqs);
      c.kv_dtype = dtypes[(dtype_i + k) % dtypes.size()];
      c.kv_layout = layouts[(dtype_i + 2 * k) % layouts.size()];
      add(std::move(c));
    };
    // Decode rows at the block edges: 1, shorter than a block, block - 1, block, block + 1, 2 blocks + 1.
    with("decode-block-edges", InputKind::kRandom,
         {{1, 1}, {clamp1(bs / 2), 1}, {clamp1(bs - 1), 1}, {bs, 1}, {bs + 1, 1}, {2 * bs + 1, 1}}, 0);
    // A prefill chunk starting mid-block beside a decode row.
    const int32_t start = bs + bs / 2;
    const int32_t chunk = std::min(bs + 2, 12);
    with("prefill-mid-block", InputKind::kRandom, {{start + chunk, chunk}, {clamp1(2 * bs - 1), 1}}, 1);
    with("large-scores", InputKind::kLargeScores, {{bs + 1, 1}, {clamp1(3 * bs - 1), 1}, {start + 3, 3}}, 2);
    with("equal-scores", InputKind::kEqualScores, {{clamp1(bs - 1), 1}, {2 * bs + 1, 1}}, 3);
    with("dominant", InputKind::kDominant, {{2 * bs + 3, 1}, {start + 4, 4}}, 4);
  }

  // Every head_dim and head shape: quick rotates block sizes over them, full crosses all
  // block sizes and dtypes.
  void shapes(Grid grid) {
    const std::vector<int32_t> block_sizes = grid == Grid::kQuick
                                                 ? std::vector<int32_t>{1, 16, 3, 64, 17, 256, 8}
                                                 : std::vector<int32_t>{1, 2, 3, 8, 15, 16, 17, 32, 64, 128, 256};
    auto base = [](const GridHeads& h, int32_t head_dim, int32_t block_size) {
      KernelCase c;
      c.num_heads = h.q;
      c.num_kv_heads = h.kv;
      c.head_dim = head_dim;
      c.block_size = block_size;
      return c;
    };
    int64_t rotation = 0;
    if (grid == Grid::kQuick) {
      for (const int32_t hd : kGridHeadDims)
        for (std::size_t h = 0; h < kGridHeads.size(); ++h, ++rotation)
          scenarios(base(kGridHeads[h], hd, block_sizes[static_cast<std::size_t>(rotation) % block_sizes.size()]),
                    rotation);
      return;
    }
    for (const int32_t hd : kGridHeadDims)
      for (const GridHeads& h : kGridHeads)
        for (const int32_t bs : block_sizes)
          for (std::size_t di = 0; di < dtypes.size(); ++di, ++rotation) scenarios(base(h, hd, bs), rotation);
  }

  // Partition edges (kvproof splits at 128 positions; 256 and 512 are common elsewhere).
  void partition_edges(Grid grid) {
    for (std::size_t d = 0; d < kGridHeadDims.size(); ++d) {
      KernelCase c;
      c.label = "partition-edges";
      c.num_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim = kGridHeadDims[d];
      c.block_size = d % 2 == 0 ? 16 : 32;
      c.kv_dtype = dtypes[d % dtypes.size()];
      c.kv_layout = layouts[d % layouts.size()];
      c.seqs = {{127, 1}, {128, 1}, {129, 1}, {255, 1}, {256, 1}, {257, 1}};
      if (grid == Grid::kFull) c.seqs.insert(c.seqs.end(), {{511, 1}, {512, 1}, {513, 1}});
      add(c);
    }
  }

  // Long contexts (full grid): past 32k positions, decode rows and a chunk ending there.
  void long_contexts() {
    for (std::size_t i = 0; i < dtypes.size() * layouts.size(); ++i) {
      KernelCase c;
      c.label = "long-context";
      c.num_heads = 8;
      c.num_kv_heads = 1;
      c.head_dim = 128;
      c.block_size = i % 2 == 0 ? 16 : 256;
      c.kv_dtype = dtypes[i % dtypes.size()];
      c.kv_layout = layouts[(i / dtypes.size()) % layouts.size()];
      c.seqs = {{32769, 1}, {32768 + 7, 4}};
      add(c);
    }
  }
};

}  // namespace

std::vector<KernelCase> make_grid(Grid grid, uint32_t kv_dtypes, uint32_t kv_layouts) {
  GridBuilder b;
  for (int32_t d = KVP_KV_F32; d <= KVP_KV_BF16; ++d)
    if (kv_dtypes & KVP_DTYPE_BIT(d)) b.dtypes.push_back(d);
  for (int32_t l = KVP_LAYOUT_KVPROOF; l <= KVP_LAYOUT_VLLM; ++l)
    if (kv_layouts & KVP_LAYOUT_BIT(l)) b.layouts.push_back(l);
  if (b.dtypes.empty() || b.layouts.empty()) return {};
  b.shapes(grid);
  b.partition_edges(grid);
  if (grid == Grid::kFull) b.long_contexts();
  return std::move(b.cases);
}

namespace {

using FailFn = std::function<void(const char*, std::string)>;

// guard-zones: the floats on each side of `out` unchanged; inputs-unchanged: the host arrays
// (and a CUDA plug-in's device copies, read back) as they were given.
void check_guards_and_inputs(const KernelCase& c, const Inputs& in, const Inputs& pristine, Output& first, int64_t n,
                             const FailFn& fail) {
  int64_t before = 0, after = 0;
  for (int64_t i = 0; i < kGuardFloats; ++i) {
    before += float_bits(first.buffer[static_cast<std::size_t>(i)]) != kGuardBits ? 1 : 0;
    after += float_bits(first.buffer[static_cast<std::size_t>(kGuardFloats + n + i)]) != kGuardBits ? 1 : 0;
  }
  if (before + after > 0)
    fail("guard-zones", std::to_string(before) + " of the " + std::to_string(kGuardFloats) + " floats before out and " +
                            std::to_string(after) + " of those after it were written");
  std::vector<std::string> changed;
  if (in.k_pool != pristine.k_pool) changed.push_back(combined_pool(c.kv_layout) ? "the KV pool" : "the K pool");
  if (in.v_pool != pristine.v_pool) changed.push_back("the V pool");
  if (in.query != pristine.query) changed.push_back("query");
  if (in.block_tables != pristine.block_tables) changed.push_back("block_tables");
  if (in.positions != pristine.positions || in.token_seq != pristine.token_seq ||
      in.query_start != pristine.query_start || in.context_lens != pristine.context_lens)
    changed.push_back("the batch metadata");
  for (const std::string& name : first.inputs_changed)  // a CUDA plug-in's device copies
    if (std::find(changed.begin(), changed.end(), name) == changed.end()) changed.push_back(name);
  if (!changed.empty()) {
    std::string what;
    for (const std::string& s : changed) what += (what.empty() ? "" : ", ") + s;
    fail("inputs-unchanged", "run() wrote into its inputs: " + what);
  }
}

// no-poison-leak / finite-output: a non-finite value, and what it becomes with the poison at 0.
void check_non_finite(const kvp_attention_plugin& plugin, const KernelCase& c, const Inputs& in, const Inputs& pristine,
                      const float* out, int64_t n, const FailFn& fail) {
  const int64_t non_finite = count_non_finite(out, n);
  if (non_finite == 0) return;
  int64_t first_bad = 0;
  while (std::isfinite(out[first_bad])) ++first_bad;
  Inputs zero = pristine;
  fill_pool(c, zero, /*nan_poison=*/false);
  Output again = call_plugin(plugin, zero);
  const int64_t still = again.status == 0 ? count_non_finite(again.out(), n) : n;
  const std::string where = std::to_string(non_finite) + " non-finite output values, the first at " +
                            row_name(c, in, first_bad / c.head_dim) + " dim " + std::to_string(first_bad % c.head_dim);
  if (still == 0)
    fail("no-poison-leak", where +
                               "; with the poisoned (unused and padding) slots 0 instead of NaN every value is "
                               "finite: the kernel read a slot outside the context");
  else
    fail("finite-output", where + " from finite inputs (still " + std::to_string(still) +
                              " with the poison at 0): overflow, or 0/0 in the softmax");
}

// accuracy, on the finite rows: the worst error relative to its row's largest reference value.
void check_accuracy(const KernelCase& c, const Inputs& in, const std::vector<double>& ref, const float* out,
                    CaseResult& r, const FailFn& fail) {
  const int64_t row_len = c.head_dim;
  const int64_t n = static_cast<int64_t>(ref.size());
  double worst = 0.0;
  int64_t worst_row = -1;
  double worst_got = 0.0, worst_want = 0.0;
  for (int64_t row = 0; row * row_len < n; ++row) {
    double largest = 0.0, err = 0.0;
    bool finite = true;
    int64_t arg = 0;
    for (int64_t d = 0; d < row_len; ++d) {
      const std::size_t i = static_cast<std::size_t>(row * row_len + d);
      largest = std::max(largest, std::abs(ref[i]));
      if (!std::isfinite(out[i])) finite = false;
      const double e = std::abs(static_cast<double>(out[i]) - ref[i]);
      if (e > err) {
        err = e;
        arg = d;
      }
    }
    if (!finite) continue;
    const double rel = err / std::max(largest, 1e-30);
    r.max_error_ulps = std::max(r.max_error_ulps, err / ulp_of(largest, c.kv_dtype));
    if (rel > worst) {
      worst = rel;
      worst_row = row;
      worst_got = out[row * row_len + arg];
      worst_want = ref[static_cast<std::size_t>(row * row_len + arg)];
    }
  }
  r.max_rel_error = worst;
  if (worst > tolerance(c.kv_dtype)) {
    std::ostringstream o;
    o << "error " << worst << " relative to the row's largest reference value (tolerance " << tolerance(c.kv_dtype)
      << " for " << dtype_name(c.kv_dtype) << ") at " << row_name(c, in, worst_row) << ": got " << worst_got
      << ", fp64 reference " << worst_want;
    fail("accuracy", o.str());
  }
}

// batch-invariance: each sequence alone, bit for bit its rows in the batch.
void check_batch_invariance(const kvp_attention_plugin& plugin, const KernelCase& c, const Inputs& in, const float* out,
                            const FailFn& fail) {
  if (c.seqs.size() < 2) return;
  const int64_t row_len = c.head_dim;
  for (std::size_t s = 0; s < c.seqs.size(); ++s) {
    const int32_t t0 = in.query_start[s], t1 = in.query_start[s + 1];
    kvp_attention_shape alone = in.shape;
    alone.num_seqs = 1;
    alone.num_tokens = t1 - t0;
    alone.max_context_len = in.context_lens[s];
    const std::vector<int32_t> qs = {0, t1 - t0};
    const std::vector<int32_t> seq0(static_cast<std::size_t>(t1 - t0), 0);
    const int64_t offset = static_cast<int64_t>(t0) * c.num_heads * row_len;
    Output o = call_plugin(plugin, in, alone, in.query.data() + offset, qs.data(), seq0.data(),
                           in.positions.data() + t0, in.context_lens.data() + s,
                           in.block_tables.data() + s * static_cast<std::size_t>(in.shape.max_blocks_per_seq));
    const int64_t len = static_cast<int64_t>(t1 - t0) * c.num_heads * row_len;
    if (o.status != 0 || !same_bits(o.out(), out + offset, len)) {
      fail("batch-invariance", o.status != 0 ? "run() failed on sequence " + std::to_string(s) + " alone: " + o.error
                                             : "sequence " + std::to_string(s) + " (context " +
                                                   std::to_string(in.context_lens[s]) +
                                                   ") alone differs in its bits from the same sequence in the batch");
      return;
    }
  }
}

}  // namespace

CaseResult run_case(const kvp_attention_plugin& plugin, const KernelCase& c) {
  const auto start = Clock::now();
  CaseResult r;
  const FailFn fail = [&r](const char* property, std::string message) {
    r.failures.push_back({property, std::move(message)});
  };
  Inputs in = make_inputs(c);
  if (plugin.supports != nullptr && plugin.supports(&in.shape) == 0) {
    r.skipped = true;
    return r;
  }
  fill_pool(c, in, /*nan_poison=*/true);
  const Inputs pristine = in;
  const std::vector<double> ref = reference_attention(c, in);
  const int64_t n = static_cast<int64_t>(ref.size());

  Output first = call_plugin(plugin, in);
  if (first.status != 0) {
    fail("run-error",
         "supports() accepted the shape but run() returned " + std::to_string(first.status) + ": " + first.error);
    r.seconds = seconds_since(start);
    return r;
  }
  check_guards_and_inputs(c, in, pristine, first, n, fail);
  check_non_finite(plugin, c, in, pristine, first.out(), n, fail);
  check_accuracy(c, in, ref, first.out(), r, fail);
  Output second = call_plugin(plugin, in);
  if (second.status != 0 || !same_bits(first.out(), second.out(), n))
    fail("repeatability", second.status != 0 ? "the second run() failed: " + second.error
                                             : "the same batch run twice gave different bits");
  check_batch_invariance(plugin, c, in, first.out(), fail);
  r.seconds = seconds_since(start);
  return r;
}

namespace {

nlohmann::json result_to_json(const CaseResult& r) {
  nlohmann::json failures = nlohmann::json::array();
  for (const Failure& f : r.failures) failures.push_back({{"property", f.property}, {"message", f.message}});
  return {{"status", r.skipped    ? "skip"
                     : r.passed() ? "pass"
                                  : "fail"},
          {"failures", failures},
          {"max_rel_error", r.max_rel_error},
          {"max_error_ulps", r.max_error_ulps},
          {"seconds", r.seconds}};
}

CaseResult result_from_json(const nlohmann::json& j) {
  CaseResult r;
  r.skipped = j.at("status") == "skip";
  for (const auto& f : j.at("failures"))
    r.failures.push_back({f.at("property").get<std::string>(), f.at("message").get<std::string>()});
  r.max_rel_error = j.at("max_rel_error");
  r.max_error_ulps = j.at("max_error_ulps");
  r.seconds = j.at("seconds");
  return r;
}

}  // namespace

CaseResult run_case_isolated(const kvp_attention_plugin& plugin, const KernelCase& c, double timeout_s) {
  const auto start = Clock::now();
  CaseResult r;
  int fds[2];
  if (pipe(fds) != 0) {
    r.failures.push_back({"crash", std::string("pipe() failed: ") + std::strerror(errno)});
    return r;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    r.failures.push_back({"crash", std::string("fork() failed: ") + std::strerror(errno)});
    return r;
  }
  if (pid == 0) {
    close(fds[0]);
    // The kernel's fault is reported as its signal, not through a sanitizer's handler.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, SIG_DFL);
    const std::string text = result_to_json(run_case(plugin, c)).dump();
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t w = write(fds[1], text.data() + done, text.size() - done);
      if (w <= 0) break;
      done += static_cast<std::size_t>(w);
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    const double left = timeout_s - seconds_since(start);
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t got = read(fds[0], buf, sizeof buf);
    if (got <= 0) break;  // EOF: the child is done (or died)
    text.append(buf, static_cast<std::size_t>(got));
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    r.failures.push_back({"timeout", "the case ran past its time limit of " + std::to_string(timeout_s) +
                                         " s (killed; --timeout sets the limit)"});
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    r.failures.push_back({"crash", "the kernel's process died by signal " + std::to_string(sig) + " (" +
                                       std::string(strsignal(sig)) + ")"});
  } else {
    try {
      r = result_from_json(nlohmann::json::parse(text));
    } catch (const std::exception&) {
      r = CaseResult{};
      r.failures.push_back({"crash", "the kernel's process exited with status " +
                                         std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                                         " without a result"});
    }
  }
  r.seconds = seconds_since(start);
  return r;
}

int64_t Report::num_failed() const {
  return std::count_if(cases.begin(), cases.end(), [](const CaseRecord& c) { return !c.result.passed(); });
}
int64_t Report::num_skipped() const {
  return std::count_if(cases.begin(), cases.end(), [](const CaseRecord& c) { return c.result.skipped; });
}

nlohmann::json Report::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  std::map<std::string, int64_t> by_property;
  double worst[3] = {0, 0, 0};
  for (const CaseRecord& c : cases) {
    nlohmann::json j = c.spec.to_json();
    j.update(result_to_json(c.result));
    j["reproduce"] = c.reproduce;
    list.push_back(j);
    std::set<std::string> seen;
    for (const Failure& f : c.result.failures)
      if (seen.insert(f.property).second) ++by_property[f.property];
    if (c.spec.kv_dtype >= 0 && c.spec.kv_dtype < 3)
      worst[c.spec.kv_dtype] = std::max(worst[c.spec.kv_dtype], c.result.max_rel_error);
  }
  nlohmann::json failed = nlohmann::json::object();
  for (const auto& [p, k] : by_property) failed[p] = k;
  const int64_t n = static_cast<int64_t>(cases.size());
  return {
      {"schema", "kvproof.kernel-check"},
      {"version", 1},
      {"plugin", {{"path", plugin_path}, {"name", plugin_name}}},
      {"grid", grid_name(grid)},
      {"shard", {{"index", shard_index}, {"count", shard_count}}},
      {"tolerance", {{"f32", tolerance(KVP_KV_F32)}, {"f16", tolerance(KVP_KV_F16)}, {"bf16", tolerance(KVP_KV_BF16)}}},
      {"max_rel_error", {{"f32", worst[0]}, {"f16", worst[1]}, {"bf16", worst[2]}}},
      {"summary",
       {{"cases", n},
        {"passed", n - num_failed() - num_skipped()},
        {"failed", num_failed()},
        {"skipped", num_skipped()},
        {"failed_by_property", failed},
        {"seconds", seconds}}},
      {"verdict", passed() ? "pass" : "fail"},
      {"cases", list}};
}

std::string Report::to_junit() const {
  std::vector<JUnitCase> list;
  for (const CaseRecord& c : cases) {
    JUnitCase j;
    j.name = "case " + std::to_string(c.spec.id) + " " + c.spec.label;
    if (!c.result.passed()) {
      std::string message;
      for (const Failure& f : c.result.failures) message += f.property + ": " + f.message + "\n";
      j.failure = message;
      j.system_out = c.spec.describe() + "\nre-run alone: " + c.reproduce + "\n";
    }
    list.push_back(std::move(j));
  }
  return junit_xml("kernel-check " + plugin_name, list);
}

std::string Report::summary() const {
  std::ostringstream o;
  std::map<std::string, int64_t> by_property;
  for (const CaseRecord& c : cases) {
    if (c.result.passed()) continue;
    o << "FAIL " << c.spec.describe() << "\n";
    std::set<std::string> seen;
    for (const Failure& f : c.result.failures) {
      o << "  " << f.property << ": " << f.message << "\n";
      if (seen.insert(f.property).second) ++by_property[f.property];
    }
    o << "  re-run alone: " << c.reproduce << "\n";
  }
  const int64_t n = static_cast<int64_t>(cases.size());
  o << "kernel-check " << plugin_name << " (" << plugin_path << "), grid " << grid_name(grid);
  if (shard_count > 1) o << " shard " << shard_index << "/" << shard_count;
  o << ": " << n << " cases, " << (n - num_failed() - num_skipped()) << " passed, " << num_failed() << " failed, "
    << num_skipped() << " skipped (declined by supports()) in " << seconds << " s\n";
  for (const auto& [p, k] : by_property) o << "  " << p << ": " << k << " cases\n";
  if (num_failed() == 0 && !passed()) o << "nothing was checked: supports() declined every case\n";
  o << (passed() ? "PASS" : "FAIL") << "\n";
  return o.str();
}

Summary Report::to_summary(std::string reproducer) const {
  static const char* const kProperties[] = {
      "accuracy",         "no-poison-leak", "finite-output", "guard-zones", "inputs-unchanged",
      "batch-invariance", "repeatability",  "run-error",     "crash",       "timeout"};
  Summary s;
  s.title = "kvproof kernel-check";
  s.passed = passed();
  s.reproducer = std::move(reproducer);
  const int64_t n = static_cast<int64_t>(cases.size()), ran = n - num_skipped();
  s.verdict_detail = std::to_string(n) + " cases: " + std::to_string(ran - num_failed()) + " passed, " +
                     std::to_string(num_failed()) + " failed, " + std::to_string(num_skipped()) +
                     " skipped (declined by supports())" + (ran == 0 ? "; nothing was checked" : "");
  s.context = {"plug-in " + plugin_name + " (" + plugin_path + "), grid " + grid_name(grid) +
               (shard_count > 1 ? ", shard " + std::to_string(shard_index) + "/" + std::to_string(shard_count) : "")};
  s.rows_title = "Properties";
  s.columns = {"cases failed", "cases run"};
  double worst = 0.0;
  for (const CaseRecord& c : cases) worst = std::max(worst, c.result.max_rel_error);
  for (const char* property : kProperties) {
    int64_t failed = 0;
    const CaseRecord* first = nullptr;
    std::string message;
    for (const CaseRecord& c : cases) {
      for (const Failure& f : c.result.failures) {
        if (f.property != property) continue;
        if (first == nullptr) {
          first = &c;
          message = "case " + std::to_string(c.spec.id) + ": " + f.message;
        }
        ++failed;
        break;
      }
    }
    std::string detail = message;
    if (detail.empty() && std::string(property) == "accuracy" && ran > 0) {
      std::ostringstream o;
      o << "worst error " << worst << " of the row's largest reference value";
      detail = o.str();
    }
    s.rows.push_back({property,
                      failed > 0 ? "FAIL"
                      : ran > 0  ? "PASS"
                                 : "n/a",
                      {std::to_string(failed), std::to_string(ran)},
                      detail,
                      first != nullptr ? first->reproduce : ""});
  }
  constexpr int kShown = 20;
  int shown = 0;
  for (const CaseRecord& c : cases) {
    if (c.result.passed() || shown++ >= kShown) continue;
    std::string what;
    for (const Failure& f : c.result.failures) what += (what.empty() ? "" : ", ") + f.property;
    s.notes.push_back("FAIL " + c.spec.describe() + " (" + what + "): " + c.reproduce);
  }
  if (shown > kShown) s.notes.push_back(std::to_string(shown - kShown) + " more failing cases: see the JSON report");
  return s;
}

Result<Report> run_kernel_check(const AttentionPlugin& plugin, const Options& options,
                                const std::function<void(const CaseRecord&)>& on_case) {
  const kvp_attention_plugin& d = plugin.descriptor();
  if (d.device == KVP_DEVICE_CUDA) {
    // Without isolation the cases run here, so the probe may too; with it, a child probes, so
    // that this process never initialises CUDA and its per-case children can.
    std::string why;
    if (!options.isolate) {
      const CudaRuntime* rt = CudaRuntime::shared(why);
      if (rt != nullptr) why = rt->check_device();
    } else {
      why = probe_device_in_child();
    }
    if (!why.empty())
      return Status::error("attention plug-in " + plugin.path() + " (" + plugin.name() + ") runs on CUDA: " + why);
  }
  if (options.shard_count < 1 || options.shard_index < 0 || options.shard_index >= options.shard_count)
    return Status::error("--shard " + std::to_string(options.shard_index) + "/" + std::to_string(options.shard_count) +
                         ": want I/N with 0 <= I < N");
  const std::vector<KernelCase> grid = make_grid(options.grid, d.kv_dtypes, d.kv_layouts);
  if (options.case_id && (*options.case_id < 0 || *options.case_id >= static_cast<int64_t>(grid.size())))
    return Status::error("--case " + std::to_string(*options.case_id) + ": the " + grid_name(options.grid) +
                         " grid for this plug-in has cases 0.." + std::to_string(grid.size() - 1));
  const auto start = Clock::now();
  Report report;
  report.plugin_path = plugin.path();
  report.plugin_name = plugin.name();
  report.grid = options.grid;
  report.shard_index = options.shard_index;
  report.shard_count = options.shard_count;
  for (const KernelCase& c : grid) {
    if (options.case_id ? c.id != *options.case_id : shard_of(c.id, options.shard_count) != options.shard_index)
      continue;
    CaseRecord record;
    record.spec = c;
    record.result = options.isolate ? run_case_isolated(d, c, options.timeout_s) : run_case(d, c);
    record.reproduce = "kvproof kernel-check --plugin " + plugin.path() + " --grid " + grid_name(options.grid) +
                       " --case " + std::to_string(c.id);
    if (on_case) on_case(record);
    report.cases.push_back(std::move(record));
    if (options.max_failures > 0 && report.num_failed() >= options.max_failures) break;
  }
  report.seconds = seconds_since(start);
  return report;
}

Result<nlohmann::json> merge_reports(const std::vector<nlohmann::json>& reports) {
  if (reports.empty()) return Status::error("--merge: no reports");
  try {
    const nlohmann::json& first = reports.front();
    const int64_t count = first.at("shard").at("count");
    std::set<int64_t> shards;
    nlohmann::json cases = nlohmann::json::array();
    std::map<std::string, int64_t> by_property;
    int64_t failed = 0, skipped = 0;
    double seconds = 0.0;
    for (std::size_t i = 0; i < reports.size(); ++i) {
      const nlohmann::json& r = reports[i];
      auto bad = [&](const std::string& why) { return Status::error("report " + std::to_string(i + 1) + ": " + why); };
      if (r.at("schema") != "kvproof.kernel-check" || r.at("version") != 1) return bad("not a kernel-check v1 report");
      if (r.at("plugin").at("name") != first.at("plugin").at("name"))
        return bad("plug-in " + r.at("plugin").at("name").get<std::string>() + ", the first report's is " +
                   first.at("plugin").at("name").get<std::string>());
      if (r.at("grid") != first.at("grid")) return bad("another grid than the first report's");
      if (r.at("shard").at("count") != count) return bad("a shard of another count than the first report's");
      const int64_t index = r.at("shard").at("index");
      if (!shards.insert(index).second) return bad("shard " + std::to_string(index) + " given twice");
      for (const auto& c : r.at("cases")) {
        cases.push_back(c);
        if (c.at("status") == "fail") ++failed;
        if (c.at("status") == "skip") ++skipped;
        std::set<std::string> seen;
        for (const auto& f : c.at("failures"))
          if (seen.insert(f.at("property").get<std::string>()).second)
            ++by_property[f.at("property").get<std::string>()];
      }
      seconds += r.at("summary").at("seconds").get<double>();
    }
    std::string missing;
    for (int64_t s = 0; s < count; ++s)
      if (!shards.count(s)) missing += (missing.empty() ? "" : ", ") + std::to_string(s);
    if (!missing.empty()) return Status::error("--merge: shards missing: " + missing + " of " + std::to_string(count));
    std::sort(cases.begin(), cases.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a.at("id").get<int64_t>() < b.at("id").get<int64_t>();
    });
    nlohmann::json failed_by = nlohmann::json::object();
    for (const auto& [p, k] : by_property) failed_by[p] = k;
    nlohmann::json merged = first;
    merged["shard"] = {{"index", 0}, {"count", 1}, {"merged_from", count}};
    merged["cases"] = cases;
    const int64_t n = static_cast<int64_t>(cases.size());
    merged["summary"] = {{"cases", n},         {"passed", n - failed - skipped},  {"failed", failed},
                         {"skipped", skipped}, {"failed_by_property", failed_by}, {"seconds", seconds}};
    merged["verdict"] = failed == 0 && skipped < n ? "pass" : "fail";
    merged.erase("max_rel_error");
    return merged;
  } catch (const nlohmann::json::exception& e) {
    return Status::error(std::string("--merge: malformed report: ") + e.what());
  }
}

}  // namespace kvp::verify::kernel_check
