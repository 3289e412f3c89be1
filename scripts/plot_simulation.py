#!/usr/bin/python3
"""Charts from `kvproof simulate --json FILE`.

    scripts/plot_simulation.py RUNS.json OUTDIR     (Debian python3: /usr/bin/python3)

Writes into OUTDIR (PNG):
  memory_share.png    time-averaged KV memory by policy/run: token states, reserved,
                      internal and external fragmentation (the PagedAttention Fig. 2 view)
  latency_cdf.png     TTFT and TPOT CDFs, one line per run
  vs_rate.png         throughput and SLO attainment against request rate (runs that differ
                      in rate; skipped when every run has the same rate)
  memory_time.png     KV memory in use and queue length over simulated time
Needs python3-matplotlib (installed by scripts/install-deps.sh).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(run):
    if run.get("label"):
        return run["label"]
    s = run["settings"]
    return f'{s["policy"]} B={s["block_size"]} {s["admission"]}'


def cdf(ax, samples, name):
    xs = sorted(samples)
    if not xs:
        return
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.plot(xs, ys, label=name)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        runs = json.load(f)["runs"]
    out = argv[2]
    os.makedirs(out, exist_ok=True)
    names = [label(r) for r in runs]

    # Memory share by run (Fig. 2 of the PagedAttention paper).
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(runs)), 4))
    parts = [("token_states", "token states", "#2c7fb8"), ("reserved", "reserved", "#a1dab4"),
             ("internal_fragmentation", "internal frag.", "#fdae61"),
             ("external_fragmentation", "external frag.", "#d7191c")]
    bottom = [0.0] * len(runs)
    for key, text, colour in parts:
        vals = [100 * r["memory"][key] for r in runs]
        ax.bar(range(len(runs)), vals, bottom=bottom, label=text, color=colour)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(runs):
        ax.text(i, 100 * r["memory"]["token_states"] / 2, f'{100 * r["memory"]["token_states"]:.1f}%',
                ha="center", color="white", fontsize=8)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("% of KV memory in use (time-averaged)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory_share.png"), dpi=90)
    plt.close(fig)

    # Latency CDFs.
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for r, n in zip(runs, names):
        cdf(a1, r["ttft_samples"], n)
        cdf(a2, r["tpot_samples"], n)
    a1.set_xlabel("TTFT (s)")
    a2.set_xlabel("TPOT (s)")
    a1.set_xscale("log")
    for a in (a1, a2):
        a.set_ylabel("share of requests")
        a.grid(alpha=0.3)
    a1.axvline(runs[0]["settings"]["ttft_slo_s"], color="grey", ls="--", lw=0.8)
    a2.axvline(runs[0]["settings"]["tpot_slo_s"], color="grey", ls="--", lw=0.8)
    a2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "latency_cdf.png"), dpi=90)
    plt.close(fig)

    # Throughput and SLO attainment against request rate, per configuration.
    rates = sorted({round(r["settings"]["rate"], 6) for r in runs})
    if len(rates) > 1:
        groups = {}
        for r, n in zip(runs, names):
            key = " ".join(w for w in n.split() if not w.startswith("rate="))
            groups.setdefault(key, []).append(r)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for key, rs in groups.items():
            rs.sort(key=lambda r: r["settings"]["rate"])
            xs = [r["settings"]["rate"] for r in rs]
            a1.plot(xs, [r["output_tokens_per_s"] for r in rs], marker="o", label=key or "run")
            a2.plot(xs, [100 * r["slo_attainment"] for r in rs], marker="o", label=key or "run")
        a1.set_ylabel("output tokens/s")
        a2.set_ylabel("SLO attainment (%)")
        for a in (a1, a2):
            a.set_xlabel("request rate (req/s)")
            a.grid(alpha=0.3)
        a2.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "vs_rate.png"), dpi=90)
        plt.close(fig)

    # Memory and queue over time.
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    for r, n in zip(runs, names):
        t = [p["t_s"] / 60 for p in r["timeline"]]
        a1.plot(t, [100 * p["kv_in_use"] for p in r["timeline"]], lw=0.8, label=n)
        a2.plot(t, [p["waiting"] for p in r["timeline"]], lw=0.8, label=n)
    a1.set_ylabel("KV memory in use (%)")
    a2.set_ylabel("waiting requests")
    a2.set_xlabel("simulated time (min)")
    a1.legend(fontsize=7)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory_time.png"), dpi=90)
    plt.close(fig)
    print(f"wrote charts for {len(runs)} run(s) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
