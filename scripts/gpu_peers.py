#!/usr/bin/env python3
"""Peers in the same run (issue 38): kvproof's decode attention and projections beside PyTorch's.

  gpu_peers.py measure --out peers.json
      On the device (torch; nothing else): the copy bandwidth; decode attention through
      torch.nn.functional.scaled_dot_product_attention with each backend (flash, cuDNN,
      memory-efficient) over a dense bf16 copy of K/V of the shapes cuda_attention_bench times
      (head dim 128, 32 query / 8 KV heads, batch x context); and torch.matmul (cuBLAS) on the
      projection shapes BM_Projection times (fp32 and bf16 weights, 1 and 32 tokens). Every
      input is cycled through copies of at least 512 MiB, as the kvproof benchmarks do, so no
      figure is L2's. A configuration that fails (memory, an unsupported backend) is recorded
      with its error, and the rest go on.

  gpu_peers.py report --kvproof bench-attention.json --peers peers.json [--markdown FILE]
      Pure Python: reads the Google Benchmark JSON of cuda_attention_bench and the peers' JSON,
      and prints two tables of ratios measured in one run: attention GB/s (kvproof, each SDPA
      backend, the copy bandwidth; kvproof over the best peer) and projection time (kvproof's
      half-warp kernel over torch.matmul for the same dtype).

Decode attention with grouped-query heads is computed for SDPA as its 4 query heads of a KV
head against that head's K/V, i.e. q [batch, 8, 4, 128] with no mask: the same result, each
K/V byte read once (repeating K/V to 32 heads would read four times the bytes).
"""
import argparse
import json
import math
import re
import sys

HEAD_DIM, HEADS, KV_HEADS = 128, 32, 8
CYCLE_BYTES = 512 << 20
ATTENTION_SHAPES = [(b, c) for b in (1, 16, 64, 256) for c in (512, 4096, 32768)]
PROJECTION_SHAPES = [(576, 576), (1536, 576), (576, 1536), (2048, 2048), (8192, 2048), (2048, 8192)]


# ---- measure (the device) ---------------------------------------------------------------------

def _timed(torch, fn, copies, iterations):
    """Seconds per call of fn(c), c cycling through copies, after a warm-up, by CUDA events."""
    fn(0)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iterations):
        fn(i % copies)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e-3 / iterations


def _copy_bandwidth(torch):
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    best = 0.0
    b.copy_(a)
    for _ in range(5):
        s = _timed(torch, lambda c: b.copy_(a), 1, 1)
        best = max(best, 2.0 * a.numel() / s)
    del a, b
    return best


def _attention(torch, batch, context, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kinds = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}
    kv_bytes = batch * KV_HEADS * context * HEAD_DIM * 2 * 2  # K and V, bf16
    copies = max(1, math.ceil(CYCLE_BYTES / kv_bytes))
    k = torch.zeros(copies, batch, KV_HEADS, context, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    v = torch.zeros_like(k)
    q = torch.zeros(batch, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    scale = 1.0 / math.sqrt(HEAD_DIM)
    with sdpa_kernel([kinds[backend]]):
        s = _timed(torch, lambda c: torch.nn.functional.scaled_dot_product_attention(q, k[c], v[c], scale=scale),
                   copies, max(10, 2 * copies))
    del k, v
    torch.cuda.empty_cache()
    out_bytes = 2 * batch * HEADS * HEAD_DIM * 2
    return {"us": s * 1e6, "GBps": (kv_bytes + out_bytes) / s / 1e9}


def _projection(torch, out_dim, in_dim, tokens, dtype):
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    w_bytes = out_dim * in_dim * (4 if dtype == "f32" else 2)
    copies = max(1, math.ceil(CYCLE_BYTES / w_bytes))
    w = torch.zeros(copies, out_dim, in_dim, dtype=dt, device="cuda")
    x = torch.zeros(tokens, in_dim, dtype=dt, device="cuda")
    s = _timed(torch, lambda c: torch.matmul(x, w[c].t()), copies, max(20, 2 * copies))
    del w
    torch.cuda.empty_cache()
    return {"us": s * 1e6, "GBps": w_bytes / s / 1e9}


def measure(out_path):
    import torch
    # fp32 matmuls in fp32 (no TF32), as kvproof's projections are.
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "attention": [], "projection": []}
    result["copy_GBps"] = _copy_bandwidth(torch) / 1e9
    for batch, context in ATTENTION_SHAPES:
        for backend in ("flash", "cudnn", "efficient"):
            row = {"batch": batch, "context": context, "backend": backend}
            try:
                row.update(_attention(torch, batch, context, backend))
            except Exception as e:  # noqa: BLE001: a backend or a shape this torch does not take
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
                torch.cuda.empty_cache()
            result["attention"].append(row)
            print(json.dumps(row), flush=True)
    for out_dim, in_dim in PROJECTION_SHAPES:
        for tokens in (1, 32):
            for dtype in ("f32", "bf16"):
                row = {"out": out_dim, "in": in_dim, "tokens": tokens, "dtype": dtype}
                try:
                    row.update(_projection(torch, out_dim, in_dim, tokens, dtype))
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {e}"[:200]
                result["projection"].append(row)
                print(json.dumps(row), flush=True)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


# ---- report (anywhere) ------------------------------------------------------------------------

_ATTENTION_NAME = re.compile(r"^BM_DecodeAttention/(\d+)/(\d+)(/|$)")
_PROJECTION_NAME = re.compile(r"^BM_Projection/out:(\d+)/in:(\d+)/tokens:(\d+)/lanes:(\d+)/bf16:(\d)(/|$)")
_UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def kvproof_figures(bench):
    """{(batch, context): GB/s} and {(out, in, tokens, dtype): us} of the half-warp kernel."""
    attention, projection, copy = {}, {}, None
    for b in bench.get("benchmarks", []):
        if b.get("error_occurred"):
            continue
        name = b.get("name", "")
        m = _ATTENTION_NAME.match(name)
        if m:
            attention[(int(m.group(1)), int(m.group(2)))] = float(b["GB/s"])
            copy = float(b.get("copy_GB/s", copy or 0)) or copy
            continue
        m = _PROJECTION_NAME.match(name)
        if m and int(m.group(4)) == 16:
            us = float(b["real_time"]) * _UNIT_US[b.get("time_unit", "ns")]
            projection[(int(m.group(1)), int(m.group(2)), int(m.group(3)), "bf16" if m.group(5) == "1" else "f32")] = us
    return attention, projection, copy


def _cell(x, fmt="{:.0f}"):
    return "n/a" if x is None else fmt.format(x)


def report(bench, peers):
    """The two tables, as Markdown lines."""
    attention, projection, kv_copy = kvproof_figures(bench)
    copy = peers.get("copy_GBps") or kv_copy
    by_backend = {}
    for row in peers.get("attention", []):
        by_backend[(row["batch"], row["context"], row["backend"])] = row.get("GBps")
    lines = [f"Peers on {peers.get('device', '?')} (torch {peers.get('torch', '?')}), copy bandwidth "
             f"{_cell(copy)} GB/s (kvproof's run: {_cell(kv_copy)} GB/s)", "",
             "| batch | context | kvproof GB/s | of copy | SDPA flash | SDPA cuDNN | SDPA efficient | kvproof / best SDPA |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for batch, context in ATTENTION_SHAPES:
        ours = attention.get((batch, context))
        peer = [by_backend.get((batch, context, k)) for k in ("flash", "cudnn", "efficient")]
        best = max((p for p in peer if p), default=None)
        lines.append(f"| {batch} | {context} | {_cell(ours)} | {_cell(ours / copy if ours and copy else None, '{:.2f}')} | "
                     + " | ".join(_cell(p) for p in peer)
                     + f" | {_cell(ours / best if ours and best else None, '{:.2f}')} |")
    lines += ["", "| out x in | tokens | weights | kvproof us | torch.matmul us | kvproof / torch |",
              "| --- | ---: | --- | ---: | ---: | ---: |"]
    torch_us = {(r["out"], r["in"], r["tokens"], r["dtype"]): r.get("us") for r in peers.get("projection", [])}
    for out_dim, in_dim in PROJECTION_SHAPES:
        for tokens in (1, 32):
            for dtype in ("f32", "bf16"):
                key = (out_dim, in_dim, tokens, dtype)
                ours, theirs = projection.get(key), torch_us.get(key)
                lines.append(f"| {out_dim} x {in_dim} | {tokens} | {dtype} | {_cell(ours, '{:.1f}')} | "
                             f"{_cell(theirs, '{:.1f}')} | {_cell(ours / theirs if ours and theirs else None, '{:.2f}')} |")
    return lines


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--kvproof", required=True, help="cuda_attention_bench's --benchmark_out JSON")
    r.add_argument("--peers", required=True, help="gpu_peers.py measure's JSON")
    r.add_argument("--markdown", help="also write the tables here")
    a = ap.parse_args(argv)
    if a.command == "measure":
        measure(a.out)
        return 0
    try:
        bench, peers = json.load(open(a.kvproof)), json.load(open(a.peers))
    except (OSError, ValueError) as e:
        print(f"gpu_peers.py report: {e}", file=sys.stderr)
        return 2
    lines = report(bench, peers)
    print("\n".join(lines))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
