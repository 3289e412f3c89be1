#!/usr/bin/env python3
"""scripts/gpu_peers.py report: the ratios it prints from a kvproof benchmark JSON and a peers
JSON written here by hand (expected values worked out by hand, not by the script)."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "gpu_peers.py")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def main():
    bench = {"benchmarks": [
        {"name": "BM_DecodeAttention/16/4096/manual_time", "real_time": 50.0, "time_unit": "us",
         "GB/s": 1000.0, "copy_GB/s": 4100.0, "of_copy": 0.24},
        {"name": "BM_DecodeAttention/1/512/manual_time", "error_occurred": True, "error_message": "no CUDA device"},
        # The half-warp kernel is the one compared; the thread-per-row figure must not be used.
        {"name": "BM_Projection/out:2048/in:2048/tokens:1/lanes:16/bf16:1/manual_time", "real_time": 20000.0,
         "time_unit": "ns"},
        {"name": "BM_Projection/out:2048/in:2048/tokens:1/lanes:1/bf16:1/manual_time", "real_time": 90.0,
         "time_unit": "us"},
        {"name": "BM_Projection/out:576/in:576/tokens:32/lanes:16/bf16:0/manual_time", "real_time": 12.0,
         "time_unit": "us"},
    ]}
    peers = {"device": "NVIDIA H200", "torch": "2.9.0", "copy_GBps": 4000.0,
             "attention": [{"batch": 16, "context": 4096, "backend": "flash", "us": 30.0, "GBps": 2000.0},
                           {"batch": 16, "context": 4096, "backend": "cudnn", "us": 25.0, "GBps": 2500.0},
                           {"batch": 16, "context": 4096, "backend": "efficient", "error": "RuntimeError: no"}],
             "projection": [{"out": 2048, "in": 2048, "tokens": 1, "dtype": "bf16", "us": 10.0, "GBps": 800.0},
                            {"out": 576, "in": 576, "tokens": 32, "dtype": "f32", "us": 4.0, "GBps": 300.0}]}
    with tempfile.TemporaryDirectory() as d:
        b, p, md = (os.path.join(d, n) for n in ("bench.json", "peers.json", "peers.md"))
        json.dump(bench, open(b, "w"))
        json.dump(peers, open(p, "w"))
        r = subprocess.run([sys.executable, SCRIPT, "report", "--kvproof", b, "--peers", p, "--markdown", md],
                           capture_output=True, text=True)
        out = r.stdout
        check(r.returncode == 0, f"report exits 0: {r.returncode} {r.stderr}")
        # 1000 GB/s of a 4000 GB/s copy: 0.25; against the best SDPA backend (cuDNN's 2500): 0.40.
        check("| 16 | 4096 | 1000 | 0.25 | 2000 | 2500 | n/a | 0.40 |" in out, "attention row with its ratios:\n" + out)
        # A shape with no figures on either side is n/a throughout, not 0.
        check("| 1 | 512 | n/a | n/a | n/a | n/a | n/a | n/a |" in out, "a failed benchmark is n/a:\n" + out)
        # 20,000 ns = 20.0 us against torch's 10.0 us: 2.00; and 12.0 / 4.0 = 3.00 for fp32.
        check("| 2048 x 2048 | 1 | bf16 | 20.0 | 10.0 | 2.00 |" in out, "bf16 projection row:\n" + out)
        check("| 576 x 576 | 32 | f32 | 12.0 | 4.0 | 3.00 |" in out, "fp32 projection row:\n" + out)
        check("copy bandwidth 4000 GB/s (kvproof's run: 4100 GB/s)" in out, "both copy bandwidths:\n" + out)
        check(os.path.exists(md) and open(md).read() == out, "--markdown writes the same tables")
        bad = subprocess.run([sys.executable, SCRIPT, "report", "--kvproof", os.path.join(d, "missing.json"),
                              "--peers", p], capture_output=True, text=True)
        check(bad.returncode == 2 and "missing.json" in bad.stderr, f"a missing file: exit 2 naming it: {bad.stderr}")
    print("gpu_peers_report_test:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
