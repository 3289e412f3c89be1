#!/usr/bin/python3
"""The long-context error table as a chart.

    KVP_LONG_CONTEXT_CSV=lc.csv build/bin/cuda_kernels_test \\
        --gtest_filter='*LongContextErrorDoesNotGrow*'          (KVP_LONG_CONTEXT_MAX=65536: 64k too)
    scripts/plot_long_context.py lc.csv OUT.png               (Debian python3: /usr/bin/python3)

Left: the total error of one decode row against fp64 attention over the original K/V, by
context, one line per KV dtype, kernel and scales (log-log: a slope of 0 or below is the
pools' rounding averaging out; a rising line is error growing with the context). Right: the
accumulation error (against fp64 over exactly what the kernel reads) beside the bound the
check gates on. Both relative to max |V| (docs/fp8.md). Needs python3-matplotlib.

The model-level rows (tests/long_context_model_test.cc, KVP_LONG_CONTEXT_CSV=FILE; columns
kv_dtype,kernel,scales,context,error,tolerance) draw as one chart: the worst logit row's
error against the fp64 oracle by context, one line per KV dtype, kernel and scales, with each
dtype's verify tolerance dotted.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1], newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and "error" in rows[0]:
        return plot_model(rows, argv[1], argv[2])
    series = {}
    bound = {}
    for row in rows:
        n = int(row["context"])
        series.setdefault(label(row), []).append((n, float(row["total"]), float(row["accumulation"])))
        bound[n] = float(row["bound"])
    if not series:
        sys.stderr.write(f"{argv[1]}: no rows\n")
        return 1
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, pts in sorted(series.items()):
        pts.sort()
        xs = [p[0] for p in pts]
        left.plot(xs, [p[1] for p in pts], marker="o", label=key)
        right.plot(xs, [p[2] for p in pts], marker="o", label=key)
    bx = sorted(bound)
    right.plot(bx, [bound[x] for x in bx], "k--", label="bound (gate)")
    for ax, title in ((left, "total error vs fp64 (original K/V)"),
                      (right, "accumulation error vs fp64 (values read)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (positions)")
        ax.set_ylabel("max |error| / max |V|")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    return 0


def label(row):
    key = row["kv_dtype"]
    if row["kernel"] != "exact":
        key += " " + row["kernel"]
    if row["scales"] not in ("", "-", "calibrated"):
        key += " scale " + row["scales"]
    return key


def plot_model(rows, source, out):
    series = {}
    tolerance = {}
    for row in rows:
        series.setdefault(label(row), []).append((int(row["context"]), float(row["error"])))
        tolerance[row["kv_dtype"]] = float(row["tolerance"])
    if not series:
        sys.stderr.write(f"{source}: no rows\n")
        return 1
    fig, ax = plt.subplots(figsize=(9, 5))
    for key, pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key)
    for dtype, tol in sorted(tolerance.items(), key=lambda kv: kv[1]):
        ax.axhline(tol, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"{dtype} tolerance {tol:g}", (1.0, tol), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", fontsize=7, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (positions)")
    ax.set_ylabel("max |engine - fp64 oracle| / max |logit| (worst of 64 rows)")
    ax.set_title("logit error through a whole model, by context")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
