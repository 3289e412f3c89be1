#!/usr/bin/env python3
"""kernel-check on Python kernels (ctest kernel_check.python): the NumPy paged kernel passes
the quick grid with no case skipped; its two planted variants fail by their property; a kernel
that crashes, hangs or raises on some cases is reported case by case (signal, timeout,
run-error with the traceback) while the other cases pass in a fresh worker; a write into an
input fails inputs-unchanged; a bad --plugin python:... is bad input (exit 2) naming what."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NUMPY = os.path.join(ROOT, "plugins", "python", "numpy_paged_decode.py")
FAULTS = os.path.join(HERE, "data", "python_kernels", "planted_faults.py")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}")


def run(kvproof, spec, *extra):
    out = os.path.join(tempfile.mkdtemp(prefix="kc_python."), "r.json")
    p = subprocess.run([kvproof, "kernel-check", "--plugin", spec, "--json", out, *extra], capture_output=True,
                       text=True)
    report = json.load(open(out)) if os.path.exists(out) else None
    return p.returncode, p.stdout + p.stderr, report


def broken_then_passing(report, prop):
    """Cases that broke `prop`, and whether a case passed after the first of them."""
    broken, passed_after = 0, False
    for c in report["cases"]:
        props = {f["property"] for f in c["failures"]}
        if prop in props:
            broken += 1
        elif broken and c["status"] == "pass":
            passed_after = True
    return broken, passed_after


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvproof", required=True)
    ap.add_argument("--fake-cudart", help="plugins/fake_cudart.c's library: runs the device path without a GPU")
    parsed = ap.parse_args()
    kvproof = parsed.kvproof

    rc, out, r = run(kvproof, f"python:{NUMPY}:paged_attention")
    check(rc == 0 and r and r["summary"]["failed"] == 0 and r["summary"]["skipped"] == 0
          and r["summary"]["cases"] > 100, f"the NumPy kernel passes the quick grid: rc {rc}\n{out[-2000:]}")
    check(r and r["summary"].get("workers_started") == 1, "one worker for every case")
    windowed = [c for c in r["cases"] if c.get("window", 0) > 0] if r else []
    check(len(windowed) > 20 and all(c["status"] == "pass" for c in windowed),
          f"the NumPy kernel (sliding_window: True) gets and passes the windowed cases: {len(windowed)}")
    capped = [c for c in r["cases"] if c.get("softcap", 0) > 0] if r else []
    check(len(capped) >= 8 and all(c["status"] == "pass" for c in capped),
          f"the NumPy kernel (softcap: True) gets and passes the soft-capped cases: {len(capped)}")
    scaled = [c for c in r["cases"] if c.get("scale", 0) > 0] if r else []
    check(len(scaled) >= 8 and all(c["status"] == "pass" for c in scaled),
          f"the NumPy kernel passes the cases scaled other than by 1/sqrt(head_dim): {len(scaled)}")

    # Attending to every position despite the window reads the freed blocks' NaN: only the
    # windowed cases fail, by no-poison-leak.
    rc, out, r = run(kvproof, f"python:{NUMPY}:paged_attention_ignores_window", "--shard", "0/3")
    failing = [c for c in r["cases"] if c["status"] == "fail"] if r else []
    check(rc == 1 and "no-poison-leak" in r["summary"]["failed_by_property"] and failing
          and all(c.get("window", 0) > 0 for c in failing),
          f"paged_attention_ignores_window fails the windowed cases by no-poison-leak: rc {rc}\n{out[-1500:]}")

    # Capping before scaling: only soft-capped cases fail (the whole grid: the shards split them).
    rc, out, r = run(kvproof, f"python:{NUMPY}:paged_attention_cap_before_scale")
    failing = [c for c in r["cases"] if c["status"] == "fail"] if r else []
    check(rc == 1 and "accuracy" in r["summary"]["failed_by_property"] and len(failing) >= 3
          and all(c.get("softcap", 0) > 0 for c in failing),
          f"paged_attention_cap_before_scale fails soft-capped cases by accuracy: rc {rc}\n{out[-1500:]}")

    for fn, prop in (("paged_attention_past_context", "no-poison-leak"), ("paged_attention_head_modulo", "accuracy")):
        rc, out, r = run(kvproof, f"python:{NUMPY}:{fn}", "--shard", "0/3")
        check(rc == 1 and r and prop in r["summary"]["failed_by_property"], f"{fn} fails by {prop}: rc {rc}\n{out[-1500:]}")

    rc, out, r = run(kvproof, f"python:{FAULTS}:crash", "--shard", "0/3")
    broken, after = broken_then_passing(r, "crash") if r else (0, False)
    check(rc == 1 and broken >= 2 and after and "signal 11" in out, f"crash: {broken} crashes, passing after: {after}\n{out[-1500:]}")
    last_broke = r and "crash" in {f["property"] for f in r["cases"][-1]["failures"]}
    check(r and r["summary"]["workers_started"] == broken + (0 if last_broke else 1), "a fresh worker after each crash")

    rc, out, r = run(kvproof, f"python:{FAULTS}:hang", "--shard", "0/8", "--timeout", "1")
    broken, after = broken_then_passing(r, "timeout") if r else (0, False)
    check(rc == 1 and broken >= 2 and after, f"hang: {broken} timeouts, passing after: {after}\n{out[-1500:]}")

    rc, out, r = run(kvproof, f"python:{FAULTS}:exception", "--shard", "0/3")
    broken, after = broken_then_passing(r, "run-error") if r else (0, False)
    check(rc == 1 and broken >= 2 and after and "Traceback (most recent call last)" in out
          and "ValueError: planted:" in out and "in _check_batch" in out, f"exception: run-error with traceback\n{out[-1500:]}")
    check(r and r["summary"]["workers_started"] == 1, "an exception does not cost the worker")

    rc, out, r = run(kvproof, f"python:{FAULTS}:writes_input", "--shard", "0/6")
    check(rc == 1 and r and "inputs-unchanged" in r["summary"]["failed_by_property"], f"writes_input\n{out[-1500:]}")

    if parsed.fake_cudart:
        # A "cuda" Python kernel: every array through __cuda_array_interface__, in the fake
        # runtime's host-memory "device" buffers.
        os.environ["KVPROOF_CUDART"] = parsed.fake_cudart
        rc, out, r = run(kvproof, f"python:{os.path.join(HERE, 'data', 'python_kernels', 'cai_on_host.py')}")
        check(rc == 0 and r and r["summary"]["failed"] == 0 and r["summary"]["skipped"] == 0,
              f"the device path through __cuda_array_interface__: rc {rc}\n{out[-2000:]}")
        del os.environ["KVPROOF_CUDART"]

    tmp = tempfile.mkdtemp(prefix="kc_python_bad.")
    no_dict = os.path.join(tmp, "no_dict.py")
    open(no_dict, "w").write("def paged_attention(args):\n    pass\n")
    bad_dtype = os.path.join(tmp, "bad_dtype.py")
    open(bad_dtype, "w").write("KVPROOF_PLUGIN = {'name': 'x', 'device': 'host', 'kv_dtypes': ['f8'], "
                               "'kv_layouts': ['kvproof']}\ndef paged_attention(args):\n    pass\n")
    syntax = os.path.join(tmp, "syntax.py")
    open(syntax, "w").write("def paged_attention(args)\n    pass\n")
    for spec, words in ((f"python:{tmp}/missing.py:f", "missing.py: no such file"),
                        (f"python:{NUMPY}:no_such_function", "no function no_such_function"),
                        (f"python:{no_dict}:paged_attention", "no dict KVPROOF_PLUGIN"),
                        (f"python:{bad_dtype}:paged_attention", 'KVPROOF_PLUGIN["kv_dtypes"][0]: not one of'),
                        (f"python:{syntax}:paged_attention", "SyntaxError"),
                        ("python:", "want python:FILE.py:FUNCTION")):
        rc, out, _ = run(kvproof, spec)
        check(rc == 2 and words in out and "attention plug-in python:" in out, f"{spec}: exit 2 naming '{words}': rc {rc}\n{out[-800:]}")

    print("kernel_check_python_test: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
