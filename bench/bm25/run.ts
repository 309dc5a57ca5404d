/**
 * Benchmark: searchr1's BM25 index build and query speed against Xapian (Debian's
 * python3-xapian), on the same synthetic wiki-18-shaped corpus, on this machine.
 *
 * Usage: npm run build && npm run bench:bm25 [-- OPTIONS]
 *   --passages N    corpus size (default 1,000,000)
 *   --queries N     benchmark queries (default 2,000)
 *   --work DIR      where the corpus and indexes go (default: $TMPDIR/searchr1-bench-bm25);
 *                   a corpus generated earlier with the same parameters is reused
 *   --threads N     searchr1 threads for the "all cores" runs (default: all cores)
 *   --repeat N      timed query passes per measurement; the median pass is reported (default 3)
 *   --keep          keep the indexes (they are deleted at the end otherwise)
 *   --python PATH   the Python with the xapian module (default: $BM25_BENCH_PYTHON,
 *                   then python3, then /usr/bin/python3)
 *
 * Measures, one after the other: index build (searchr1 CLI on all cores and on one
 * thread; Xapian in one process, which is single-threaded), then queries: one query per
 * call on one thread (searchr1 Bm25Engine.searchOne vs Xapian Enquire, top 3 and top 10,
 * with latency percentiles), batches of 64 (searchr1 Bm25Retriever's thread pool vs
 * Xapian sequentially in one process, and in N processes), and how much the two
 * engines' top 10 agree.
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { availableParallelism, cpus, loadavg, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { LUCENE_STOPWORDS } from "../../src/retrieval/analyzer.js";
import { Bm25Engine, loadShared } from "../../src/retrieval/bm25/engine.js";
import { readMeta } from "../../src/retrieval/bm25/format.js";
import { Bm25Retriever } from "../../src/retrieval/bm25/retriever.js";
import { packageRoot } from "../../src/runtime/package-root.js";
import { fmt, log } from "../common.js";
import { type CorpusParams, DEFAULT_CORPUS, ensureCorpus, makeQueries } from "./corpus.js";

const TOPKS = [3, 10] as const;
const BATCH = 64;
const WARMUP = 200;

const { values: opts } = parseArgs({
  options: {
    passages: { type: "string" },
    queries: { type: "string" },
    work: { type: "string" },
    threads: { type: "string" },
    python: { type: "string" },
    repeat: { type: "string" },
    keep: { type: "boolean", default: false },
  },
});

function positiveInt(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value.replaceAll("_", ""));
  if (!Number.isInteger(n) || n <= 0) {
    console.error(`bench:bm25: --${name} expects a positive integer, got ${value}`);
    process.exit(2);
  }
  return n;
}

const params: CorpusParams = {
  ...DEFAULT_CORPUS,
  passages: positiveInt("passages", opts.passages, DEFAULT_CORPUS.passages),
};
const nQueries = positiveInt("queries", opts.queries, 2_000);
const threads = positiveInt("threads", opts.threads, availableParallelism());
const repeat = positiveInt("repeat", opts.repeat, 3);
const work = opts.work ?? join(tmpdir(), "searchr1-bench-bm25");
const root = packageRoot();
const script = join(root, "bench", "bm25", "xapian_bench.py");
const cli = join(root, "bin", "searchr1");
const stopwords = LUCENE_STOPWORDS.join(",");

const now = () => Number(process.hrtime.bigint()) / 1e9;

/** The first Python that imports xapian, with its versions; exits with a message if none. */
function findPython(): { python: string; xapian: string; version: string } {
  const candidates = opts.python
    ? [opts.python]
    : [process.env.BM25_BENCH_PYTHON, "python3", "/usr/bin/python3"].filter(
        (p): p is string => !!p,
      );
  const tried: string[] = [];
  for (const python of [...new Set(candidates)]) {
    const r = spawnSync(python, [script, "check"], { encoding: "utf8" });
    if (r.status === 0) {
      const info = JSON.parse(r.stdout) as { xapian: string; python: string; porter: boolean };
      if (!info.porter) {
        console.error(`bench:bm25: ${python}: this Xapian has no "porter" stemmer`);
        process.exit(2);
      }
      return { python, xapian: info.xapian, version: info.python };
    }
    tried.push(
      r.error ? `${python}: not found` : `${python}: ${(r.stderr || "").trim().split("\n").pop()}`,
    );
  }
  console.error(
    "bench:bm25 needs python3 with the xapian module, the competitor it measures against.\n" +
      "  Debian/Ubuntu: apt-get update && apt-get install -y python3-xapian\n" +
      "  (a pyenv/venv python3 does not see Debian's module: pass --python /usr/bin/python3\n" +
      "  or set BM25_BENCH_PYTHON)\n" +
      `Tried: ${tried.join("; ")}`,
  );
  process.exit(2);
}

function duBytes(path: string): number {
  const info = statSync(path);
  if (!info.isDirectory()) return info.size;
  let total = 0;
  for (const name of readdirSync(path)) total += duBytes(join(path, name));
  return total;
}

interface BuildResult {
  /** Wall-clock seconds of the whole process. */
  wall: number;
  /** Seconds the tool reports for the build itself. */
  reported: number;
  bytes: number;
}

function buildSearchr1(corpus: string, out: string, n: number): BuildResult {
  log(`searchr1 build-index --threads ${n} ...`);
  const t = now();
  const r = spawnSync(
    process.execPath,
    [
      cli,
      "build-index",
      "--corpus",
      corpus,
      "--out",
      out,
      "--threads",
      String(n),
      "--overwrite",
      "--quiet",
    ],
    { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] },
  );
  const wall = now() - t;
  if (r.status !== 0) throw new Error(`searchr1 build-index failed (exit ${r.status})`);
  const m = / in ([\d.]+) s \(/.exec(r.stdout);
  log(`  ${r.stdout.trim()}`);
  // The index reads a plain jsonl corpus in place; its size excludes the corpus.
  return { wall, reported: m ? Number(m[1]) : wall, bytes: duBytes(out) };
}

function python(py: string, args: string[]): unknown {
  const r = spawnSync(py, [script, ...args], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
    maxBuffer: 256 << 20,
  });
  if (r.status !== 0) throw new Error(`xapian_bench.py ${args[0]} failed (exit ${r.status})`);
  return JSON.parse(r.stdout);
}

function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const i = Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1);
  return sorted[Math.max(0, i)] as number;
}

interface Single {
  qps: number;
  p50: number;
  p99: number;
  mean: number;
}

function summarize(latencyMs: number[], seconds: number): Single {
  const sorted = [...latencyMs].sort((a, b) => a - b);
  return {
    qps: latencyMs.length / seconds,
    p50: percentile(sorted, 50),
    p99: percentile(sorted, 99),
    mean: latencyMs.reduce((a, b) => a + b, 0) / Math.max(1, latencyMs.length),
  };
}

/** Runs `pass` `repeat` times and returns the median pass by its total time. */
async function medianPass<T extends { seconds: number }>(pass: () => T | Promise<T>): Promise<T> {
  const passes: T[] = [];
  for (let i = 0; i < repeat; i++) passes.push(await pass());
  passes.sort((a, b) => a.seconds - b.seconds);
  return passes[passes.length >> 1] as T;
}

async function searchr1Queries(dir: string, queries: string[]) {
  const single = new Map<number, Single>();
  let top: number[][] = [];
  const engine = new Bm25Engine(loadShared(dir, await readMeta(dir)));
  for (const q of queries.slice(0, WARMUP)) engine.searchOne(q, 10);
  for (const k of TOPKS) {
    const pass = await medianPass(() => {
      const lat: number[] = [];
      const hits: number[][] = [];
      const t0 = now();
      for (const q of queries) {
        const t = now();
        const h = engine.searchOne(q, k);
        lat.push((now() - t) * 1000);
        hits.push(h.map((x) => x.row));
      }
      return { seconds: now() - t0, lat, hits };
    });
    single.set(k, summarize(pass.lat, pass.seconds));
    if (k === 10) top = pass.hits;
  }
  engine.close();

  // Batches of 64 through the thread pool: one request at a time (a client waiting for
  // each answer), and all requests in flight at once (many concurrent clients).
  const sequential = new Map<number, number>();
  const inFlight = new Map<number, number>();
  const retriever = await Bm25Retriever.open(dir, await readMeta(dir), threads);
  try {
    const batches: string[][] = [];
    for (let i = 0; i < queries.length; i += BATCH) batches.push(queries.slice(i, i + BATCH));
    await Promise.all(batches.map((b) => retriever.search(b, 10))); // warm every thread
    for (const k of TOPKS) {
      const seq = await medianPass(async () => {
        const t = now();
        for (const b of batches) await retriever.search(b, k);
        return { seconds: now() - t };
      });
      sequential.set(k, queries.length / seq.seconds);
      const all = await medianPass(async () => {
        const t = now();
        await Promise.all(batches.map((b) => retriever.search(b, k)));
        return { seconds: now() - t };
      });
      inFlight.set(k, queries.length / all.seconds);
    }
  } finally {
    await retriever.close();
  }
  return { single, top, sequential, inFlight };
}

interface XapianQueryOut {
  single: Record<string, { seconds: number; qps: number; latency_ms: number[] }>;
  batched: Record<string, { seconds: number; qps: number }>;
  top?: number[][];
}

/** Per-query agreement of two top-10 lists: Jaccard of the sets, and same first hit. */
function overlap(a: number[][], b: number[][]) {
  let jaccard = 0;
  let recall = 0;
  let top1 = 0;
  let counted = 0;
  let bothEmpty = 0;
  for (let i = 0; i < a.length; i++) {
    const x = new Set(a[i]);
    const y = new Set(b[i]);
    if (x.size === 0 && y.size === 0) {
      bothEmpty++;
      continue;
    }
    let common = 0;
    for (const v of x) if (y.has(v)) common++;
    jaccard += common / (x.size + y.size - common);
    recall += y.size > 0 ? common / y.size : 0;
    if (a[i]?.[0] !== undefined && a[i]?.[0] === b[i]?.[0]) top1++;
    counted++;
  }
  const d = Math.max(1, counted);
  return { jaccard: jaccard / d, recall: recall / d, top1: top1 / d, counted, bothEmpty };
}

async function main() {
  const py = findPython();
  mkdirSync(work, { recursive: true });
  const cores = availableParallelism();
  const cpu = cpus()[0]?.model.trim() ?? "unknown CPU";
  const loadBefore = loadavg()[0] as number;
  log(`work dir: ${work}`);

  log(
    `corpus: ${fmt(params.passages)} passages (vocabulary ${fmt(params.vocab)}, Zipf s=${params.exponent})`,
  );
  const corpus = ensureCorpus(work, params, log);
  log(
    corpus.generated
      ? `  generated ${corpus.path} in ${corpus.seconds.toFixed(1)} s`
      : `  reusing ${corpus.path}`,
  );
  const corpusBytes = statSync(corpus.path).size;

  // --- index build ---
  const oursDir = join(work, "searchr1-index");
  const ours1Dir = join(work, "searchr1-index-t1");
  const xapDir = join(work, "xapian-db");
  const ours = buildSearchr1(corpus.path, oursDir, threads);
  const ours1 = buildSearchr1(corpus.path, ours1Dir, 1);
  rmSync(ours1Dir, { recursive: true, force: true });
  log("xapian build (one process) ...");
  const t = now();
  const xb = python(py.python, [
    "build",
    "--corpus",
    corpus.path,
    "--db",
    xapDir,
    "--stopwords",
    stopwords,
  ]) as { seconds: number; compact_seconds: number; passages: number; flush_threshold: number };
  const xap: BuildResult = { wall: now() - t, reported: xb.seconds, bytes: duBytes(xapDir) };
  if (xb.passages !== params.passages) {
    throw new Error(`xapian indexed ${xb.passages} passages, expected ${params.passages}`);
  }

  // --- queries ---
  const queries = makeQueries(params, nQueries, params.seed + 1);
  const queriesFile = join(work, "queries.txt");
  writeFileSync(queriesFile, `${queries.join("\n")}\n`);
  log(`searchr1 queries (${fmt(nQueries)}; one thread, then a pool of ${threads}) ...`);
  const oq = await searchr1Queries(oursDir, queries);
  log("xapian queries (one process) ...");
  const common = ["--db", xapDir, "--queries", queriesFile, "--stopwords", stopwords].concat([
    "--repeat",
    String(repeat),
  ]);
  const xq = python(py.python, ["query", ...common, "--batch", String(BATCH)]) as XapianQueryOut;
  log(`xapian queries (${threads} processes) ...`);
  const xqp = python(py.python, [
    "query",
    ...common,
    "--batch",
    String(BATCH),
    "--processes",
    String(threads),
  ]) as XapianQueryOut;

  if (!opts.keep) {
    rmSync(oursDir, { recursive: true, force: true });
    rmSync(xapDir, { recursive: true, force: true });
  }

  // --- report ---
  const n = params.passages;
  const rate = (s: number) => n / s;
  const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}×`;
  const lines: string[] = [];
  const row = (...cells: string[]) => lines.push(`| ${cells.join(" | ")} |`);
  lines.push("");
  lines.push(`## BM25: searchr1 vs Xapian ${py.xapian}`);
  lines.push("");
  lines.push(
    `Machine: ${cores} cores (${cpu}), ${fmt(totalmem() / 2 ** 30, 1)} GiB RAM, ` +
      `Node ${process.version}, Python ${py.version} (${py.python}), ${process.platform}/${process.arch}; ` +
      `1-minute load average ${loadBefore.toFixed(2)} at the start, ${(loadavg()[0] as number).toFixed(2)} at the end ` +
      "(other work on the machine skews the figures).",
  );
  lines.push(
    `Corpus: ${fmt(n)} synthetic passages, ${fmt(corpusBytes / 2 ** 20)} MiB jsonl, ` +
      `${params.minWords}-${params.maxWords} words each, Zipf s=${params.exponent} over ` +
      `${fmt(params.vocab)} word forms (seed ${params.seed}). ` +
      `Queries: ${fmt(nQueries)}, 2-8 words (70% Zipf-drawn, 30% rare); ` +
      `query figures are the median of ${repeat} timed passes.`,
  );
  lines.push(
    "Analysis: searchr1 = UAX#29 + possessive + lowercase + Lucene stop words + Porter; " +
      'Xapian = TermGenerator/QueryParser, Stem("porter") (original Porter, like searchr1; ' +
      '"english" would be Porter2), STEM_ALL, same 33 stop words (STOP_ALL), no positions, ' +
      "no termlist. BM25: searchr1 k1=0.9 b=0.4 (Lucene idf, 1-byte lengths); " +
      `Xapian BM25Weight(k1=0.9, k2=0, k3=1, b=0.4, min_normlen=0) (its own idf, exact lengths). ` +
      `Xapian flush threshold ${fmt(xb.flush_threshold)} documents; its database is ` +
      "compacted after the build and searched compacted.",
  );
  lines.push("");
  lines.push("### Index build (wall clock of the whole process)");
  lines.push("");
  row("engine", "seconds", "passages/s", "index size", "searchr1 / Xapian (speed)");
  row("---", "---:", "---:", "---:", "---:");
  const size = (b: number) => `${fmt(b / 2 ** 20)} MiB`;
  row(
    `searchr1 build-index, ${threads} threads`,
    ours.wall.toFixed(1),
    fmt(rate(ours.wall)),
    size(ours.bytes),
    ratio(xap.wall, ours.wall),
  );
  row(
    "searchr1 build-index, 1 thread",
    ours1.wall.toFixed(1),
    fmt(rate(ours1.wall)),
    size(ours1.bytes),
    ratio(xap.wall, ours1.wall),
  );
  row(
    "Xapian, 1 process (single-threaded), index + compact",
    xap.wall.toFixed(1),
    fmt(rate(xap.wall)),
    size(xap.bytes),
    "1.00×",
  );
  lines.push("");
  lines.push(
    `(searchr1's own timers: ${ours.reported.toFixed(1)} s and ${ours1.reported.toFixed(1)} s; ` +
      `Xapian: indexing ${xap.reported.toFixed(1)} s + compacting ${xb.compact_seconds.toFixed(1)} s. ` +
      "The searchr1 index excludes the corpus, " +
      "which it reads in place; Xapian stores each row's byte offset as document data.)",
  );
  lines.push("");
  lines.push("### Queries, one per call, one thread");
  lines.push("");
  row("top k", "engine", "queries/s", "p50 ms", "p99 ms", "mean ms", "searchr1 / Xapian (q/s)");
  row("---:", "---", "---:", "---:", "---:", "---:", "---:");
  for (const k of TOPKS) {
    const o = oq.single.get(k) as Single;
    const xr = xq.single[String(k)];
    if (!xr) throw new Error(`xapian: no top-${k} result`);
    const x = summarize(xr.latency_ms, xr.seconds);
    row(
      String(k),
      "searchr1 Bm25Engine.searchOne",
      fmt(o.qps),
      o.p50.toFixed(3),
      o.p99.toFixed(3),
      o.mean.toFixed(3),
      ratio(o.qps, x.qps),
    );
    row(
      String(k),
      "Xapian Enquire (Python)",
      fmt(x.qps),
      x.p50.toFixed(3),
      x.p99.toFixed(3),
      x.mean.toFixed(3),
      "1.00×",
    );
  }
  lines.push("");
  lines.push(`### Queries in batches of ${BATCH}`);
  lines.push("");
  row(
    "top k",
    "engine",
    "queries/s",
    "searchr1 / Xapian 1 process",
    `searchr1 / Xapian ${threads} processes`,
  );
  row("---:", "---", "---:", "---:", "---:");
  for (const k of TOPKS) {
    const x1 = xq.batched[String(k)]?.qps ?? Number.NaN;
    const xn = xqp.batched[String(k)]?.qps ?? Number.NaN;
    const seq = oq.sequential.get(k) as number;
    const all = oq.inFlight.get(k) as number;
    row(
      String(k),
      `searchr1 Bm25Retriever, ${threads} threads, one batch at a time`,
      fmt(seq),
      ratio(seq, x1),
      ratio(seq, xn),
    );
    row(
      String(k),
      `searchr1 Bm25Retriever, ${threads} threads, all batches in flight`,
      fmt(all),
      ratio(all, x1),
      ratio(all, xn),
    );
    row(String(k), "Xapian, 1 process, batches one after another", fmt(x1), "1.00×", "");
    row(
      String(k),
      `Xapian, ${threads} processes (multiprocessing), batches spread`,
      fmt(xn),
      "",
      "1.00×",
    );
  }
  lines.push("");
  const ov = overlap(oq.top, xq.top ?? []);
  lines.push("### Agreement of the top 10 (sanity; stemming, idf and length norms differ)");
  lines.push("");
  lines.push(
    `Over ${fmt(ov.counted)} queries with hits (${ov.bothEmpty} with none in either): ` +
      `mean Jaccard ${ov.jaccard.toFixed(3)}, mean recall@10 of Xapian's top 10 in searchr1's ` +
      `${ov.recall.toFixed(3)}, same first hit ${(ov.top1 * 100).toFixed(1)}%.`,
  );
  console.log(lines.join("\n"));
}

await main();
