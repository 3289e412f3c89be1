#!/usr/bin/env python3
"""OpenAI-compatible completion responses with logprobs -> a kvproof candidate file.

Reads responses as vLLM and SGLang serve them and writes the candidate schema of
docs/golden.md, for `kvproof compare golden.jsonl candidate.jsonl`.

  scripts/openai_to_candidate.py --golden golden.jsonl --out candidate.jsonl RESPONSE.json [...]

Accepted responses (one JSON object per file):
  /v1/completions       choices[i].logprobs = {tokens, token_logprobs, top_logprobs}; with
                        "echo": true the prompt comes back too (its first token_logprob is null)
  /v1/chat/completions  choices[i].logprobs.content[j] = {token, logprob, top_logprobs: [{token, logprob}]}
  llama-server (llama.cpp), its own /completion with "n_probs": K:
                        completion_probabilities[j] = {id, token, logprob, top_logprobs: [{id, token, logprob}]}
                        (one request per response); its OpenAI-compatible endpoints as above, each
                        entry carrying the token's integer "id"
Tokens must be ids: ask vLLM with "return_tokens_as_token_ids": true, so each token reads
"token_id:123"; llama-server gives each entry's integer "id". Text tokens cannot be mapped back
to ids without the tokenizer and are refused. llama-server's "post_sampling_probs": true gives
the sampler's probabilities, not the model's, and is refused.

Request ids: choice `index` i of the first response is request i (send the golden's prompts as
one batch, in order); each further response's choices continue after the previous ones.
The prompt of each request is the golden's (a candidate must score the golden's prompt); with
echo the returned prompt tokens are checked against it. Each response is taken as greedy
(temperature 0) unless --sampled.

Standard library only. Errors name the file and the field, and exit 2.
"""
import argparse
import json
import math
import sys


class ConvertError(Exception):
    pass


def token_id(text, where):
    if isinstance(text, str) and text.startswith("token_id:"):
        rest = text[len("token_id:"):]
        if rest.isdigit():
            return int(rest)
    raise ConvertError(f"{where}: {text!r} is not a token id; request with \"return_tokens_as_token_ids\": true")


def entry_token(e, where):
    """An entry's token id: llama-server's integer "id", else vLLM's "token": "token_id:N"."""
    if isinstance(e.get("id"), int) and not isinstance(e.get("id"), bool) and e["id"] >= 0:
        return e["id"]
    return token_id(e.get("token"), f"{where}.token")


def entry_logprob(e, where):
    if "logprob" not in e and ("prob" in e or "top_probs" in e):
        raise ConvertError(f"{where}: probabilities after sampling (llama-server \"post_sampling_probs\": true) "
                           "are not the model's; request with \"post_sampling_probs\": false")
    return logprob(e.get("logprob"), f"{where}.logprob")


def logprob(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConvertError(f"{where}: {value!r} is not a finite number")
    return float(value)


def top_list(pairs):
    """[(token, logprob)] by descending logprob, ties lowest token first, each token once."""
    seen = {}
    for token, lp in pairs:
        seen.setdefault(token, lp)
    return sorted(([t, lp] for t, lp in seen.items()), key=lambda e: (-e[1], e[0]))


def scored_tokens(choice, where):
    """[(token, logprob or None, top)] for each token the choice returned."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        raise ConvertError(f"{where}.logprobs: missing (request with \"logprobs\")")
    out = []
    if "content" in lp:  # chat completions
        content = lp["content"]
        if not isinstance(content, list):
            raise ConvertError(f"{where}.logprobs.content: not a list")
        for j, e in enumerate(content):
            at = f"{where}.logprobs.content[{j}]"
            if not isinstance(e, dict):
                raise ConvertError(f"{at}: not an object")
            top = []
            for k, t in enumerate(e.get("top_logprobs") or []):
                if not isinstance(t, dict):
                    raise ConvertError(f"{at}.top_logprobs[{k}]: not an object")
                top.append((entry_token(t, f"{at}.top_logprobs[{k}]"), entry_logprob(t, f"{at}.top_logprobs[{k}]")))
            out.append((entry_token(e, at), entry_logprob(e, at), top_list(top)))
        return out
    tokens, values = lp.get("tokens"), lp.get("token_logprobs")  # completions
    tops = lp.get("top_logprobs") or [None] * len(tokens or [])
    if not isinstance(tokens, list) or not isinstance(values, list) or not isinstance(tops, list):
        raise ConvertError(f"{where}.logprobs: needs the lists tokens and token_logprobs")
    if not (len(tokens) == len(values) == len(tops)):
        raise ConvertError(f"{where}.logprobs: tokens, token_logprobs and top_logprobs differ in length")
    for j, (t, v, top) in enumerate(zip(tokens, values, tops)):
        at = f"{where}.logprobs"
        tok = token_id(t, f"{at}.tokens[{j}]")
        if v is None:
            if j != 0:
                raise ConvertError(f"{at}.token_logprobs[{j}]: null after the first token")
            out.append((tok, None, []))
            continue
        if top is not None and not isinstance(top, dict):
            raise ConvertError(f"{at}.top_logprobs[{j}]: not an object")
        pairs = [(token_id(k, f"{at}.top_logprobs[{j}] key"), logprob(x, f"{at}.top_logprobs[{j}][{k!r}]"))
                 for k, x in (top or {}).items()]
        out.append((tok, logprob(v, f"{at}.token_logprobs[{j}]"), top_list(pairs)))
    return out


def convert_choice(choice, where, prompt, greedy, request_id):
    scored = scored_tokens(choice, where)
    echo = bool(scored) and scored[0][1] is None
    if echo:
        returned = [t for t, _, _ in scored[:len(prompt)]]
        if returned != prompt:
            raise ConvertError(f"{where}: the echoed prompt differs from the golden's prompt of request {request_id}")
        tokens = [t for t, _, _ in scored]
        first = 0
    else:
        tokens = list(prompt) + [t for t, _, _ in scored]
        first = len(prompt)
    positions = []
    for j, (tok, lp, top) in enumerate(scored):
        if lp is None:
            continue
        p = {"pos": first + j, "token": tok, "logprob": lp}
        if top:
            p["top"] = top
        positions.append(p)
    return {"id": request_id, "prompt": list(prompt), "tokens": tokens, "greedy": greedy, "positions": positions}


def read_golden_prompts(path):
    prompts = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or n == 1:
                continue
            try:
                r = json.loads(line)
                prompts[r["id"]] = r["prompt"]
            except (ValueError, KeyError, TypeError) as e:
                raise ConvertError(f"{path}:{n}: not a golden request line ({e})") from e
    return prompts


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("responses", nargs="+", help="OpenAI-style response JSON files")
    ap.add_argument("--golden", required=True, help="the golden file (its prompts)")
    ap.add_argument("--out", required=True, help="candidate JSONL to write")
    ap.add_argument("--producer", default="openai-compatible server (scripts/openai_to_candidate.py)")
    ap.add_argument("--sampled", action="store_true", help="the responses were sampled, not greedy")
    ap.add_argument("--kv-dtype", choices=["f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"],
                    help="the server's KV cache dtype, recorded as model.kv_dtype (compare prints it)")
    args = ap.parse_args(argv)
    try:
        prompts = read_golden_prompts(args.golden)
        header = {"schema": "kvproof.logprobs", "version": 1, "role": "candidate", "producer": args.producer}
        if args.kv_dtype:
            header["model"] = {"kv_dtype": args.kv_dtype}
        lines = [json.dumps(header)]
        base = 0
        for path in args.responses:
            with open(path, encoding="utf-8") as f:
                try:
                    response = json.load(f)
                except ValueError as e:
                    raise ConvertError(f"{path}: not valid JSON ({e})") from e
            if isinstance(response, dict) and "choices" not in response and "completion_probabilities" in response:
                # llama-server's /completion: one request, its generated tokens' probabilities.
                probs = response["completion_probabilities"]
                if not isinstance(probs, list):
                    raise ConvertError(f"{path}: completion_probabilities: not a list")
                response = {"choices": [{"index": 0, "logprobs": {"content": probs}}]}
                path = f"{path} (llama-server /completion; completion_probabilities read as choices[0].logprobs.content)"
            choices = response.get("choices") if isinstance(response, dict) else None
            if not isinstance(choices, list) or not choices:
                raise ConvertError(f"{path}: choices: missing or empty")
            for i, choice in enumerate(choices):
                where = f"{path}: choices[{i}]"
                if not isinstance(choice, dict):
                    raise ConvertError(f"{where}: not an object")
                index = choice.get("index", i)
                if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                    raise ConvertError(f"{where}.index: not a non-negative integer")
                request_id = base + index
                if request_id not in prompts:
                    raise ConvertError(f"{where}: request {request_id} is not in the golden file {args.golden}")
                lines.append(json.dumps(convert_choice(choice, where, prompts[request_id], not args.sampled,
                                                       request_id)))
            base += len(choices)
    except (ConvertError, OSError) as e:
        print(f"openai_to_candidate: {e}", file=sys.stderr)
        return 2
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"openai_to_candidate: {len(lines) - 1} requests -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
