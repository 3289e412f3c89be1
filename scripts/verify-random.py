#!/usr/bin/env python3
"""Runs `kvproof verify` on random workloads and random engine settings, as a new user would
try the tool: block sizes 1-16, tight and roomy pools, chunked prefill, cancels (some after
their request finished), tenants and shared prefixes, parallel samples (forks), sampled and
greedy requests, cpu and cuda-emu backends with f32/bf16 KV, and n-gram or draft-model
speculation. Every run is of a correct engine, so every run must pass: a failure is either an
engine defect or a false alarm of the checks, and both are bugs. Prints one line per run and
a summary; exits 1 if any run failed (its workload and command are kept for a re-run).

  scripts/verify-random.py [--count N] [--seed S] [--kvproof PATH] [--keep DIR]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile


def random_workload(rng):
    requests = []
    groups = ["sys-a", "sys-b"]
    for i in range(rng.randint(1, 14)):
        r = {"max_tokens": rng.randint(1, 24)}
        if rng.random() < 0.5:
            r["shared_prefix"] = {"group": rng.choice(groups), "len": rng.randint(1, 24)}
            r["prompt_len"] = rng.randint(1, 16)
        else:
            r["prompt_len"] = rng.randint(1, 40)
        if rng.random() < 0.4:
            r["temperature"] = rng.choice([0.7, 1.0, 1.3])
            r["top_p"] = rng.choice([1.0, 0.9])
            r["seed"] = rng.randint(0, 1 << 30)
        if rng.random() < 0.5:
            r["tenant"] = rng.randint(0, 2)
        r["arrival_step"] = rng.randint(0, 20)
        if rng.random() < 0.25:
            # Some cancels land while the request runs, some after it finished (a no-op).
            r["cancel_step"] = r["arrival_step"] + rng.randint(0, 40)
        if rng.random() < 0.2:
            r["n"] = rng.randint(2, 3)
        requests.append(r)
    return {"name": "random", "requests": requests}


def random_flags(rng):
    block = rng.randint(1, 16)
    # Tight pools preempt; roomy ones do not. The longest request needs 64 + 24 tokens.
    need = (64 + 24 + block - 1) // block + 2
    blocks = need + (rng.randint(0, 4) if rng.random() < 0.5 else rng.randint(20, 80))
    flags = ["--block-size", str(block), "--num-blocks", str(blocks),
             "--host-blocks", str(rng.choice([0, blocks // 2, blocks])),
             "--chunk", str(rng.randint(1, 64)),
             "--max-batched-tokens", str(rng.randint(64, 256)),
             "--max-num-seqs", str(rng.randint(1, 16)),
             "--preemption", rng.choice(["recompute", "swap", "both"]),
             "--admission", rng.choice(["optimistic", "conservative"]),
             "--seed", str(rng.randint(0, 1 << 30))]
    backend = rng.choice(["cpu", "cpu", "cuda-emu"])
    flags += ["--backend", backend]
    if backend == "cuda-emu":
        flags += ["--kv-dtype", rng.choice(["f32", "bf16"])]
    if rng.random() < 0.2:
        flags.append("--no-prefix-caching")
    spec = rng.choice(["off", "off", "ngram", "draft"])
    if spec != "off":
        flags += ["--speculate", spec, "--k", str(rng.randint(1, 6))]
    return flags


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=80)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--kvproof", default="build/bin/kvproof")
    ap.add_argument("--keep", default=None, help="directory for failing runs (default: a temporary one)")
    args = ap.parse_args()
    if not os.access(args.kvproof, os.X_OK):
        sys.exit(f"verify-random: {args.kvproof} is not an executable kvproof (build it first)")
    rng = random.Random(args.seed)
    keep = args.keep or tempfile.mkdtemp(prefix="verify-random-")
    os.makedirs(keep, exist_ok=True)
    failed = 0
    outcomes = {}
    for i in range(args.count):
        workload = random_workload(rng)
        flags = random_flags(rng)
        path = os.path.join(keep, f"run{i:03d}.json")
        with open(path, "w") as f:
            json.dump(workload, f)
        report = os.path.join(keep, f"run{i:03d}.report.json")
        cmd = [args.kvproof, "verify", "--workload", path, "--json", report] + flags
        p = subprocess.run(cmd, capture_output=True, text=True)
        verdict = "no report"
        if os.path.exists(report):
            with open(report) as f:
                checks = json.load(f).get("checks", [])
            counts = {}
            for c in checks:
                counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
                outcomes[c["outcome"]] = outcomes.get(c["outcome"], 0) + 1
            verdict = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        ok = p.returncode == 0
        print(f"run {i:3d}: {'PASS' if ok else 'FAIL'} ({verdict}) {' '.join(flags)}", flush=True)
        if ok:
            os.remove(path)
            os.remove(report)
        else:
            failed += 1
            tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
            print(f"  re-run: {' '.join(cmd)}\n{tail}", flush=True)
    print(f"verify-random: {args.count - failed} of {args.count} passed (seed {args.seed}; checks: "
          + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) + ")")
    if failed:
        print(f"verify-random: failing workloads kept in {keep}")
    elif args.keep is None:
        os.rmdir(keep)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
