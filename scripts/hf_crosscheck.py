#!/usr/bin/env python3
"""Cross-check kvproof's reference model against Hugging Face transformers.

Usage: hf_crosscheck.py CHECKPOINT_DIR GENERATE_JSON [--tolerance T]

CHECKPOINT_DIR is a checkpoint written by `kvproof export` (config.json + model.safetensors,
or sharded: model.safetensors.index.json + shards) of any architecture kvproof reads
(LlamaForCausalLM with or without rope scaling and biases, Qwen2ForCausalLM,
MistralForCausalLM); GENERATE_JSON is the output of
`kvproof generate --checkpoint CHECKPOINT_DIR --prompt ... --temperature 0 --ignore-eos --json --top-logits K`.
The script runs the checkpoint's own transformers class (AutoModelForCausalLM: the class
config.json names) in fp32 on the prompt followed by the generated
tokens, and for every generation step compares kvproof's top logits with transformers' logits
of the same tokens at the same position: |ours - hf| <= T * max|hf row|, and kvproof's greedy
token must be transformers' argmax (unless the top two are within the tolerance).
Exit status 0 when every step agrees, 1 otherwise; prints one summary line last.
"""
import argparse
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("generate_json")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()

    with open(args.generate_json) as f:
        ours = json.load(f)
    prompt = list(ours["prompt"])
    steps = ours["steps"]
    if not steps:
        print("hf-crosscheck: FAIL: the kvproof run generated no steps")
        return 1
    tokens = prompt + [s["token"] for s in steps]

    torch.manual_seed(0)
    # transformers 4.56 renamed torch_dtype to dtype, and v5 loads a checkpoint in its stored dtype
    # (bf16 for the sharded exports) unless told otherwise: ask for fp32 under the name this
    # version reads, and check that it was honoured.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    # Eager attention: transformers' own plain implementation, the one every architecture has
    # (Gemma 2's soft-capping and the sliding windows included; SDPA may not apply a softcap).
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, attn_implementation="eager",
                                                 **{dtype_key: torch.float32})
    arch = type(model).__name__
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        print(f"hf-crosscheck: FAIL: {arch} loaded with parameter dtypes {sorted(map(str, dtypes))}, not float32 "
              f"(transformers {transformers.__version__})")
        return 1
    model.eval()
    with torch.no_grad():
        # Step i's logits are the prediction after prompt + the first i generated tokens.
        ids = torch.tensor([tokens[:-1]], dtype=torch.long)
        logits = model(input_ids=ids).logits[0].double()

    worst = 0.0
    failures = []
    for i, step in enumerate(steps):
        row = logits[len(prompt) - 1 + i]
        scale = float(row.abs().max())
        for entry in step["top"]:
            diff = abs(float(entry["logit"]) - float(row[entry["token"]])) / max(scale, 1e-30)
            worst = max(worst, diff)
            if diff > args.tolerance:
                failures.append(f"step {i} token {entry['token']}: kvproof {entry['logit']:.7g}, "
                                f"transformers {float(row[entry['token']]):.7g} (rel {diff:.3g})")
        top2 = torch.topk(row, 2)
        hf_best = int(top2.indices[0])
        near_tie = float(top2.values[0] - top2.values[1]) <= args.tolerance * scale
        if step["token"] != hf_best and not near_tie:
            failures.append(f"step {i}: kvproof greedy token {step['token']}, transformers argmax {hf_best}")

    for line in failures[:20]:
        print("  " + line)
    verdict = "PASS" if not failures else "FAIL"
    print(f"hf-crosscheck: {verdict}: {arch}, {len(steps)} steps, worst relative logit difference {worst:.3g} "
          f"(tolerance {args.tolerance:g}; transformers {transformers.__version__}, torch {torch.__version__})")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
