#!/usr/bin/env python3
"""kvproof reference and compare from the command line. `reference` on the tiny preset writes a
golden file that passes against itself. scripts/openai_to_candidate.py on stored sample responses (tests/data/openai), end to end
with `kvproof compare`: a completions response with echo and a chat response convert to the
candidate schema; the candidate passes against its golden (with the near tie at request 1
position 4 explained); one perturbed logprob fails naming request and position; text tokens,
an echoed prompt that differs and a malformed candidate are errors (exit 2).
  tests/golden_cli_test.py --kvproof PATH
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "openai")
CONVERTER = os.path.join(ROOT, "scripts", "openai_to_candidate.py")
GOLDEN = os.path.join(DATA, "golden_sample.jsonl")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def convert(out, *responses):
    return run([sys.executable, CONVERTER, "--golden", GOLDEN, "--out", out, *responses])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvproof", required=True)
    kvproof = ap.parse_args().kvproof
    tmp = tempfile.mkdtemp(prefix="golden_cli_test.")
    golden = os.path.join(tmp, "tiny.jsonl")
    rc, out = run([kvproof, "reference", "--preset", "tiny", "--shape", "short-chat", "--top-k", "4", "--out", golden])
    check(rc == 0 and "12 requests" in out, f"reference on tiny: {rc} {out}")
    rc, out = run([kvproof, "compare", golden, golden, "--json", os.path.join(tmp, "self.json")])
    check(rc == 0 and "verdict: PASS" in out, f"golden against itself passes: {rc} {out}")
    check(json.load(open(os.path.join(tmp, "self.json")))["passed"] is True, "JSON report")

    cand = os.path.join(tmp, "candidate.jsonl")
    rc, out = convert(cand, os.path.join(DATA, "completion_echo.json"), os.path.join(DATA, "chat_completion.json"))
    check(rc == 0, f"conversion succeeds: {out}")
    lines = [json.loads(l) for l in open(cand)]
    check(lines[0] == {"schema": "kvproof.logprobs", "version": 1, "role": "candidate",
                       "producer": "openai-compatible server (scripts/openai_to_candidate.py)"}, "header")
    r0, r1 = lines[1], lines[2]
    # Completions with echo: the prompt comes back, position 0 has no score.
    check(r0["id"] == 0 and r0["prompt"] == [1, 15, 27] and r0["tokens"] == [1, 15, 27, 42, 7], f"request 0: {r0}")
    check([p["pos"] for p in r0["positions"]] == [1, 2, 3, 4], "request 0 positions")
    check(r0["positions"][2] == {"pos": 3, "token": 42, "logprob": -0.3568, "top": [[42, -0.3568], [19, -1.4998]]},
          f"request 0 position 3: {r0['positions'][2]}")
    # Chat: generated tokens only, after the golden's prompt.
    check(r1["id"] == 1 and r1["tokens"] == [3, 9, 11, 12, 14] and r1["greedy"] is True, f"request 1: {r1}")
    check([p["pos"] for p in r1["positions"]] == [2, 3, 4], "request 1 positions")
    check(r1["positions"][2]["top"] == [[14, -0.6999], [13, -0.7001]], "request 1 top list, by logprob")

    rc, out = run([kvproof, "compare", GOLDEN, cand, "--junit", os.path.join(tmp, "r.xml")])
    check(rc == 0, f"compare passes (exit 0): {out}")
    check("explained" in out and "position 4: candidate token 14, golden 13" in out, f"near tie explained: {out}")

    # llama-server's /completion (request 1 after completion_echo's request 0): the same scores
    # as the vLLM chat sample, read from completion_probabilities with integer ids.
    llama = os.path.join(tmp, "llama.jsonl")
    rc, out = convert(llama, os.path.join(DATA, "completion_echo.json"), os.path.join(DATA, "llama_server_completion.json"))
    check(rc == 0, f"llama-server /completion converts: {out}")
    llama_lines = [json.loads(l) for l in open(llama)]
    check(llama_lines[2] == lines[2], f"llama-server request 1 as the chat sample's: {llama_lines[2]} vs {lines[2]}")
    rc, out = run([kvproof, "compare", GOLDEN, llama])
    check(rc == 0 and "position 4: candidate token 14, golden 13" in out, f"llama-server candidate compares: {out}")
    post = json.load(open(os.path.join(DATA, "llama_server_completion.json")))
    for e in post["completion_probabilities"]:
        e["prob"] = 0.5
        del e["logprob"]
    post_path = os.path.join(tmp, "post_sampling.json")
    json.dump(post, open(post_path, "w"))
    rc, out = convert(os.path.join(tmp, "x.jsonl"), post_path)
    check(rc == 2 and "post_sampling_probs" in out and "completion_probabilities" in out,
          f"post-sampling probabilities refused by name: {rc} {out}")

    # The server's KV dtype, recorded and reported; a rounding one at fp32's tolerance is warned about.
    fp8 = os.path.join(tmp, "fp8.jsonl")
    rc, out = run([sys.executable, CONVERTER, "--golden", GOLDEN, "--out", fp8, "--kv-dtype", "fp8-e4m3",
                   os.path.join(DATA, "completion_echo.json"), os.path.join(DATA, "chat_completion.json")])
    check(rc == 0 and json.loads(open(fp8).readline())["model"] == {"kv_dtype": "fp8-e4m3"}, f"--kv-dtype: {out}")
    rc, out = run([kvproof, "compare", GOLDEN, fp8])
    check(rc == 0 and "KV dtype: golden not recorded, candidate fp8-e4m3" in out
          and "note: the candidate's KV cache is fp8-e4m3" in out, f"KV dtype reported: {out}")
    rc, out = run([kvproof, "compare", GOLDEN, fp8, "--tolerance", "0.05"])
    check(rc == 0 and "candidate fp8-e4m3" in out and "note:" not in out, f"no note at 0.05: {out}")
    check(json.loads(open(golden).readline())["model"]["kv_dtype"] == "f64", "reference records f64")

    lines[1]["positions"][2]["logprob"] += 0.01
    bad = os.path.join(tmp, "perturbed.jsonl")
    with open(bad, "w") as f:
        f.write("\n".join(json.dumps(l) for l in lines) + "\n")
    rc, out = run([kvproof, "compare", GOLDEN, bad])
    check(rc == 1, f"a perturbed logprob fails (exit 1): rc {rc}")
    check("\n0          FAIL" in out and "position 3 token 42" in out, f"names request 0, position 3: {out}")

    with open(bad, "w") as f:
        f.write(json.dumps(lines[0]) + "\n" + json.dumps(lines[1])[:-5] + "\n")
    rc, out = run([kvproof, "compare", GOLDEN, bad])
    check(rc == 2 and f"{bad}:2: not valid JSON" in out, f"malformed candidate: exit 2 naming the line: {rc} {out}")

    text = json.load(open(os.path.join(DATA, "completion_echo.json")))
    text["choices"][0]["logprobs"]["tokens"][0] = "<s>"
    path = os.path.join(tmp, "text_tokens.json")
    json.dump(text, open(path, "w"))
    rc, out = convert(os.path.join(tmp, "x.jsonl"), path)
    check(rc == 2 and "choices[0].logprobs.tokens[0]: '<s>' is not a token id" in out, f"text tokens: {rc} {out}")

    text["choices"][0]["logprobs"]["tokens"][0] = "token_id:2"
    json.dump(text, open(path, "w"))
    rc, out = convert(os.path.join(tmp, "x.jsonl"), path)
    check(rc == 2 and "echoed prompt differs" in out, f"echoed prompt differs: {rc} {out}")

    if not failures:
        shutil.rmtree(tmp)
    print("golden_cli_test:", "FAILED" if failures else f"passed (files kept in {tmp} on failure)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
