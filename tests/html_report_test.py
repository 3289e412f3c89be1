#!/usr/bin/python3
"""--html on every command that writes one, rendered by headless Chromium.

    html_report_test.py KVPROOF PLUGIN_DIR SOURCE_DIR

Each page (verify, audit, audit --kv-events, kernel-check, simulate; passing and failing runs)
is printed to PDF by Debian's chromium and its text read back with pdftotext: the verdict and
every check's row must be in the rendered text (the names taken from the command's own --json
report, not from the page), a failing page must show its failure before the table, every plot
must be drawn, and nothing may be loaded from elsewhere. Without python3-matplotlib the page is
still written, with the verdict, and says why the plots are missing.
Exit 77 (ctest: skipped) when chromium or pdftotext is absent, saying which.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

failures = []


def fail(msg):
    print("FAIL: " + msg)
    failures.append(msg)


def run(args, want_rc, env=None):
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    if p.returncode != want_rc:
        fail(f"exit {p.returncode}, wanted {want_rc}: {' '.join(args)}\n{p.stdout[-600:]}{p.stderr[-600:]}")
    return p


def rendered_text(html, home):
    pdf = html + ".pdf"
    p = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
                        f"--print-to-pdf={pdf}", "file://" + html], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, HOME=home))
    if p.returncode != 0 or not os.path.exists(pdf):
        fail(f"chromium could not render {html}: {p.stderr[-400:]}")
        return ""
    text = subprocess.run(["pdftotext", pdf, "-"], capture_output=True, text=True, check=True).stdout
    return " ".join(text.split())  # one line: table cells and wrapped lines joined


def check_page(name, html, home, verdict, rows, plots, failed_rows=()):
    """verdict: "PASS", "FAIL" or None (simulate); rows: names every row of the table shows."""
    if not os.path.exists(html):
        fail(f"{name}: no page written")
        return
    page = open(html, encoding="utf-8").read()
    loaded = re.findall(r"""(?:src|href)\s*=\s*["'](?:https?:)?//[^"']*""", page) + re.findall(r"<script|<link", page)
    if loaded:
        fail(f"{name}: the page loads from elsewhere: {loaded[:3]}")
    drawn = page.count("<svg")
    if drawn != plots:
        fail(f"{name}: {drawn} plots drawn, wanted {plots}")
    text = rendered_text(html, home)
    if not text:
        return
    at = 0
    order = [f"Verdict: {verdict}"] if verdict else []
    for r in failed_rows:
        order += [f"FAILED: {r}"]
    order += ["reproduce:"] if failed_rows else []
    order += ["Checks" if name.startswith(("verify", "audit")) else "Properties" if name.startswith("kernel") else "policy"]
    for s in order:
        k = text.find(s, at)
        if k < 0:
            fail(f"{name}: '{s}' not in the rendered text after character {at} (in order: {order})")
            return
        at = k + len(s)
    for r in rows:
        if r not in text[at:]:
            fail(f"{name}: the row '{r}' is not in the rendered table")
    if verdict == "PASS" and "FAILED:" in text:
        fail(f"{name}: a passing page shows a failure")
    print(f"ok: {name}: verdict, {len(rows)} rows, {drawn} plots")


def main(argv):
    kvproof, plugins, src = argv[1:4]
    for tool in ("chromium", "pdftotext"):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} is not installed (Debian: chromium, poppler-utils; scripts/install-deps.sh)")
            return 77
    out = tempfile.mkdtemp()
    home = os.path.join(out, "home")
    os.mkdir(home)
    try:
        def names(path, key="checks"):
            return [c["name"] for c in json.load(open(path))[key]]

        h, j = f"{out}/verify.html", f"{out}/verify.json"
        run([kvproof, "verify", "--html", h, "--json", j], 0)
        check_page("verify", h, home, "PASS", names(j), 2)

        # A tolerance below f32's rounding fails the logits checks: the page leads with them.
        h, j = f"{out}/verify-fail.html", f"{out}/verify-fail.json"
        run([kvproof, "verify", "--preemption", "recompute", "--tolerance", "1e-9", "--html", h, "--json", j], 1)
        check_page("verify (failing)", h, home, "FAIL", names(j), 2, ["logits-vs-reference[recompute]"])

        h, j = f"{out}/audit.html", f"{out}/audit.json"
        run([kvproof, "audit", "--html", h, "--json", j], 0)
        check_page("audit", h, home, "PASS", names(j), 2)

        h = f"{out}/kv-events.html"
        run([kvproof, "audit", "--kv-events", f"{src}/fuzz/corpus/kv_events/planted_stale_after_clear.kvev", "--html",
             h], 1)
        check_page("audit --kv-events (failing)", h, home, "FAIL",
                   ["sequence-gap", "removed-not-stored", "stored-twice", "stale-after-clear"], 2,
                   ["stale-after-clear"])

        h, j = f"{out}/kernel-check.html", f"{out}/kernel-check.json"
        run([kvproof, "kernel-check", "--plugin", f"{plugins}/kvp_plugin_naive_c.so", "--html", h, "--json", j], 0)
        check_page("kernel-check", h, home, "PASS", ["accuracy", "guard-zones", "batch-invariance", "timeout"], 2)

        h = f"{out}/kernel-check-fail.html"
        run([kvproof, "kernel-check", "--plugin", f"{plugins}/kvp_plugin_write_past_out.so", "--max-failures", "2",
             "--html", h], 1)
        check_page("kernel-check (failing)", h, home, "FAIL", ["accuracy", "guard-zones"], 2, ["guard-zones"])

        h = f"{out}/simulate.html"
        run([kvproof, "simulate", "--shape", "chat", "--requests", "40", "--sweep", "block-size=16,128", "--html", h], 0)
        check_page("simulate", h, home, None, ["paged", "16", "128"], 3)

        # No matplotlib: the page is still the verdict, says why the plots are missing, and the
        # exit code is the run's.
        h = f"{out}/no-plots.html"
        p = run([kvproof, "kernel-check", "--plugin", f"{plugins}/kvp_plugin_naive_c.so", "--html", h], 0,
                env=dict(os.environ, KVP_PYTHON="/bin/false"))
        if "plots not drawn" not in p.stderr:
            fail("no matplotlib: no warning on stderr")
        text = rendered_text(h, home) if os.path.exists(h) else ""
        if "Verdict: PASS" not in text or "Plots not drawn: no python3 with matplotlib drew them" not in text:
            fail(f"no matplotlib: the page does not say so: {text[:300]}")

        # An unwritable page is bad input, named.
        p = run([kvproof, "simulate", "--shape", "chat", "--requests", "5", "--html", "/nonexistent-dir/p.html"], 2)
        if "--html /nonexistent-dir/p.html: cannot open for writing" not in p.stdout + p.stderr:
            fail("unwritable page not named")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if failures:
        return 1
    print("PASS: every --html page rendered")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
