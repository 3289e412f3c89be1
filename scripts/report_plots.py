#!/usr/bin/python3
"""The plots of kvproof's HTML reports (--html), drawn with matplotlib as SVG.

    scripts/report_plots.py SPEC.json OUT.json      (Debian python3: /usr/bin/python3)

kvproof runs this script itself (compiled into the binary: common/html_report.cc), so a page
needs no checkout; it is a file here so that it can be read, linted and run on its own.

SPEC.json: {"plots": [PLOT, ...]}, each PLOT:
  title, xlabel, ylabel     strings
  kind                      "line", "scatter" or "bar" (grouped bars over "categories")
  logy                      true: a log y axis (values <= 0 are not drawn; the plot says how many)
  categories                bar: the x labels, one per value of every series
  series                    [{"name", "x": [...], "y": [...]}] (bar: "y" only)
  hlines                    [{"y", "label"}]: limits drawn across the plot (a tolerance)
OUT.json: a list of SVG documents, one per plot, in order. Text stays text (svg.fonttype none),
so a browser renders it and a reader can search it; ids are salted per plot, so several plots
can sit inline in one page.
Exit: 0 drawn; 1 a bad spec; 3 matplotlib missing (python3-matplotlib, scripts/install-deps.sh).
"""
import io
import json
import math
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # the caller tries the next python3, or says which is missing
    print(f"report_plots: {e} (install python3-matplotlib)", file=sys.stderr)
    sys.exit(3)


def finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def draw(index, plot):
    matplotlib.rcParams["svg.fonttype"] = "none"
    matplotlib.rcParams["svg.hashsalt"] = f"kvp-plot-{index}"
    fig, ax = plt.subplots(figsize=(8.0, 3.6))
    kind = plot.get("kind", "line")
    logy = bool(plot.get("logy", False))
    dropped = 0
    series = plot.get("series", [])
    if kind == "bar":
        cats = plot.get("categories", [])
        n = max(1, len(series))
        width = 0.8 / n
        for k, s in enumerate(series):
            ys = s["y"]
            if len(ys) != len(cats):
                raise ValueError(f"plot {index}: series '{s.get('name', '')}' has {len(ys)} values for {len(cats)} categories")
            xs = [i - 0.4 + width * (k + 0.5) for i in range(len(cats))]
            ax.bar(xs, ys, width=width, label=s.get("name", ""))
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats, rotation=30 if len(cats) > 6 else 0, ha="right" if len(cats) > 6 else "center",
                           fontsize=8)
    else:
        for s in series:
            xs, ys = s.get("x", []), s["y"]
            if not xs:
                xs = list(range(len(ys)))
            if len(xs) != len(ys):
                raise ValueError(f"plot {index}: series '{s.get('name', '')}' has {len(xs)} x and {len(ys)} y values")
            pts = [(x, y) for x, y in zip(xs, ys) if finite(x) and finite(y) and (y > 0 or not logy)]
            dropped += len(ys) - len(pts)
            px = [p[0] for p in pts]
            py = [p[1] for p in pts]
            if kind == "scatter":
                ax.scatter(px, py, s=12, label=s.get("name", ""))
            else:
                ax.plot(px, py, label=s.get("name", ""), linewidth=1.2)
    for h in plot.get("hlines", []):
        ax.axhline(h["y"], color="crimson", linestyle="--", linewidth=1.0, label=h.get("label", ""))
    if logy:
        ax.set_yscale("log")
    title = plot.get("title", "")
    if dropped:
        title += f"  ({dropped} value(s) {'<= 0 or ' if logy else ''}not finite, not drawn)"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(plot.get("xlabel", ""))
    ax.set_ylabel(plot.get("ylabel", ""))
    ax.grid(True, alpha=0.3)
    if any(s.get("name") for s in series) or plot.get("hlines"):
        ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    start = svg.find("<svg")  # drop the XML prolog and doctype: the SVG goes inline
    return svg[start:] if start >= 0 else svg


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 1
    try:
        with open(argv[1], encoding="utf-8") as f:
            spec = json.load(f)
        svgs = [draw(i, p) for i, p in enumerate(spec["plots"])]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"report_plots: {argv[1]}: {e}", file=sys.stderr)
        return 1
    with open(argv[2], "w", encoding="utf-8") as f:
        json.dump(svgs, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
