#include "kernel_check/case_run.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "common/dtype.h"
#include "common/rng.h"
#include "kernel_check/cuda_runtime.h"

namespace kvp::verify::kernel_check {

// ---- inputs ----------------------------------------------------------------------------

namespace {

float fp8_decode(int32_t dtype, uint8_t code) {
  return dtype == KVP_KV_FP8_E4M3 ? fp8_e4m3_to_float(code) : fp8_e5m2_to_float(code);
}
uint8_t fp8_encode(int32_t dtype, float x) {
  return dtype == KVP_KV_FP8_E4M3 ? float_to_fp8_e4m3(x) : float_to_fp8_e5m2(x);
}

// Rounds x to the KV dtype (so that the dense K/V the reference reads are the pool's values);
// fp8: to code * scale, the value the pool means (scale a power of two: exact).
float round_to_dtype(float x, int32_t dtype, float scale = 1.0f) {
  if (dtype == KVP_KV_F16) return f16_to_float(float_to_f16(x));
  if (dtype == KVP_KV_BF16) return bf16_to_float(float_to_bf16(x));
  if (is_fp8_dtype(dtype)) return fp8_decode(dtype, fp8_encode(dtype, x / scale)) * scale;
  return x;
}

void store_element(uint8_t* pool, int64_t index, int32_t dtype, float x, float scale = 1.0f) {
  if (dtype == KVP_KV_F32) {
    std::memcpy(pool + index * 4, &x, 4);
  } else if (is_fp8_dtype(dtype)) {
    pool[index] = fp8_encode(dtype, x / scale);
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
    default: {  // vLLM: K [nb][H][D/x][bs][x], V [nb][H][D][bs] (x = 16 / element bytes)
      const int64_t x = 16 / element_size(c.kv_dtype);
      if (is_value) return ((block * nh + head) * hd + d) * bs + offset;
      return (((block * nh + head) * (hd / x) + d / x) * bs + offset) * x + d % x;
    }
  }
}

}  // namespace

bool combined_pool(int32_t layout) {
  return layout == KVP_LAYOUT_FLASHINFER_NHD || layout == KVP_LAYOUT_FLASHINFER_HND;
}

namespace {

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
  in.scale = c.scale > 0.0f ? c.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));

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
    in.dead_entries.push_back(
        static_cast<int32_t>(first_visible(spec.context_len - spec.num_new, c.window) / c.block_size));
    in.context_lens.push_back(spec.context_len);
    for (int32_t i = spec.context_len - spec.num_new; i < spec.context_len; ++i) {
      in.token_seq.push_back(static_cast<int32_t>(s));
      in.positions.push_back(i);
    }
    in.query_start.push_back(static_cast<int32_t>(in.token_seq.size()));
  }
  // A window's dead entries all name one block that no table holds (the pool has at least 3
  // spare), left NaN: a kernel that reads them instead of skipping them reads NaN. The blocks
  // dealt to them stay unused (NaN too).
  in.window = c.window;
  in.softcap = c.softcap;
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int32_t j = 0; j < in.dead_entries[static_cast<std::size_t>(s)]; ++j)
      in.block_tables[static_cast<std::size_t>(s * stride + j)] = ids[next];
}

// Dense K/V per sequence, rounded to the KV dtype, and the queries; all-equal scores copy the
// first position's keys everywhere.
void draw_values(const KernelCase& c, Rng& rng, Inputs& in) {
  const int64_t kvh = c.num_kv_heads, hd = c.head_dim;
  if (is_fp8_dtype(c.kv_dtype)) {
    for (int64_t g = 0; g < kvh; ++g) {
      in.k_scales.push_back(std::ldexp(1.0f, static_cast<int>(2 - 3 * (g % 3))));   // 4, 1/2, 1/16
      in.v_scales.push_back(std::ldexp(1.0f, static_cast<int>(-3 + 2 * (g % 3))));  // 1/8, 1/2, 2
    }
  }
  const auto k_scale = [&](std::size_t i) { return in.k_scales.empty() ? 1.0f : in.k_scales[i / hd % kvh]; };
  const auto v_scale = [&](std::size_t i) { return in.v_scales.empty() ? 1.0f : in.v_scales[i / hd % kvh]; };
  for (const SeqSpec& spec : c.seqs) {
    const std::size_t n = static_cast<std::size_t>(spec.context_len * kvh * hd);
    std::vector<float> k(n), v(n);
    for (std::size_t i = 0; i < n; ++i)
      k[i] = round_to_dtype(static_cast<float>(rng.uniform(-1.0, 1.0)), c.kv_dtype, k_scale(i));
    for (std::size_t i = 0; i < n; ++i)
      v[i] = round_to_dtype(static_cast<float>(rng.uniform(-1.0, 1.0)), c.kv_dtype, v_scale(i));
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
    // With a window, one position before the first new token's window (it is before every
    // later token's too): a kernel that sees one position too many is far off.
    const int64_t first = first_visible(in.positions[static_cast<std::size_t>(t0)], c.window);
    const int64_t drawn =
        static_cast<int64_t>(rng.below(static_cast<uint64_t>(in.positions[static_cast<std::size_t>(t0)] + 1)));
    const int64_t j = first > 0 ? first - 1 : drawn;
    for (int64_t g = 0; g < kvh; ++g) {
      const float* q = in.query.data() + (t0 * c.num_heads + g * group) * hd;
      double norm2 = 0.0;
      for (int64_t d = 0; d < hd; ++d) norm2 += static_cast<double>(q[d]) * q[d];
      const double factor = 30.0 / (in.scale * norm2);
      float* k = in.k_dense[static_cast<std::size_t>(s)].data() + (j * kvh + g) * hd;
      const float ks = in.k_scales.empty() ? 1.0f : in.k_scales[static_cast<std::size_t>(g)];
      for (int64_t d = 0; d < hd; ++d) k[d] = round_to_dtype(static_cast<float>(factor * q[d]), c.kv_dtype, ks);
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
      const int64_t p = in.positions[static_cast<std::size_t>(t)];
      for (int64_t j = first_visible(p, c.window); j <= p; ++j) {
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

}  // namespace

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
    for (int64_t j = static_cast<int64_t>(in.dead_entries[s]) * c.block_size; j < c.seqs[s].context_len; ++j) {
      const int64_t block =
          in.block_tables[s * static_cast<std::size_t>(stride) + static_cast<std::size_t>(j / c.block_size)];
      for (int64_t g = 0; g < c.num_kv_heads; ++g) {
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const std::size_t dense = static_cast<std::size_t>((j * c.num_kv_heads + g) * c.head_dim + d);
          const auto gi = static_cast<std::size_t>(g);
          store_element(k_base, layout_index(c, false, block, j % c.block_size, g, d), c.kv_dtype, in.k_dense[s][dense],
                        in.k_scales.empty() ? 1.0f : in.k_scales[gi]);
          store_element(v_base, layout_index(c, true, block, j % c.block_size, g, d), c.kv_dtype, in.v_dense[s][dense],
                        in.v_scales.empty() ? 1.0f : in.v_scales[gi]);
        }
      }
    }
  }
}

// ---- the fp64 reference: softmax(cap(scale * q K^T)) V on the dense K/V, over the window --

std::vector<double> reference_attention(const KernelCase& c, const Inputs& in) {
  const int64_t hd = c.head_dim, kvh = c.num_kv_heads, group = c.num_heads / c.num_kv_heads;
  const int64_t num_tokens = in.shape.num_tokens;
  std::vector<double> out(static_cast<std::size_t>(num_tokens * c.num_heads * hd), 0.0);
  std::vector<double> scores;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const std::vector<float>& k = in.k_dense[static_cast<std::size_t>(in.token_seq[static_cast<std::size_t>(t)])];
    const std::vector<float>& v = in.v_dense[static_cast<std::size_t>(in.token_seq[static_cast<std::size_t>(t)])];
    const int64_t n = in.positions[static_cast<std::size_t>(t)] + 1;
    const int64_t first = first_visible(n - 1, c.window);  // the window: positions first..n-1
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const float* q = in.query.data() + (t * c.num_heads + h) * hd;
      const int64_t g = h / group;
      scores.assign(static_cast<std::size_t>(n), 0.0);
      double largest = -INFINITY;
      for (int64_t j = first; j < n; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < hd; ++d)
          dot += static_cast<double>(q[d]) * k[static_cast<std::size_t>((j * kvh + g) * hd + d)];
        double score = dot * static_cast<double>(in.scale);
        if (in.softcap > 0.0f) score = in.softcap * std::tanh(score / in.softcap);
        scores[static_cast<std::size_t>(j)] = score;
        largest = std::max(largest, scores[static_cast<std::size_t>(j)]);
      }
      double sum = 0.0;
      double* row = out.data() + (t * c.num_heads + h) * hd;
      for (int64_t j = first; j < n; ++j) {
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

namespace {

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
      {in.k_scales.data(), in.k_scales.size() * sizeof(float), "k_scale"},
      {in.v_scales.data(), in.v_scales.size() * sizeof(float), "v_scale"},
      {o.buffer.data(), o.buffer.size() * sizeof(float), "out"},
  };
  const std::size_t out_i = arrays.size() - 1;
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
    if (args.k_scale != nullptr) {
      args.k_scale = static_cast<const float*>(arrays[8].device);
      args.v_scale = static_cast<const float*>(arrays[9].device);
    }
    args.out = static_cast<float*>(arrays[out_i].device) + kGuardFloats;
    args.stream = stream;
    char err[4096] = {};
    o.status = plugin.run(&args, err, sizeof err);
    if (o.status != 0) o.error = err[0] != '\0' ? std::string(err, strnlen(err, sizeof err)) : "(no message)";
    if (std::string e = rt.stream_synchronize(stream); !e.empty())
      return fail("the kernel's stream reported an error after run() returned " + std::to_string(o.status) + ": " + e);
    if (std::string e = rt.to_host(o.buffer.data(), arrays[out_i].device, arrays[out_i].bytes); !e.empty())
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

}  // namespace

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
  args.k_scale = in.k_scales.empty() ? nullptr : in.k_scales.data();
  args.v_scale = in.v_scales.empty() ? nullptr : in.v_scales.data();
  args.window = plugin.abi_version >= 3 ? in.window : 0;   // a case with a window reaches only version 3
  if (plugin.abi_version >= 4) args.softcap = in.softcap;  // a soft-capped case reaches only version 4
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
  char err[4096] = {};
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
  const int mantissa = dtype == KVP_KV_F32        ? 23
                       : dtype == KVP_KV_F16      ? 10
                       : dtype == KVP_KV_BF16     ? 7
                       : dtype == KVP_KV_FP8_E4M3 ? 3
                                                  : 2;
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

}  // namespace kvp::verify::kernel_check
