"""A paged-attention kernel in NumPy, written the way a kernel developer would write one, for
`kvproof kernel-check --plugin python:plugins/python/numpy_paged_decode.py:paged_attention`.

Every layout and KV dtype of the plug-in ABI (docs/plugins.md): the pool is gathered through
the block table into dense K/V for each sequence, decoded to float64 (bf16 from its top 16
bits, fp8 through a table of the 256 codes of the OCP formats, times the per-head scale), and
softmax(scale * q K^T) V is computed per token over positions 0..positions[t], or with a
sliding window W (args.window > 0) over the last W of them: the blocks before the window are
never gathered (a serving engine has freed them; kernel-check points them at NaN). With a
soft-cap c (args.softcap > 0, Gemma 2's attn_logit_softcapping) each scaled score x becomes
c * tanh(x / c).

Two planted variants that kernel-check must catch (tests/CMakeLists.txt, kernel_check.python.*):
  paged_attention_past_context  reads every slot of the last block, past the context (the
                                 pool's NaN poison: no-poison-leak)
  paged_attention_head_modulo    maps query head h to KV head h % num_kv_heads instead of
                                 h // group (accuracy)
  paged_attention_ignores_window attends to every position despite the window (the freed
                                 blocks' NaN: no-poison-leak, on the windowed cases only)
  paged_attention_cap_before_scale soft-caps the raw dot product and scales after (accuracy, on
                                 the soft-capped cases only)
"""
import numpy as np

KVPROOF_PLUGIN = {
    "name": "numpy-paged-decode",
    "device": "host",
    "kv_dtypes": ["f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"],
    "kv_layouts": ["kvproof", "flashinfer-nhd", "flashinfer-hnd", "vllm"],
    "sliding_window": True,
    "softcap": True,
}


def _fp8_table(exponent_bits, bias, e4m3):
    """The value of each of the 256 codes (OCP 8-bit floating point, rev. 1.0)."""
    mantissa_bits = 7 - exponent_bits
    table = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> mantissa_bits) & ((1 << exponent_bits) - 1)
        m = code & ((1 << mantissa_bits) - 1)
        if e4m3 and e == 15 and m == 7:
            table[code] = np.nan
        elif not e4m3 and e == 31:
            table[code] = sign * np.inf if m == 0 else np.nan
        elif e == 0:
            table[code] = sign * m / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            table[code] = sign * (1 + m / (1 << mantissa_bits)) * 2.0 ** (e - bias)
    return table


_FP8 = {"fp8-e4m3": _fp8_table(4, 7, True), "fp8-e5m2": _fp8_table(5, 15, False)}


def _decode(raw, dtype, scale):
    """Pool elements as float64; fp8 times the per-KV-head scale (the second-to-last axis)."""
    if dtype == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype in _FP8:
        return _FP8[dtype][raw] * scale[:, None].astype(np.float64)
    return raw.astype(np.float64)


def _gather(args, s, first, n):
    """K and V of sequence s at positions first..n-1, each [n - first][num_kv_heads][head_dim], raw."""
    j = np.arange(first, n)
    blocks = args.block_tables[s, j // args.block_size]
    offsets = j % args.block_size
    layout = args.kv_layout
    if layout in ("kvproof", "flashinfer-nhd"):  # [nb][bs][H][D]
        return args.k_cache[blocks, offsets], args.v_cache[blocks, offsets]
    if layout == "flashinfer-hnd":  # [nb][H][bs][D]
        return args.k_cache[blocks, :, offsets], args.v_cache[blocks, :, offsets]
    # vLLM: K [nb][H][D/x][bs][x], V [nb][H][D][bs]
    k = args.k_cache[blocks, :, :, offsets, :]  # [n][H][D/x][x]
    v = args.v_cache[blocks, :, :, offsets]     # [n][H][D]
    return k.reshape(len(j), args.num_kv_heads, args.head_dim), v


def _attention(args, read_past_context=False, head_modulo=False, ignore_window=False, cap_before_scale=False):
    group = args.num_heads // args.num_kv_heads
    for t in range(args.num_tokens):
        s = int(args.token_seq[t])
        last = int(args.positions[t])
        n = last + 1
        first = max(0, last - args.window + 1) if args.window > 0 and not ignore_window else 0
        if read_past_context:  # planted: the whole last block
            n = -(-int(args.context_lens[s]) // args.block_size) * args.block_size
        k_raw, v_raw = _gather(args, s, first, n)
        k = _decode(k_raw, args.kv_dtype, args.k_scale)
        v = _decode(v_raw, args.kv_dtype, args.v_scale)
        for h in range(args.num_heads):
            g = h % args.num_kv_heads if head_modulo else h // group
            q = args.query[t, h].astype(np.float64)
            dots = k[:, g, :] @ q
            c = args.softcap
            if c > 0 and cap_before_scale:  # planted
                scores = c * np.tanh(dots / c) * args.scale
            elif c > 0:
                scores = c * np.tanh(dots * args.scale / c)
            else:
                scores = dots * args.scale
            p = np.exp(scores - scores.max())
            args.out[t, h] = (p @ v[:, g, :]) / p.sum()


def paged_attention(args):
    _attention(args)


def paged_attention_past_context(args):
    _attention(args, read_past_context=True)


def paged_attention_head_modulo(args):
    _attention(args, head_modulo=True)


def paged_attention_ignores_window(args):
    _attention(args, ignore_window=True)


def paged_attention_cap_before_scale(args):
    _attention(args, cap_before_scale=True)
