"""A paged-attention kernel in Triton (device only), for
`kvproof kernel-check --plugin python:plugins/python/triton_paged_decode.py:paged_attention` on a
machine with a GPU, torch and triton (scripts/gpu-check.sh runs it when they import).

NOT YET RUN: written on 2026-12-06 in a session without a GPU (the sliding window and the
soft-cap on 2026-12-07, also without one); the first device run is its first test. The plumbing it relies on (the Python adapter's __cuda_array_interface__ arrays)
is tested without a GPU by tests/data/python_kernels/cai_on_host.py.

One program per (token, query head): the key/value rows of positions 0..positions[t] (with a
sliding window W, args.window > 0, the last W of them: the loop starts at the window's first
position's tile and masks the rest, so no row before the window is loaded) are gathered
through the block table BLOCK_N at a time, scores and an online softmax in fp32, the output
written once. With a soft-cap c (args.softcap > 0) each scaled score x becomes c * tanh(x / c)
(tanh as 1 - 2 / (exp(2y) + 1), which saturates to +-1). The kvproof layout; f32, f16 and bf16
pools; any head_dim up to 256 (padded to a power of two and masked).
"""
import torch
import triton
import triton.language as tl

KVPROOF_PLUGIN = {
    "name": "triton-paged-decode",
    "device": "cuda",
    "kv_dtypes": ["f32", "f16", "bf16"],
    "kv_layouts": ["kvproof"],
    "supports": lambda shape: shape.head_dim <= 256,
    "sliding_window": True,
    "softcap": True,
}


@triton.jit
def _paged_decode(q_ptr, out_ptr, k_ptr, v_ptr, token_seq_ptr, positions_ptr, tables_ptr, scale, window, softcap,
                  num_heads: tl.constexpr, num_kv_heads: tl.constexpr, head_dim: tl.constexpr,
                  block_size: tl.constexpr, max_blocks: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    g = h // (num_heads // num_kv_heads)
    s = tl.load(token_seq_ptr + t)
    last = tl.load(positions_ptr + t)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q = tl.load(q_ptr + (t * num_heads + h) * head_dim + d, mask=d_ok, other=0.0).to(tl.float32)
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    first = tl.where(window > 0, tl.maximum(last - window + 1, 0), 0)
    for start in range(first // BLOCK_N * BLOCK_N, last + 1, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        j_ok = (j >= first) & (j <= last)
        block = tl.load(tables_ptr + s * max_blocks + j // block_size, mask=j_ok, other=0)
        row = ((block.to(tl.int64) * block_size + j % block_size) * num_kv_heads + g) * head_dim
        both = j_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + row[:, None] + d[None, :], mask=both, other=0.0).to(tl.float32)
        scores = tl.sum(k * q[None, :], axis=1) * scale
        if softcap > 0:
            scores = softcap * (1.0 - 2.0 / (tl.exp(2.0 * scores / softcap) + 1.0))
        scores = tl.where(j_ok, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)
        correction = tl.exp(m - m_new)
        v = tl.load(v_ptr + row[:, None] + d[None, :], mask=both, other=0.0).to(tl.float32)
        acc = acc * correction + tl.sum(p[:, None] * v, axis=0)
        l = l * correction + tl.sum(p, axis=0)
        m = m_new
    tl.store(out_ptr + (t * num_heads + h) * head_dim + d, acc / l, mask=d_ok)


def _tensor(a, dtype=None):
    t = torch.as_tensor(a, device="cuda")
    return t.view(dtype) if dtype is not None else t


def paged_attention(args):
    kv_dtype = {"f32": None, "f16": None, "bf16": torch.bfloat16}[args.kv_dtype]
    stream = torch.cuda.ExternalStream(args.stream) if args.stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        grid = (args.num_tokens, args.num_heads)
        _paged_decode[grid](
            _tensor(args.query), _tensor(args.out), _tensor(args.k_cache, kv_dtype), _tensor(args.v_cache, kv_dtype),
            _tensor(args.token_seq), _tensor(args.positions), _tensor(args.block_tables), args.scale,
            args.window, args.softcap,
            num_heads=args.num_heads, num_kv_heads=args.num_kv_heads, head_dim=args.head_dim,
            block_size=args.block_size, max_blocks=args.max_blocks_per_seq,
            BLOCK_D=triton.next_power_of_2(args.head_dim), BLOCK_N=64)
