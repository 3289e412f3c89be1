#!/usr/bin/env python3
"""llama.cpp against the oracle (ctest llama_cpp.compare, label external; docs/llama_cpp.md).

Installs the pinned node-llama-cpp (tools/llama_cpp, `npm ci`) into the build directory, exports
the tiny preset as GGUF, writes the oracle's golden file for the shared-prefix workload, runs it
through llama.cpp with tools/llama_cpp/candidate.mjs (reused prefixes, erase-and-continue,
forks into a second sequence, batch boundaries) and compares: it must pass at 1e-4 nats (measured
3.2e-6). Three concurrent sequences are run and compared too, measured and printed but not
gating (node-llama-cpp 3.21.1 intermittently mixes their outputs up; docs/llama_cpp.md). Then two
planted changes must fail compare by request and position: the GGUF with output_norm.weight
scaled by 1.001, and the driver's wrong erase. Then Gemma 2 and Gemma 3 (tiny-gemma2,
tiny-gemma3: sliding layers of window 20 beside full ones, llama.cpp's gemma2/gemma3 with its
sliding-window cache, on the shared-prefix and long-document workloads) must pass at 1e-2 nats
(measured 3.0e-3) with the driver re-evaluating
when an erase leaves the window before it unheld, and a GGUF whose window is one position wider
must fail; the driver trusting node-llama-cpp's own erase rule after a state load is measured
and printed, not gating (docs/llama_cpp.md, "Found"). Exit 77 (ctest: skipped) with the reason
when Node 20+ or the package cannot be had: never a silent pass."""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER_DIR = os.path.join(os.path.dirname(HERE), "tools", "llama_cpp")
SKIP = 77
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}")


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return p.returncode, p.stdout + p.stderr


def skip(why):
    print(f"llama_cpp_test: SKIPPED: {why}")
    sys.exit(SKIP)


def install(work):
    node = shutil.which("node")
    if node is None:
        skip("no node on PATH (Node 20 or later is needed; Debian 12's nodejs is 18)")
    rc, out = run([node, "--version"])
    major = int(out.strip().lstrip("v").split(".")[0]) if rc == 0 else 0
    if major < 20:
        skip(f"node {out.strip()} is older than 20 (node-llama-cpp 3.21.1 needs Node 20 or later)")
    os.makedirs(work, exist_ok=True)
    for f in ("package.json", "package-lock.json", "candidate.mjs"):
        shutil.copy(os.path.join(DRIVER_DIR, f), work)
    stamp = os.path.join(work, "node_modules", "node-llama-cpp", "package.json")
    if not (os.path.exists(stamp) and json.load(open(stamp)).get("version") == "3.21.1"):
        rc, out = run(["npm", "ci", "--omit=optional", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=work)
        if rc != 0:
            skip(f"npm ci of node-llama-cpp 3.21.1 failed (no registry?):\n{out[-1500:]}")
    return node


_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_layout(data):
    """A GGUF file's layout, walked as the GGUF specification (version 3) lays it out: its
    metadata {key: (value type, offset of the value)}, its tensors {name: (dims, type, offset
    from the data section)} and where the data section starts."""
    at = 4 + 4
    n_tensors, n_meta = struct.unpack_from("<QQ", data, at)
    at += 16

    def string(at):
        n = struct.unpack_from("<Q", data, at)[0]
        return data[at + 8:at + 8 + n].decode(), at + 8 + n

    meta = {}
    for _ in range(n_meta):
        key, at = string(at)
        vtype = struct.unpack_from("<I", data, at)[0]
        at += 4
        meta[key] = (vtype, at)
        if vtype == 8:
            _, at = string(at)
        elif vtype == 9:
            etype, count = struct.unpack_from("<IQ", data, at)
            at += 12
            for _ in range(count):
                if etype == 8:
                    _, at = string(at)
                else:
                    at += _SIZES[etype]
        else:
            at += _SIZES[vtype]
    tensors = {}
    for _ in range(n_tensors):
        tname, at = string(at)
        n_dims = struct.unpack_from("<I", data, at)[0]
        dims = struct.unpack_from(f"<{n_dims}Q", data, at + 4)
        ttype, offset = struct.unpack_from("<IQ", data, at + 4 + 8 * n_dims)
        at += 4 + 8 * n_dims + 12
        tensors[tname] = (dims, ttype, offset)
    alignment = struct.unpack_from("<I", data, meta["general.alignment"][1])[0] if "general.alignment" in meta else 32
    return meta, tensors, (at + alignment - 1) // alignment * alignment


def scale_tensor(src, dst, name, factor):
    """Copies a GGUF file with one f32 tensor scaled."""
    data = bytearray(open(src, "rb").read())
    _, tensors, data_start = gguf_layout(data)
    if name not in tensors or tensors[name][1] != 0:
        raise SystemExit(f"{name}: not an f32 tensor of {src}")
    dims, _, offset = tensors[name]
    start = data_start + offset
    count = 1
    for d in dims:
        count *= d
    values = struct.unpack_from(f"<{count}f", data, start)
    struct.pack_into(f"<{count}f", data, start, *[v * factor for v in values])
    open(dst, "wb").write(data)


def set_u32_key(src, dst, key, value):
    """Copies a GGUF file with one uint32 metadata value replaced (the same size: nothing moves);
    returns the value it had."""
    data = bytearray(open(src, "rb").read())
    meta, _, _ = gguf_layout(data)
    if key not in meta or meta[key][0] != 4:
        raise SystemExit(f"{key}: not a uint32 in {src}")
    old = struct.unpack_from("<I", data, meta[key][1])[0]
    struct.pack_into("<I", data, meta[key][1], value)
    open(dst, "wb").write(data)
    return old


def run_driver(a, node, model, golden, out_name, *extra):
    """tools/llama_cpp/candidate.mjs on `model` for `golden`; returns the candidate's path and
    the driver's output (printed)."""
    path = os.path.join(a.work, out_name)
    rc, out = run([node, os.path.join(a.work, "candidate.mjs"), "--model", model, "--golden", golden, "--out", path,
                   *extra])
    check(rc == 0, f"driver {os.path.basename(model)} {extra}: {out[-2000:]}")
    print(out.strip())
    return path, out


def gemma(a, node, preset, window_key):
    """A Gemma preset through llama.cpp's gemma2/gemma3 and its sliding-window cache."""
    gguf = os.path.join(a.work, f"{preset}.gguf")
    golden = os.path.join(a.work, f"{preset}-golden.jsonl")
    rc, out = run([a.kvproof, "export", "--preset", preset, "--format", "gguf", "--out", gguf])
    check(rc == 0, f"export {preset}: {out}")
    rc, out = run([a.kvproof, "reference", "--preset", preset, "--shape", "shared-prefix", "--top-k", "4",
                   "--out", golden])
    check(rc == 0, f"reference {preset}: {out}")

    def candidate(model, name, *extra):
        return run_driver(a, node, model, golden, name, "--sequences", "1", *extra)

    good, out = candidate(gguf, f"{preset}-candidate.jsonl")
    check("evaluated again from position 0" in out, f"{preset}: the driver reports its window re-evaluations")
    report = os.path.join(a.work, f"{preset}-report.json")
    rc, out = run([a.kvproof, "compare", golden, good, "--tolerance", "1e-2", "--json", report])
    print(out[-600:])
    check(rc == 0 and "verdict: PASS" in out, f"{preset}: llama.cpp agrees with the oracle within 1e-2 nats")
    check(os.path.exists(report) and json.load(open(report))["positions_compared"] >= 250,
          f"{preset}: positions compared")
    # Not vacuous: a window one position wider (W + 1 positions seen) fails by position.
    wide = os.path.join(a.work, f"{preset}-wide.gguf")
    w = set_u32_key(gguf, wide, window_key, 21)
    check(w == 20, f"{preset}: the exported window is 20, got {w}")
    bad, _ = candidate(wide, f"{preset}-candidate-wide.jsonl")
    rc, out = run([a.kvproof, "compare", golden, bad, "--tolerance", "1e-2"])
    check(rc == 1 and "FAIL" in out and "position" in out, f"{preset}: a window of 21 fails compare: rc {rc}\n{out[-600:]}")
    # node-llama-cpp's own rule after a state load (measured, not gating).
    trust, _ = candidate(gguf, f"{preset}-candidate-trust.jsonl", "--swa-erase", "trust")
    rc, out = run([a.kvproof, "compare", golden, trust, "--tolerance", "1e-2"])
    print(f"{preset}, erase trusting node-llama-cpp's rule (measured, not gating): " + out.strip().splitlines()[-1])
    # Long documents (contexts of 160-190 positions, eight windows and more): llama.cpp's
    # sliding-window cache drops cells as the sequences run, so erases reach behind it.
    long_golden = os.path.join(a.work, f"{preset}-long-golden.jsonl")
    rc, out = run([a.kvproof, "reference", "--preset", preset, "--shape", "long-docs", "--top-k", "4",
                   "--out", long_golden])
    check(rc == 0, f"reference {preset} long-docs: {out}")
    path, _ = run_driver(a, node, gguf, long_golden, f"{preset}-long-candidate.jsonl", "--sequences", "1")
    rc, out = run([a.kvproof, "compare", long_golden, path, "--tolerance", "1e-2"])
    check(rc == 0 and "verdict: PASS" in out, f"{preset} long-docs: llama.cpp agrees within 1e-2 nats\n{out[-600:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvproof", required=True)
    ap.add_argument("--work", required=True, help="a directory for the npm install and the files")
    a = ap.parse_args()
    node = install(a.work)
    gguf = os.path.join(a.work, "tiny.gguf")
    golden = os.path.join(a.work, "golden.jsonl")
    rc, out = run([a.kvproof, "export", "--preset", "tiny", "--format", "gguf", "--out", gguf])
    check(rc == 0, f"export: {out}")
    rc, out = run([a.kvproof, "reference", "--preset", "tiny", "--shape", "shared-prefix", "--top-k", "4",
                   "--out", golden])
    check(rc == 0, f"reference: {out}")

    def candidate(model, out_name, *extra):
        return run_driver(a, node, model, golden, out_name, *extra)[0]

    good = candidate(gguf, "candidate.jsonl", "--sequences", "1")
    rc, out = run([a.kvproof, "compare", golden, good, "--tolerance", "1e-4", "--json",
                   os.path.join(a.work, "report.json")])
    print(out[-1200:])
    check(rc == 0 and "verdict: PASS" in out, "llama.cpp agrees with the oracle within 1e-4 nats")
    report = json.load(open(os.path.join(a.work, "report.json")))
    check(report["positions_compared"] >= 300, f"positions compared: {report['positions_compared']}")
    lines = [json.loads(l) for l in open(good)]
    check(lines[0]["model"] == {"kv_dtype": "f32"}, "the candidate records its KV dtype")

    # Three sequences evaluated concurrently: measured and printed, not gating (node-llama-cpp
    # 3.21.1 intermittently returns another sequence's probabilities; docs/llama_cpp.md).
    concurrent = candidate(gguf, "candidate-3-sequences.jsonl", "--sequences", "3")
    rc, out = run([a.kvproof, "compare", golden, concurrent, "--tolerance", "1e-4"])
    print("three concurrent sequences (measured, not gating): " + out.strip().splitlines()[-1] +
          ("" if rc == 0 else "\n" + "\n".join(l for l in out.splitlines() if "FAIL" in l)))

    scaled = os.path.join(a.work, "tiny-scaled.gguf")
    scale_tensor(gguf, scaled, "output_norm.weight", 1.001)
    bad = candidate(scaled, "candidate-scaled.jsonl", "--sequences", "1")
    rc, out = run([a.kvproof, "compare", golden, bad, "--tolerance", "1e-4"])
    check(rc == 1 and "FAIL" in out and "> tolerance" in out and "position" in out,
          f"output_norm.weight x 1.001 fails compare by position: rc {rc}\n{out[-800:]}")

    wrong = candidate(gguf, "candidate-wrong-erase.jsonl", "--sequences", "1", "--plant", "wrong-erase")
    rc, out = run([a.kvproof, "compare", golden, wrong, "--tolerance", "1e-4"])
    check(rc == 1 and "FAIL" in out and "position" in out, f"a wrong erase fails compare: rc {rc}\n{out[-800:]}")

    gemma(a, node, "tiny-gemma2", "gemma2.attention.sliding_window")
    gemma(a, node, "tiny-gemma3", "gemma3.attention.sliding_window")

    print("llama_cpp_test: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
