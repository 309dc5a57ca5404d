/**
 * `npm run bench:dense -- --parts rerank`: the reranker of Search-R1's
 * retrieval_rerank_server.py (a cross-encoder scoring each query's retrieved candidates) by
 * searchr1 and by sentence-transformers, on the same model and the same (query, passage)
 * pairs, with the same threads.
 *
 * Model: rerank_bench.py `make-model`: a seeded random cross-encoder of
 * cross-encoder/ms-marco-MiniLM-L12-v2's shape (BERT, 12 layers, hidden 384, 12 heads,
 * intermediate 1536, vocabulary 30,522, one label, activation Identity) as a Hugging Face
 * folder. Pairs: rerank_bench.py `make-pairs`: --rerank-queries queries × --rerank-candidates
 * passages each (Search-R1's `--retrieval_topk 10`), each query with its own candidates, the
 * passage text as rerank_server.py makes it; about 100 to 200 tokens a pair.
 *
 * Ours: CrossEncoder.score (src/retrieval/rerank/cross-encoder.ts), what `serve-retriever
 * --reranker` runs for `POST /rerank` less the HTTP: our tokenizer makes the pairs' ids, then
 * `searchr1-index serve --reranker --device cpu --threads N` scores them over its stdio JSON
 * lines, in calls of 32 pairs (Search-R1's --reranker_batch_size), timed in this driver. The
 * tokenizer alone is timed apart (the same calls), so the forwards' share is the difference.
 * Theirs: rerank_bench.py `score`: sentence-transformers' CrossEncoder.predict(pairs,
 * batch_size=32) where it is installed, else the same computation in plain PyTorch (the
 * forward of test/retrieval/make_cross_encoder_fixtures.py, tokens made before the clock).
 * Both: one untimed call of 32 pairs, then best of --rerank-passes passes over all pairs.
 * Reported: pairs/s each side, the ratio (their time / ours), the largest difference between
 * the two sides' scores, and how far float32 rounding alone moves a score (their forward in
 * float64 on the first 32 pairs).
 */
import { existsSync, readFileSync, rmSync } from "node:fs";
import { availableParallelism, cpus, loadavg, totalmem } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { CrossEncoder } from "../../src/retrieval/rerank/cross-encoder.js";
import { table } from "../../src/runtime/table.js";
import { loadEncoderTokenizer } from "../../src/text/encoder-tokenizer.js";
import { log } from "../common.js";
import { fmt } from "./measure.js";

/** Pairs per call on both sides: Search-R1's --reranker_batch_size (and predict's default). */
const BATCH = 32;
const MODEL_SEED = 0;
const PAIRS_SEED = 1;
const SCRIPT = "rerank_bench.py";

export interface RerankSetup {
  /** Whether this searchr1-index serves `--reranker`. */
  hasReranker: boolean;
  /** Runs a script of bench/dense/ with the thread-capped environment; null: its imports are missing. */
  py: (script: string, args: string[]) => string | null;
  /** The Python it runs (for the report). */
  python: string;
  threads: number;
  /** Generated files go under WORK/rerank (kept with `keep`, and then reused). */
  work: string;
  keep: boolean;
  queries: number;
  candidates: number;
  passes: number;
}

interface Versions {
  competitor: "sentence-transformers" | "torch";
  torch: string;
  python: string;
  blas: string;
  sentence_transformers?: string;
  transformers?: string;
}

interface Theirs {
  competitor: Versions["competitor"];
  seconds: number;
  passes: number[];
  scores: number[];
  input_ids: number[][] | null;
  tokenize_seconds: number;
  fp64_rows: number;
  fp64_max_diff: number;
}

const json = <T>(out: string | null, what: string): T => {
  if (out === null) throw new Error(`${SCRIPT} ${what}: torch went missing`);
  return JSON.parse(out) as T;
};

/** The report's lines: a heading, the setup, the table and notes. */
export async function rerank(s: RerankSetup): Promise<string[]> {
  const heading = (against: string) => `## Reranker: searchr1 vs ${against} (CPU)`;
  const cv = s.py(SCRIPT, ["check"]);
  if (cv === null) {
    return ["", heading("PyTorch"), "", `reranker: not measured: ${s.python} has no torch.`];
  }
  if (!s.hasReranker) {
    return [
      "",
      heading("PyTorch"),
      "",
      "reranker: not measured: this searchr1-index serves no --reranker.",
    ];
  }
  const v = JSON.parse(cv) as Versions;
  const loadStart = loadavg();
  const dir = join(s.work, "rerank");
  const model = join(dir, "minilm-l12-random");
  const pairsFile = join(dir, `pairs-q${s.queries}-c${s.candidates}-seed${PAIRS_SEED}.json`);
  if (!existsSync(join(model, "model.safetensors"))) {
    log(`writing a random ms-marco-MiniLM-L12-v2-shaped cross-encoder to ${model} ...`);
    s.py(SCRIPT, ["make-model", "--out", model, "--seed", String(MODEL_SEED)]);
  }
  if (!existsSync(pairsFile)) {
    s.py(SCRIPT, [
      "make-pairs",
      "--model",
      model,
      "--out",
      pairsFile,
      "--queries",
      String(s.queries),
      "--candidates",
      String(s.candidates),
      "--seed",
      String(PAIRS_SEED),
    ]);
  }
  const pairs = (JSON.parse(readFileSync(pairsFile, "utf8")) as { pairs: [string, string][] })
    .pairs;
  const n = pairs.length;

  // --- ours: CrossEncoder.score, as /rerank scores; then the tokenizer alone ---
  const passes = `warm-up + ${s.passes} pass${s.passes === 1 ? "" : "es"}`;
  log(`searchr1 CrossEncoder.score, ${n} pairs (${passes}) ...`);
  const ce = await CrossEncoder.open({
    model,
    device: "cpu",
    threads: s.threads,
    batchSize: BATCH,
  });
  const ourPasses: number[] = [];
  let ours: number[] = [];
  try {
    await ce.score(pairs.slice(0, BATCH));
    for (let p = 0; p < s.passes; p++) {
      const t = performance.now();
      ours = await ce.score(pairs);
      ourPasses.push((performance.now() - t) / 1000);
    }
  } finally {
    await ce.close();
  }
  const tokenizer = loadEncoderTokenizer(model, { maxLength: ce.maxLength });
  const ourIds: number[][] = [];
  const tt = performance.now();
  for (let from = 0; from < n; from += BATCH) {
    for (const e of await tokenizer.encodePairBatch(pairs.slice(from, from + BATCH))) {
      ourIds.push(e.ids);
    }
  }
  const tokenizeSeconds = (performance.now() - tt) / 1000;
  const oursWhole = Math.min(...ourPasses);
  const oursForward = oursWhole - tokenizeSeconds;

  // --- theirs ---
  const who =
    v.competitor === "sentence-transformers"
      ? `sentence-transformers ${v.sentence_transformers} CrossEncoder.predict (transformers ${v.transformers}, PyTorch ${v.torch})`
      : `plain PyTorch ${v.torch} (sentence-transformers is not installed in ${s.python})`;
  log(`${who}, ${n} pairs (${passes}) ...`);
  const theirs = json<Theirs>(
    s.py(SCRIPT, [
      "score",
      "--model",
      model,
      "--pairs",
      pairsFile,
      "--threads",
      String(s.threads),
      "--batch-size",
      String(BATCH),
      "--repeat",
      String(s.passes),
    ]),
    "score",
  );
  if (theirs.scores.length !== n || ours.length !== n) {
    throw new Error(
      `reranker: ${ours.length} scores of ours, ${theirs.scores.length} of theirs, for ${n} pairs`,
    );
  }
  let maxDiff = 0;
  for (let i = 0; i < n; i++) {
    maxDiff = Math.max(maxDiff, Math.abs((ours[i] as number) - (theirs.scores[i] as number)));
  }
  const sameIds =
    theirs.input_ids === null
      ? null
      : ourIds.filter((ids, i) => {
          const t = theirs.input_ids?.[i] ?? [];
          return ids.length === t.length && ids.every((x, j) => x === t[j]);
        }).length;
  const lengths = ourIds.map((ids) => ids.length);
  const tokens = lengths.reduce((a, b) => a + b, 0);
  const lo = Math.min(...ours);
  const hi = Math.max(...ours);

  // --- report ---
  const rate = (sec: number) => fmt(n / sec, 1);
  const ratio = (theirSec: number, ourSec: number) => `${(theirSec / ourSec).toFixed(2)}×`;
  const st = v.competitor === "sentence-transformers";
  /** One row: what of ours is timed (its seconds) against what of theirs. */
  const row = (what: string, ourSec: number, theirWhat: string) => [
    what,
    ourSec.toFixed(2),
    rate(ourSec),
    theirWhat,
    theirs.seconds.toFixed(2),
    rate(theirs.seconds),
    ratio(theirs.seconds, ourSec),
  ];
  const whole = "texts in: tokenizer + forwards";
  const rows: string[][] = st
    ? [row(whole, oursWhole, "CrossEncoder.predict")]
    : [
        row("forwards (tokens given)", oursForward, "plain PyTorch forward"),
        row(whole, oursWhole, "(their tokenizer not timed)"),
      ];
  const loadEnd = loadavg();
  const loads = (l: number[]) => l.map((x) => x.toFixed(2)).join("/");
  const lines = [
    "",
    heading(
      st
        ? `sentence-transformers ${v.sentence_transformers}`
        : `plain PyTorch ${v.torch} (sentence-transformers' computation)`,
    ),
    "",
    `Machine: ${cpus()[0]?.model.trim() ?? "unknown CPU"}, ${availableParallelism()} cores, ` +
      `${fmt(totalmem() / 2 ** 30, 1)} GiB RAM, ${process.platform}/${process.arch}, Node ` +
      `${process.version}, Python ${v.python} (${s.python}), PyTorch ${v.torch} (BLAS ${v.blas}). ` +
      `${s.threads} threads for both sides. Load average (1/5/15 min) ${loads(loadStart)} at ` +
      `the start, ${loads(loadEnd)} at the end (a shared VM: other work on it skews the figures).`,
    "Model: a random cross-encoder of cross-encoder/ms-marco-MiniLM-L12-v2's shape (BERT, 12 " +
      "layers, hidden 384, 12 heads, intermediate 1536, vocabulary 30,522, one label, " +
      "activation Identity: the score is the logit), fp32. Workload: Search-R1's " +
      `retrieval_rerank_server.py: ${s.queries} queries × ${s.candidates} retrieved passages ` +
      `each = ${fmt(n)} pairs of ${Math.min(...lengths)}–${Math.max(...lengths)} tokens ` +
      `(${fmt(tokens)} in all), in calls of ${BATCH} pairs (--reranker_batch_size), each ` +
      `padded to its longest pair; best of ${s.passes} pass${s.passes === 1 ? "" : "es"} after ` +
      `a warm-up call.`,
    "Ours: CrossEncoder.score, what serve-retriever --reranker runs for POST /rerank (less " +
      "the HTTP): our tokenizer, then searchr1-index serve --reranker over its stdio JSON " +
      `lines, timed in this driver; the tokenizer alone took ${tokenizeSeconds.toFixed(3)} s ` +
      "of it (timed apart), the forwards the rest. Theirs: " +
      (st
        ? `${who}, loaded as Search-R1's rerank_server.py loads it, the whole call timed.`
        : `${who}: sentence-transformers' CrossEncoder.predict computation written out in ` +
          "torch (test/retrieval/make_cross_encoder_fixtures.py: BertTokenizer, " +
          "'longest_first' truncation, BertForSequenceClassification's eager forward), the " +
          "forwards timed; its pure-Python tokenizer ran before the clock " +
          `(${theirs.tokenize_seconds.toFixed(3)} s; sentence-transformers' would be Rust).`) +
      " Ratio = their time / ours (> 1: searchr1 is faster).",
    "",
    ...table(
      [["measured", "ours s", "ours pairs/s", "competitor", "s", "pairs/s", "ratio"], ...rows],
      new Set([1, 2, 4, 5, 6]),
    ),
    "",
    `Scores: max |ours − theirs| = ${maxDiff.toExponential(1)} over ${fmt(n)} pairs (scores ` +
      `${lo.toFixed(3)}..${hi.toFixed(3)}); float32 rounding alone (their forward in float64, ` +
      `first ${theirs.fp64_rows} pairs): ${theirs.fp64_max_diff.toExponential(1)}.` +
      (sameIds === null ? "" : ` Token ids identical to theirs for ${sameIds} of ${n} pairs.`),
    `Passes: ours ${ourPasses.map((x) => x.toFixed(2)).join(", ")} s; theirs ` +
      `${theirs.passes.map((x) => x.toFixed(2)).join(", ")} s.`,
  ];
  if (loadStart[0] !== undefined && loadStart[0] >= 1) {
    lines.push(
      `WARNING: the 1-minute load average was ${loadStart[0].toFixed(2)} at the start: other ` +
        "processes competed for the cores; rerun on an idle machine for figures to quote.",
    );
  }
  if (!s.keep) rmSync(dir, { recursive: true, force: true });
  return lines;
}
