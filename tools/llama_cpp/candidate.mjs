#!/usr/bin/env node
// Runs a kvproof golden file's requests through llama.cpp (node-llama-cpp, pinned in
// package.json / package-lock.json) on a GGUF file from `kvproof export --format gguf`, and
// writes a candidate file for `kvproof compare` (docs/llama_cpp.md): per scored position, the
// log-probability of the golden's token and the top k, from llama.cpp's own next-token
// probabilities.
//
// It drives llama.cpp's KV cache the way a server does:
//   - with --sequences N > 1, N sequences in one context, their evaluations batched together.
//     The default is 1: with 3 concurrent sequences, node-llama-cpp 3.21.1 intermittently
//     returned one sequence's next-token probabilities for another's token (the wrong rows are
//     exactly other sequences' right ones; about 1 run in 20 here, 2026-12-06,
//     docs/llama_cpp.md), so the gate runs one sequence at a time and the concurrent run is
//     measured beside it;
//   - prompts longer than a batch (--batch), so a prompt is evaluated across batch boundaries;
//   - a cached prefix reused: a request on a sequence keeps the tokens it shares with what the
//     sequence holds and evaluates from there (llama.cpp's cells of the earlier request);
//   - a part erased and continued: after a request, its last third is erased from the cache and
//     evaluated again; the second evaluation's scores are the ones written;
//   - a forked continuation: every fourth request's prompt is saved from its sequence
//     (llama.cpp's sequence state) and loaded into a fresh sequence, which evaluates the rest.
//
//   node candidate.mjs --model M.gguf --golden G.jsonl --out C.jsonl
//        [--top-k 4] [--sequences 3] [--batch 16] [--kv f32|f16] [--flash-attention]
//        [--threads 1] [--plant wrong-erase] [--stats FILE] [--swa-full]
//
// --swa-erase safe|trust: how an erase on a sliding-window model is trusted. A windowed
// layer continuing at position p needs the cells of positions p - W + 1 .. p - 1; node-llama-cpp
// reports the first position a sequence still holds cells for (stateCellsStartIndex) and keeps
// its state when an erase starts after it. safe (the default) keeps the state only when the
// whole window before p is held (p - W + 1 >= that index) and otherwise erases everything and
// evaluates again from position 0, as llama-server does ("forcing full prompt re-processing");
// trust takes node-llama-cpp's rule. A sequence loaded from a saved state holds only its last
// window, so trust continues over a window with a hole in it: measured in docs/llama_cpp.md.
//
// --swa-full: a sliding-window model's (Gemma 2 and 3 exported by kvproof) windowed layers keep
// every cell (node-llama-cpp's swaFullCache). Without it (llama.cpp's default) they keep about a
// window's worth, so erasing into the past needs node-llama-cpp's checkpoints or a
// re-evaluation, and a loaded state restores only what the window kept: the machinery of
// llama.cpp's sliding-window cache that kvproof checks both ways.
//
// The summary line (and --stats, as JSON) gives, per KV-cache operation, the positions llama.cpp
// scored that way and the worst |log-probability difference| from the golden's: "fresh" (a
// sequence evaluated from its start), "reused-prefix" (after keeping cells of an earlier
// request), "erased-continued" (evaluated again after an erase), "forked" (in a sequence loaded
// from another's saved state). Every evaluation counts, the superseded ones included.
//
// --plant wrong-erase: a planted bug for the tests: the erase-and-continue step erases one
// token fewer than it evaluates again, so the continuation sits one position off.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

function usage(why) {
  process.stderr.write(`llama_cpp/candidate: ${why}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const a = {topK: 4, sequences: 1, batch: 16, kv: "f32", flashAttention: false, threads: 1, plant: "", stats: "",
             swaFull: false, swaErase: "safe"};
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) usage(`${k} needs a value`);
      return argv[++i];
    };
    const int = (name, lo) => {
      const v = Number(next());
      if (!Number.isInteger(v) || v < lo) usage(`${name}: want an integer >= ${lo}`);
      return v;
    };
    if (k === "--model") a.model = next();
    else if (k === "--golden") a.golden = next();
    else if (k === "--out") a.out = next();
    else if (k === "--top-k") a.topK = int("--top-k", 1);
    else if (k === "--sequences") a.sequences = int("--sequences", 1);
    else if (k === "--batch") a.batch = int("--batch", 1);
    else if (k === "--threads") a.threads = int("--threads", 1);
    else if (k === "--stats") a.stats = next();
    else if (k === "--kv") {
      a.kv = next();
      if (!["f32", "f16"].includes(a.kv)) usage("--kv: f32 or f16");
    } else if (k === "--flash-attention") a.flashAttention = true;
    else if (k === "--swa-full") a.swaFull = true;
    else if (k === "--swa-erase") {
      a.swaErase = next();
      if (!["safe", "trust"].includes(a.swaErase)) usage("--swa-erase: safe or trust");
    }
    else if (k === "--plant") {
      a.plant = next();
      if (a.plant !== "wrong-erase") usage("--plant: wrong-erase");
    } else usage(`unknown argument ${k}`);
  }
  for (const k of ["model", "golden", "out"]) if (!a[k]) usage(`--${k} is required`);
  return a;
}

function readGolden(file) {
  const lines = fs.readFileSync(file, "utf8").split("\n").filter((l) => l.trim() !== "");
  if (lines.length === 0) usage(`${file}: empty`);
  let header;
  try {
    header = JSON.parse(lines[0]);
  } catch (e) {
    usage(`${file}:1: not valid JSON (${e.message})`);
  }
  if (header.schema !== "kvproof.logprobs" || header.role !== "golden") usage(`${file}:1: not a kvproof golden file`);
  const requests = lines.slice(1).map((l, n) => {
    try {
      const r = JSON.parse(l);
      if (!Array.isArray(r.tokens) || !Array.isArray(r.prompt)) throw new Error("no tokens or prompt");
      return r;
    } catch (e) {
      usage(`${file}:${n + 2}: ${e.message}`);
    }
  });
  return {header, requests};
}

// Log-probabilities at `position` from llama.cpp's next-token probability map (the output of
// evaluating tokens[position - 1]).
function score(probabilities, token, position, topK) {
  const logprob = Math.log(probabilities.get(token) ?? 0);
  const top = [...probabilities.entries()]
    .sort((x, y) => y[1] - x[1] || x[0] - y[0])
    .slice(0, topK)
    .map(([t, p]) => [t, Math.log(p)]);
  return {pos: position, token, logprob: Number.isFinite(logprob) ? logprob : -1e30, top};
}

// Evaluates tokens[from..] on `seq` (which holds tokens[0..from)), scoring positions from+1 ..;
// returns Map position -> scored position.
const golden = new Map();  // request id -> Map position -> logprob
const byOperation = {};
function record(requestId, tag, scores) {
  const g = golden.get(requestId);
  const entry = (byOperation[tag] ??= {positions: 0, worst: 0});
  for (const [p, s] of scores) {
    if (!g?.has(p)) continue;
    entry.positions++;
    entry.worst = Math.max(entry.worst, Math.abs(s.logprob - g.get(p)));
  }
}

async function evaluateFrom(seq, tokens, from, topK) {
  const input = tokens.slice(from).map((t) => [t, {generateNext: {probabilities: true}}]);
  const out = await seq.controlledEvaluate(input);
  const scores = new Map();
  for (let i = 0; i + from + 1 < tokens.length; i++) {
    const probabilities = out[i]?.next?.probabilities;
    if (!probabilities) throw new Error(`no probabilities at input ${i}`);
    scores.set(from + i + 1, score(probabilities, tokens[from + i + 1], from + i + 1, topK));
  }
  return scores;
}

function commonPrefix(a, b) {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
}

const args = parseArgs(process.argv.slice(2));
const {header, requests} = readGolden(args.golden);
for (const r of requests) golden.set(r.id, new Map((r.positions ?? []).map((p) => [p.pos, p.logprob])));
const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: args.model});
const longest = Math.max(...requests.map((r) => r.tokens.length));
const kvType = args.kv === "f32" ? "F32" : "F16";
const context = await model.createContext({
  contextSize: Math.max(256, (longest + 8) * (args.sequences + 1)),
  sequences: args.sequences + 1, // one spare for forks
  batchSize: args.batch,
  threads: args.threads,
  flashAttention: args.flashAttention,
  swaFullCache: args.swaFull,
  experimentalKvCacheKeyType: kvType,
  experimentalKvCacheValueType: kvType,
});
const sequences = Array.from({length: args.sequences}, () => context.getSequence());
const stats = {reusedTokens: 0, erasedAndContinued: 0, forks: 0, maxContinueDiff: 0, windowReevaluations: 0};
const window = model.fileInsights.swaSize ?? 0;  // 0: no sliding window

// Erases seq's cells from position p on and returns where evaluation resumes: p, or 0 when
// (--swa-erase safe) the window before p is not all held, after erasing everything.
async function eraseFrom(seq, p) {
  const held = seq.contextTokens.length;
  if (window > 0 && args.swaErase === "safe" && p > 0 && p - window + 1 < seq.stateCellsStartIndex) {
    if (held > 0) await seq.eraseContextTokenRanges([{start: 0, end: held}]);
    stats.windowReevaluations++;
    return 0;
  }
  if (p < held) await seq.eraseContextTokenRanges([{start: p, end: held}]);
  return p;
}
const results = new Map();
const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "kvp-llama-cpp-"));

async function runRequest(seq, r) {
  const tokens = r.tokens;
  const scores = new Map();
  // Reuse what the sequence shares with this request, minus one token: its logits are needed.
  const held = seq.contextTokens;
  const keep = await eraseFrom(seq, Math.max(0, Math.min(commonPrefix(held, tokens), tokens.length) - 1));
  stats.reusedTokens += keep;
  let evalSeq = seq;
  let from = keep;
  if (forks(r) && keep < r.prompt.length - 1) {
    // Fork: evaluate the prompt but its last token here, save the sequence's state, load it into
    // the spare sequence, and continue there.
    const promptScores = await evaluateFrom(seq, tokens.slice(0, r.prompt.length - 1), keep, args.topK);
    record(r.id, keep > 0 ? "reused-prefix" : "fresh", promptScores);
    for (const [p, s] of promptScores) scores.set(p, s);
    const file = path.join(stateDir, `fork-${r.id}.bin`);
    await seq.saveStateToFile(file);
    const spare = context.getSequence();
    await spare.loadStateFromFile(file, {acceptRisk: true});
    evalSeq = spare;
    from = await eraseFrom(spare, r.prompt.length - 2);
    stats.forks++;
  }
  const main = await evaluateFrom(evalSeq, tokens, from, args.topK);
  record(r.id, evalSeq !== seq ? "forked" : keep > 0 ? "reused-prefix" : "fresh", main);
  for (const [p, s] of main) scores.set(p, s);
  // Erase the last third and continue from there again.
  const cut = Math.max(1, Math.floor((tokens.length * 2) / 3));
  if (cut < tokens.length - 1) {
    // Position cut's logits come from evaluating tokens[cut - 1]: erase from there and evaluate
    // again. Planted: erase from cut, so that tokens[cut - 1] is in the cache twice.
    const eraseAt = args.plant === "wrong-erase" ? cut : cut - 1;
    const resumed = await eraseFrom(evalSeq, eraseAt);
    const again = await evaluateFrom(evalSeq, tokens, resumed === eraseAt ? cut - 1 : 0, args.topK);
    record(r.id, "erased-continued", again);
    for (const [p, s] of again) {
      const first = scores.get(p);
      if (first) stats.maxContinueDiff = Math.max(stats.maxContinueDiff, Math.abs(first.logprob - s.logprob));
      scores.set(p, s);
    }
    stats.erasedAndContinued++;
  }
  if (evalSeq !== seq) {
    // The fork's sequence is done; the original keeps the prompt for the next request's reuse.
    evalSeq.dispose();
  }
  results.set(r.id, {id: r.id, prompt: r.prompt, tokens, greedy: r.greedy, positions: [...scores.values()].sort((a, b) => a.pos - b.pos)});
}

// Requests in order, spread over the sequences; each round's requests run concurrently, so
// their evaluations share llama.cpp batches. A forking request runs after the others of its
// round, alone, so that a state save or load never overlaps another sequence's evaluation.
const forks = (r) => r.id % 4 === 3 && r.prompt.length >= 2;
for (let i = 0; i < requests.length; i += args.sequences) {
  const round = requests.slice(i, i + args.sequences);
  await Promise.all(round.map((r, k) => (forks(r) ? null : runRequest(sequences[k], r))));
  for (let k = 0; k < round.length; k++) if (forks(round[k])) await runRequest(sequences[k], round[k]);
}

const out = [
  JSON.stringify({
    schema: "kvproof.logprobs",
    version: 1,
    role: "candidate",
    producer: `llama.cpp via node-llama-cpp 3.21.1 (${args.kv} KV cache, flash attention ${args.flashAttention ? "on" : "off"}, ${window > 0 ? `sliding window ${window}, ${args.swaFull ? "full window cache, " : ""}erase ${args.swaErase}, ` : ""}${args.sequences} sequences, batch ${args.batch}${args.plant ? ", planted " + args.plant : ""})`,
    model: {kv_dtype: args.kv},
    top_k: args.topK,
  }),
  ...requests.map((r) => JSON.stringify(results.get(r.id))),
];
fs.writeFileSync(args.out + ".tmp", out.join("\n") + "\n");
fs.renameSync(args.out + ".tmp", args.out);
fs.rmSync(stateDir, {recursive: true, force: true});
const operations = Object.entries(byOperation)
  .map(([tag, e]) => `${tag} ${e.positions} positions, worst ${e.worst.toExponential(2)}`)
  .join("; ");
process.stdout.write(
  `llama_cpp/candidate: ${requests.length} requests -> ${args.out}; reused ${stats.reusedTokens} cached tokens, ` +
    `${stats.erasedAndContinued} erased and continued (largest change on re-evaluation ${stats.maxContinueDiff.toExponential(2)} nats), ` +
    `${stats.forks} forked` +
    (window > 0 ? `, ${stats.windowReevaluations} evaluated again from position 0 (the window before an erase not held)` : "") +
    "\n" +
    `llama_cpp/candidate: against the golden, per KV-cache operation: ${operations}\n`,
);
if (args.stats) fs.writeFileSync(args.stats, JSON.stringify({...stats, byOperation}, null, 2) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
