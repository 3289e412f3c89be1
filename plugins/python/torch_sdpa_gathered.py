"""PyTorch scaled_dot_product_attention over a gathered dense copy of the paged pool: the
non-paged baseline for kernel-check on a GPU (device only; torch). The backend is chosen by
KVPROOF_SDPA_BACKEND (math, efficient, cudnn; default efficient), e.g.
  KVPROOF_SDPA_BACKEND=math kvproof kernel-check --plugin python:plugins/python/torch_sdpa_gathered.py:paged_attention

NOT YET RUN: written on 2026-12-06 in a session without a GPU (the sliding window on
2026-12-07, also without one); the first device run is its first test. No soft-cap: SDPA has
none, so the plug-in does not declare one (kernel-check then gives it no soft-capped case). FlashAttention's backend takes no explicit mask, and a chunk's causal mask here is
aligned to the end of the context (bottom-right), so it is not offered.

Per sequence: K/V of positions first..context-1 gathered through the block table (the kvproof
layout; first is the window's first position for the sequence's first new token, args.window >
0, else 0: no block before the window is read), queries of its new tokens, a boolean mask
letting token i see positions max(0, positions[i] - W + 1)..positions[i] (0..positions[i]
without a window), grouped-query heads expanded; the result written into `out`.
"""
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

KVPROOF_PLUGIN = {
    "name": "torch-sdpa-gathered",
    "device": "cuda",
    "kv_dtypes": ["f32", "f16", "bf16"],
    "kv_layouts": ["kvproof"],
    "sliding_window": True,
}

_BACKENDS = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION}


def _tensor(a, dtype=None):
    t = torch.as_tensor(a, device="cuda")
    return t.view(dtype) if dtype is not None else t


def paged_attention(args):
    backend = _BACKENDS[os.environ.get("KVPROOF_SDPA_BACKEND", "efficient")]
    kv_view = torch.bfloat16 if args.kv_dtype == "bf16" else None
    stream = torch.cuda.ExternalStream(args.stream) if args.stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream), sdpa_kernel(backend):
        query = _tensor(args.query)
        out = _tensor(args.out)
        k_cache = _tensor(args.k_cache, kv_view)
        v_cache = _tensor(args.v_cache, kv_view)
        starts = _tensor(args.query_start).cpu().tolist()
        positions = _tensor(args.positions)
        context = _tensor(args.context_lens).cpu().tolist()
        tables = _tensor(args.block_tables).long()
        group = args.num_heads // args.num_kv_heads
        window = args.window
        for s in range(args.num_seqs):
            n = context[s]
            rows = slice(starts[s], starts[s + 1])
            first = 0
            if window > 0:
                first = max(0, int(positions[rows].min().item()) - window + 1)
            j = torch.arange(first, n, device="cuda")
            blocks = tables[s, j // args.block_size]
            k = k_cache[blocks, j % args.block_size].float()  # [n][G][D]
            v = v_cache[blocks, j % args.block_size].float()
            k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [H][n][D]
            v = v.repeat_interleave(group, dim=1).transpose(0, 1)
            q = query[rows].transpose(0, 1)  # [H][T_s][D]
            mask = j[None, :] <= positions[rows][:, None]  # [T_s][n - first]
            if window > 0:
                mask &= j[None, :] > positions[rows][:, None] - window
            o = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                                                 scale=args.scale)
            out[rows] = o[0].transpose(0, 1)
