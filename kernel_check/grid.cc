// The grid: every case kernel-check runs, and the names, tolerances and shards that describe it.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/rng.h"
#include "kernel_check/case_run.h"

namespace kvp::verify::kernel_check {

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
  switch (kv_dtype) {
    case KVP_KV_F32: return "f32";
    case KVP_KV_F16: return "f16";
    case KVP_KV_BF16: return "bf16";
    case KVP_KV_FP8_E4M3: return "fp8-e4m3";
    case KVP_KV_FP8_E5M2: return "fp8-e5m2";
  }
  return "?";
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
    // The fp8 values are exact inputs too (code * a power-of-two scale); bf16's room, for a
    // kernel that dequantises to bf16 and rounds P or V there.
    case KVP_KV_FP8_E4M3:
    case KVP_KV_FP8_E5M2: return 1.6e-2;
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
    << input_kind_name(kind);
  if (window > 0) o << " window " << window;
  if (scale > 0.0f) o << " scale " << scale;
  if (softcap > 0.0f) o << " softcap " << softcap;
  o << " seqs";
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
          {"window", window},
          {"scale", scale},
          {"softcap", softcap},
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

  // Sliding windows (ABI version 3): for each block size, a window smaller than a block (half
  // of one; 1 when blocks are 1 slot), one block exactly and two blocks and three slots, each
  // over decode rows at the window's edges, a context many windows long and a prefill chunk
  // longer than the window (each of its tokens sees another window), once with random inputs
  // and once with a dominant key one position before the window (an off-by-one includes it and
  // is far off). Then windows across kvproof's 128-position partitions, Gemma 3's 512 and
  // Mistral 7B's 4096 over contexts past them.
  void windows(Grid grid) {
    const std::vector<int32_t> block_sizes = grid == Grid::kQuick
                                                 ? std::vector<int32_t>{1, 16, 3, 64, 17}
                                                 : std::vector<int32_t>{1, 2, 3, 8, 15, 16, 17, 32, 64, 128, 256};
    std::size_t rotation = 0;
    for (const int32_t bs : block_sizes) {
      for (const int32_t w : {std::max<int32_t>(1, bs / 2), bs, 2 * bs + 3}) {
        for (const InputKind kind : {InputKind::kRandom, InputKind::kDominant}) {
          const std::size_t full_dtypes = grid == Grid::kQuick ? 1 : dtypes.size();
          for (std::size_t di = 0; di < full_dtypes; ++di, ++rotation) {
            KernelCase c;
            c.label = w < bs ? "window-below-block" : w == bs ? "window-one-block" : "window-over-blocks";
            c.kind = kind;
            c.window = w;
            const GridHeads& h = kGridHeads[rotation % kGridHeads.size()];
            c.num_heads = h.q;
            c.num_kv_heads = h.kv;
            c.head_dim = kGridHeadDims[rotation % kGridHeadDims.size()];
            c.block_size = bs;
            c.kv_dtype = dtypes[(rotation + di) % dtypes.size()];
            c.kv_layout = layouts[rotation % layouts.size()];
            const int32_t chunk = std::min(w + 3, 12);
            c.seqs = {{1, 1}, {w, 1}, {w + 1, 1}, {5 * w + bs + 1, 1}, {3 * w + 2 * bs + chunk, chunk}};
            add(std::move(c));
          }
        }
      }
    }
    struct Long {
      int32_t window, block_size;
      std::vector<SeqSpec> seqs;
    };
    const std::vector<Long> longs = {{128, 16, {{127, 1}, {129, 1}, {257, 1}, {300 + 5, 5}}},
                                     {200, 32, {{1000, 1}, {385, 1}, {600 + 9, 9}}},
                                     {512, 16, {{513, 1}, {4097, 1}, {2048 + 8, 8}}},
                                     {4096, 16, {{4095, 1}, {4097, 1}, {12289, 1}}}};
    for (std::size_t i = 0; i < longs.size(); ++i) {
      KernelCase c;
      c.label = "window-long";
      c.kind = i % 2 == 0 ? InputKind::kDominant : InputKind::kRandom;
      c.window = longs[i].window;
      c.num_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim = i % 2 == 0 ? 128 : 64;
      c.block_size = longs[i].block_size;
      c.kv_dtype = dtypes[i % dtypes.size()];
      c.kv_layout = layouts[i % layouts.size()];
      c.seqs = longs[i].seqs;
      add(std::move(c));
    }
  }

  // Score scales other than 1 / sqrt(head_dim), for every plug-in (the ABI has passed the scale
  // since version 1): Gemma 2 27B's query_pre_attn_scalar 144 over head_dim 128 (1/12 against
  // 1/11.3), Gemma 3 27B's 168, and scales 8 times larger and smaller than the default, over
  // decode rows and a prefill chunk, random and with a dominant key. A kernel that computes
  // 1 / sqrt(head_dim) itself fails accuracy.
  void scales(Grid grid) {
    struct Scaled {
      int32_t head_dim;
      float scale;
    };
    const std::vector<Scaled> scaled = {
        {128, 1.0f / 12.0f}, {128, static_cast<float>(1.0 / std::sqrt(168.0))}, {64, 1.0f}, {256, 1.0f / 128.0f}};
    std::size_t rotation = 0;
    for (const Scaled& sc : scaled) {
      for (const InputKind kind : {InputKind::kRandom, InputKind::kDominant}) {
        const std::size_t n_dtypes = grid == Grid::kQuick ? 1 : dtypes.size();
        for (std::size_t di = 0; di < n_dtypes; ++di, ++rotation) {
          KernelCase c;
          c.label = "scale";
          c.kind = kind;
          c.scale = sc.scale;
          const GridHeads& h = kGridHeads[(rotation + 1) % kGridHeads.size()];
          c.num_heads = h.q;
          c.num_kv_heads = h.kv;
          c.head_dim = sc.head_dim;
          c.block_size = 16;
          c.kv_dtype = dtypes[(rotation + di) % dtypes.size()];
          c.kv_layout = layouts[rotation % layouts.size()];
          c.seqs = {{1, 1}, {17, 1}, {40 + 9, 9}};
          add(std::move(c));
        }
      }
    }
  }

  // Soft-capped scores (ABI version 4): Gemma 2's cap of 50 on scores driven past it
  // (large-scores: up to 120, where an uncapped kernel puts all the weight on one position) and
  // on random ones, a cap of 5 where tanh bends every score, with Gemma 2's scale
  // (query_pre_attn_scalar 256 over head_dim 256) and a scale far from 1 (so that capping
  // before scaling is far off), and the cap with a sliding window (Gemma 2's layers have both)
  // when the plug-in has one.
  void softcaps(Grid grid, bool windows) {
    struct Capped {
      float cap, scale;
      int32_t head_dim;
      InputKind kind;
      int32_t window;
    };
    std::vector<Capped> capped = {{50.0f, 1.0f / 16.0f, 256, InputKind::kLargeScores, 0},
                                  {50.0f, 0.0f, 128, InputKind::kRandom, 0},
                                  {5.0f, 2.0f, 64, InputKind::kRandom, 0},
                                  {5.0f, 0.0f, 64, InputKind::kDominant, 0},
                                  {5.0f, 0.0f, 128, InputKind::kEqualScores, 0},
                                  {30.0f, 0.5f, 96, InputKind::kLargeScores, 0}};
    if (windows) {
      capped.push_back({50.0f, 1.0f / 16.0f, 256, InputKind::kLargeScores, 35});
      capped.push_back({5.0f, 2.0f, 64, InputKind::kDominant, 16});
    }
    std::size_t rotation = 0;
    for (const Capped& cp : capped) {
      const std::size_t n_dtypes = grid == Grid::kQuick ? 1 : dtypes.size();
      for (std::size_t di = 0; di < n_dtypes; ++di, ++rotation) {
        KernelCase c;
        c.label = cp.window > 0 ? "softcap-window" : "softcap";
        c.kind = cp.kind;
        c.softcap = cp.cap;
        c.scale = cp.scale;
        c.window = cp.window;
        const GridHeads& h = kGridHeads[(rotation + 2) % kGridHeads.size()];
        c.num_heads = h.q;
        c.num_kv_heads = h.kv;
        c.head_dim = cp.head_dim;
        c.block_size = rotation % 2 == 0 ? 16 : 3;
        c.kv_dtype = dtypes[(rotation + di) % dtypes.size()];
        c.kv_layout = layouts[rotation % layouts.size()];
        c.seqs = {{1, 1}, {c.block_size + 1, 1}, {100, 1}, {60 + 11, 11}};
        add(std::move(c));
      }
    }
  }

  // One reduction over more than 100k positions (a decode row at 131,073: one past 2^17),
  // where a kernel's accumulation shows what short contexts hide (docs/fp8.md): quick, in the
  // plug-in's last (narrowest) dtype; full, in every dtype. Added last, so the cases before
  // keep their ids.
  void long_reductions(Grid grid) {
    const std::size_t first = grid == Grid::kQuick ? dtypes.size() - 1 : 0;
    for (std::size_t i = first; i < dtypes.size(); ++i) {
      KernelCase c;
      c.label = "long-reduction";
      c.num_heads = 4;
      c.num_kv_heads = 1;
      c.head_dim = 64;
      c.block_size = 16;
      c.kv_dtype = dtypes[i];
      c.kv_layout = layouts[i % layouts.size()];
      c.seqs = {{131073, 1}};
      add(c);
    }
  }
};

}  // namespace

bool has_window(const kvp_attention_plugin& plugin) {
  return plugin.abi_version >= 3 && plugin.supports_window != nullptr;
}

bool has_softcap(const kvp_attention_plugin& plugin) {
  return plugin.abi_version >= 4 && plugin.supports_softcap != nullptr;
}

bool plugin_takes(const kvp_attention_plugin& plugin, const KernelCase& c, const kvp_attention_shape& shape) {
  if (plugin.supports != nullptr && plugin.supports(&shape) == 0) return false;
  if (c.window > 0 && (!has_window(plugin) || plugin.supports_window(&shape, c.window) == 0)) return false;
  if (c.softcap > 0.0f && (!has_softcap(plugin) || plugin.supports_softcap(&shape, c.softcap) == 0)) return false;
  return true;
}

std::vector<KernelCase> make_grid(Grid grid, uint32_t kv_dtypes, uint32_t kv_layouts, bool windows, bool softcaps) {
  GridBuilder b;
  for (int32_t d = KVP_KV_F32; d <= KVP_KV_FP8_E5M2; ++d)
    if (kv_dtypes & KVP_DTYPE_BIT(d)) b.dtypes.push_back(d);
  for (int32_t l = KVP_LAYOUT_KVPROOF; l <= KVP_LAYOUT_VLLM; ++l)
    if (kv_layouts & KVP_LAYOUT_BIT(l)) b.layouts.push_back(l);
  if (b.dtypes.empty() || b.layouts.empty()) return {};
  b.shapes(grid);
  b.partition_edges(grid);
  if (grid == Grid::kFull) b.long_contexts();
  b.long_reductions(grid);
  b.scales(grid);
  if (windows) b.windows(grid);
  if (softcaps) b.softcaps(grid, windows);
  return std::move(b.cases);
}

}  // namespace kvp::verify::kernel_check
