/**
 * Benchmark: dense retrieval with searchr1's native faiss-file reader (searchr1-index) against
 * faiss 1.x on the CPU (flat, fp16 flat, HNSW: search speed, recall, memory) and its BERT
 * encoder against Hugging Face transformers, on the same vectors, queries and model, in one
 * run, with the same threads.
 *
 * Usage: npm run build && npm run bench:dense [-- OPTIONS]
 *   --vectors N        database vectors (default 200,000)
 *   --dim D            their dimension (default 768, e5-base-v2's; 200,000 × 768 fp32 = 614 MB)
 *   --queries N        query vectors (default 512)
 *   --data KIND        low-rank (default): unit vectors near a random --rank-dimensional
 *                      subspace (default 32) plus a tenth of isotropic noise, as learned
 *                      embeddings are; uniform: uniform on the sphere (i.i.d. normal
 *                      components), where every neighbour is nearly orthogonal and HNSW
 *                      recall collapses (flat search speed does not depend on it)
 *   --single N         batch-1 queries for the flat and fp16 rows (default 50; every one
 *                      scans the whole index); the HNSW rows use all --queries
 *   --batched N        batch-64 queries for the flat and fp16 rows (default 256); the HNSW
 *                      rows use all --queries
 *   --threads N        threads for every side (default: all cores)
 *   --hnsw-m M         HNSW graph degree (default 32); --ef-construction E (default 40)
 *   --ef LIST          efSearch values (default 16,64,128)
 *   --passages N       encoder rows (default 64); --tokens T tokens per row (default 128)
 *   --encode-batch B   rows per encoder forward on both sides (default 64)
 *   --repeat N         batch-64 passes per search measurement, the median is reported
 *                      (default 3; no new pass starts after 15 s)
 *   --parts LIST       any of flat,fp16,hnsw,encode,build,rerank (default flat,fp16,hnsw,encode)
 *   --types LIST       with build: index_factory strings, separated by spaces or semicolons
 *                      (default "Flat HNSW32 HNSW64 SQ8 SQfp16 HNSW32,SQ8"), then --ivf
 *   --faiss-types LIST those of --types and --ivf that faiss builds and searches too (default
 *                      all; faiss 1.7.3's HNSW build took 4.5-5.3× ours at 100k, about half an
 *                      hour a type at 1M on 2 cores: leave the HNSW types out there)
 *   --ivf TYPE         the IVF-PQ type added last where searchr1-index builds IVF-PQ
 *                      (default IVF{nlist},PQ64, nlist the power of two nearest √n; none:
 *                      leave it out)
 *   --nprobe LIST      IVF lists probed (default 8,32,128)
 *   --rescore LIST     with build: candidates rescored per result from the flat file, one
 *                      rescored search of each type and setting per value (default 4)
 *   --rerank-queries N with rerank: queries (default 64), each with --rerank-candidates N
 *                      passages (default 10), scored in calls of 32 pairs; --rerank-passes N
 *                      timed passes over them on each side, the best reported (default 1)
 *   --work DIR         generated files (default $TMPDIR/searchr1-bench-dense); files made
 *                      earlier with the same parameters are reused
 *   --keep             keep the generated files (deleted at the end otherwise)
 *   --python PATH      a Python with faiss-cpu and numpy, and for the encoder rows torch and
 *                      transformers (default: $DENSE_BENCH_PYTHON, then python3)
 *
 * Inputs (bench/dense/faiss_bench.py `make`, whose docstring has the details): --vectors
 * database vectors and --queries queries from the same --data distribution (numpy, seeded),
 * written by faiss as an IndexFlatIP file, an IndexScalarQuantizer QT_fp16 file (faiss's CPU
 * fp16 flat index) and an IndexHNSWFlat(M, inner product) built by faiss (the build, minutes
 * at the default size on 2 cores, happens once per --work). Both sides search the very same
 * files. Ground truth for recall: faiss IndexFlatIP's exact top k of every query.
 *
 * Our side: `searchr1-index serve --index FILE [--fp16] [--ef-search E] --threads N` (the
 * dense retriever's process; native/src/index/SERVE.md), driven over its stdio JSON lines:
 * one `search` command per call with the query vectors (the request lines are serialised
 * before the clock starts). Reported: wall time per call in this driver (the JSON round trip
 * included) and the `search_seconds` the process reports (the search alone). Where serve is
 * not built, `searchr1-index search --queries` per call, timed by the seconds it prints
 * (process start and index open excluded); the report says which was used. Memory: VmRSS,
 * RssAnon and RssFile from /proc/<pid>/status of the serve process after load and after
 * the searches. The index file is memory-mapped, so its pages count as RssFile: page cache
 * that the kernel shares and can drop, not the process's own memory.
 * Their side: faiss_bench.py `flat`/`search`: faiss.read_index (the whole file into memory),
 * faiss.omp_set_num_threads(N), index.search per call, timed in Python (no JSON); RSS from
 * its own /proc/self/status. Flat fp32 runs three ways: as the pip wheel ships it (its
 * distance_compute_blas_threshold keeps batches off sgemm), and with faiss's classic
 * threshold of 20 on N threads and on 1 (with OPENBLAS_CORETYPE set when the wheel's OpenBLAS
 * does not recognise the CPU: see tunedBlas), the fastest faiss we found. The flat file is
 * also read with IO_FLAG_MMAP_IFC, faiss's own memory-mapped mode, for the memory table.
 * Encoder: a random BERT-base-shaped model (hidden 768, 12 layers, 12 heads, intermediate
 * 3072, vocab 30522, 512 positions) saved by transformers' save_pretrained; --passages rows of
 * --tokens random token ids ([CLS] … [SEP], all-ones mask). Ours: `searchr1-index encode`,
 * best of 2 runs by the seconds it prints (model load excluded). Theirs:
 * bench/dense/hf_encode.py `encode` (AutoModel fp32 + Search-R1's mean pooling + normalize),
 * best of 2 passes after a warm-up. The two sides' embeddings are compared.
 *
 * Index types (--parts build; bench/dense/index_types.ts): each --types index built from the
 * flat file by us, as `build-index --faiss-type T` builds it once the passages are encoded
 * (src/retrieval/dense/build-faiss-type.ts: `searchr1-index build --from flat.index --type
 * T`, its reported seconds), and by faiss (faiss_bench.py `build`: index_factory(d, T,
 * METRIC_INNER_PRODUCT), train, add, write_index, timed), the same efConstruction on both
 * sides; each kept in --work with its build report and reused by a later run. Then every
 * file searched with all --queries in calls of 64 at each --ef (HNSW) or --nprobe (IVF), with
 * and without rescoring the top k·4 exactly from the flat file: ours by `searchr1-index
 * serve --index OURS [--rescore-from flat.index]` (recall, queries/s from its search_seconds,
 * VmRSS own and file-backed after the searches), theirs by faiss_bench.py `search` of faiss's
 * file (IndexRefine over the flat index for the rescored rows). Recall@3 and @10 against the
 * same exact top 10. Then a projection of each type's file size to wiki-18's 21,015,324
 * vectors beside the recall measured here (not at 21M).
 *
 * Reranker (--parts rerank; bench/dense/rerank.ts, which describes it): a cross-encoder of
 * ms-marco-MiniLM-L12-v2's shape scoring Search-R1's rerank workload, ours (CrossEncoder.score,
 * what serve-retriever --reranker runs) against sentence-transformers' CrossEncoder.predict,
 * or the same computation in plain PyTorch where sentence-transformers is not installed. It
 * needs neither faiss nor the vectors, and is reported first.
 *
 * Ratios are competitor time / ours (> 1: searchr1 is faster).
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { availableParallelism, cpus, loadavg, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { CliError } from "../../src/runtime/errors.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { packageRoot } from "../../src/runtime/package-root.js";
import { Rng } from "../../src/runtime/rng.js";
import { table } from "../../src/runtime/table.js";
import { readSafetensors, toFloat32, writeSafetensors } from "../../src/tensors/safetensors.js";
import { log, threadCappedEnv } from "../common.js";
import { indexTypes } from "./index_types.js";
import {
  type Call,
  fmt,
  identical,
  type Measured,
  measureSearcher,
  PASS_BUDGET,
  type PyRss,
  type PyTimed,
  type Rss,
  range,
  recall,
  rssCell,
  type Searcher,
  ServeSearcher,
  theirTiming,
} from "./measure.js";
import { rerank } from "./rerank.js";

const K = 10;
const BATCH = 64;
const SEED = 1;
const BERT = {
  vocab: 30522,
  hidden: 768,
  intermediate: 3072,
  layers: 12,
  heads: 12,
  maxPositions: 512,
};
const CLS = 101;
const SEP = 102;
/** Token ids the random texts draw from: past BERT's [unused] and special tokens. */
const FIRST_WORDPIECE = 999;
const PARTS = ["flat", "fp16", "hnsw", "encode", "build", "rerank"] as const;
type Part = (typeof PARTS)[number];
/** The parts run without --parts (build and rerank take minutes to tens of minutes). */
const DEFAULT_PARTS: Part[] = ["flat", "fp16", "hnsw", "encode"];
/** The index types --parts build measures without --types (IVF added where it is built). */
const DEFAULT_TYPES = ["Flat", "HNSW32", "HNSW64", "SQ8", "SQfp16", "HNSW32,SQ8"];
/** A 1-minute load average at the start from which the report warns that the figures are skewed. */
const BUSY_LOAD = 1;

const { values: opts } = parseArgs({
  options: {
    vectors: { type: "string" },
    dim: { type: "string" },
    data: { type: "string" },
    rank: { type: "string" },
    queries: { type: "string" },
    single: { type: "string" },
    batched: { type: "string" },
    threads: { type: "string" },
    "hnsw-m": { type: "string" },
    "ef-construction": { type: "string" },
    ef: { type: "string" },
    types: { type: "string" },
    "faiss-types": { type: "string" },
    ivf: { type: "string" },
    nprobe: { type: "string" },
    rescore: { type: "string" },
    passages: { type: "string" },
    tokens: { type: "string" },
    "encode-batch": { type: "string" },
    repeat: { type: "string" },
    "rerank-queries": { type: "string" },
    "rerank-candidates": { type: "string" },
    "rerank-passes": { type: "string" },
    parts: { type: "string" },
    work: { type: "string" },
    keep: { type: "boolean", default: false },
    python: { type: "string" },
  },
});

function positiveInt(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value.replaceAll("_", "").replaceAll(",", ""));
  if (!Number.isInteger(n) || n <= 0) {
    console.error(`bench:dense: --${name} expects a positive integer, got ${value}`);
    process.exit(2);
  }
  return n;
}

const nVectors = positiveInt("vectors", opts.vectors, 200_000);
const dim = positiveInt("dim", opts.dim, 768);
const nQueries = positiveInt("queries", opts.queries, 512);
const data = opts.data ?? "low-rank";
if (data !== "low-rank" && data !== "uniform") {
  console.error(`bench:dense: --data must be low-rank or uniform, not ${data}`);
  process.exit(2);
}
const rank = positiveInt("rank", opts.rank, 32);
const nSingle = Math.min(nQueries, positiveInt("single", opts.single, 50));
const nBatched = Math.min(nQueries, positiveInt("batched", opts.batched, 256));
const threads = positiveInt("threads", opts.threads, availableParallelism());
const hnswM = positiveInt("hnsw-m", opts["hnsw-m"], 32);
const efConstruction = positiveInt("ef-construction", opts["ef-construction"], 40);
const efs = (opts.ef ?? "16,64,128").split(",").map((e) => positiveInt("ef", e.trim(), 16));
const passages = positiveInt("passages", opts.passages, 64);
const tokens = positiveInt("tokens", opts.tokens, 128);
const encodeBatch = positiveInt("encode-batch", opts["encode-batch"], 64);
const repeat = positiveInt("repeat", opts.repeat, 3);
const parts = new Set<Part>(
  (opts.parts ?? DEFAULT_PARTS.join(",")).split(",").map((p) => {
    const part = p.trim() as Part;
    if (!PARTS.includes(part)) {
      console.error(`bench:dense: --parts: unknown part '${p}' (known: ${PARTS.join(", ")})`);
      process.exit(2);
    }
    return part;
  }),
);
/** index_factory strings: separated by spaces or semicolons (the strings hold commas). */
const typeList = (value: string) => value.split(/[\s;]+/).filter((t) => t !== "");
const types = typeList(opts.types ?? DEFAULT_TYPES.join(" "));
/** IVF{nlist},PQ{M}: nlist the power of two nearest √n, M 64 sub-vectors (12 floats at d 768). */
const ivfType =
  opts.ivf ?? `IVF${2 ** Math.round(Math.log2(Math.sqrt(nVectors)))},PQ${dim % 64 === 0 ? 64 : 8}`;
if (ivfType !== "none" && !/^IVF\d+,PQ\d+(x\d+)?$/.test(ivfType)) {
  console.error(`bench:dense: --ivf expects IVF{nlist},PQ{M}[x{nbits}] or none, not ${ivfType}`);
  process.exit(2);
}
const faissTypes = new Set(
  opts["faiss-types"] === undefined ? [...types, ivfType] : typeList(opts["faiss-types"]),
);
for (const t of faissTypes) {
  if (!types.includes(t) && t !== ivfType) {
    console.error(`bench:dense: --faiss-types: ${t} is neither among --types nor --ivf`);
    process.exit(2);
  }
}
const nprobes = (opts.nprobe ?? "8,32,128")
  .split(",")
  .map((p) => positiveInt("nprobe", p.trim(), 1));
const rescores = (opts.rescore ?? "4").split(",").map((n) => positiveInt("rescore", n.trim(), 4));
if (tokens > BERT.maxPositions || tokens < 2) {
  console.error(`bench:dense: --tokens must be 2..${BERT.maxPositions}`);
  process.exit(2);
}
const work = opts.work ?? join(tmpdir(), "searchr1-bench-dense");
const dataDir = join(
  work,
  `n${nVectors}-d${dim}-q${nQueries}-seed${SEED}-${data === "uniform" ? "uniform" : `rank${rank}`}`,
);
const python = opts.python ?? process.env.DENSE_BENCH_PYTHON ?? "python3";
const benchDir = join(packageRoot(), "bench", "dense");
const childEnv = threadCappedEnv(threads);

const ratio = (theirs: number, ours: number) =>
  Number.isFinite(theirs / ours) ? `${(theirs / ours).toFixed(2)}×` : "—";

// ---- the Python helpers ----

/** Runs a helper; null when its imports are missing (exit 3) or Python is not there. */
function runPython(
  script: string,
  args: string[],
  env: Record<string, string> = {},
): string | null {
  const r = spawnSync(python, [join(benchDir, script), ...args], {
    encoding: "utf8",
    env: { ...childEnv, ...env },
    stdio: ["ignore", "pipe", "inherit"],
    maxBuffer: 1 << 30,
  });
  if (r.error || r.status === 3) return null;
  if (r.status !== 0) throw new Error(`${script} ${args[0]} failed (exit ${r.status})`);
  return r.stdout;
}

function faiss<T>(args: string[], env: Record<string, string> = {}): T {
  const out = runPython("faiss_bench.py", args, env);
  if (out === null) throw new Error("faiss_bench.py: faiss went missing");
  return JSON.parse(out) as T;
}

/** A row of the memory table: before load (ours has no such point), after load, after the searches. */
const rssRow = (name: string, r: { start?: Rss; loaded?: Rss; searched?: Rss } | undefined) => [
  name,
  rssCell(r?.start),
  rssCell(r?.loaded),
  rssCell(r?.searched),
];

// ---- our side without serve ----

/** `searchr1-index search --queries` per call (when serve is not built); its printed seconds. */
class CliSearcher implements Searcher {
  readonly how = "search CLI";
  private calls = 0;

  constructor(
    private exe: string,
    private args: string[],
    private queries: Float32Array,
    private tmp: string,
  ) {}

  async search(rows: readonly number[], k: number): Promise<Call> {
    const q = new Float32Array(rows.length * dim);
    rows.forEach((r, i) => {
      q.set(this.queries.subarray(r * dim, (r + 1) * dim), i * dim);
    });
    const inFile = join(this.tmp, `cli-q-${this.calls}.safetensors`);
    const outFile = join(this.tmp, `cli-out-${this.calls++}.safetensors`);
    await writeSafetensors(inFile, [
      { name: "queries", dtype: "F32", shape: [rows.length, dim], data: q },
    ]);
    const t = performance.now();
    const r = spawnSync(
      this.exe,
      ["search", ...this.args, "--queries", inFile, "--k", String(k), "--out", outFile],
      { encoding: "utf8", env: childEnv },
    );
    const wall = (performance.now() - t) / 1000;
    if (r.status !== 0) throw new Error(`searchr1-index search failed: ${r.stderr.trim()}`);
    const out = JSON.parse(r.stdout) as { seconds: number };
    const ids = (await readSafetensors(outFile)).get("ids")?.data as BigInt64Array;
    rmSync(inFile);
    rmSync(outFile);
    const lists: number[][] = [];
    for (let i = 0; i < rows.length; i++) {
      lists.push(
        Array.from(ids.subarray(i * k, (i + 1) * k), Number).filter((x: number) => x >= 0),
      );
    }
    return { ids: lists, wall, search: out.seconds };
  }

  rss(): Rss | undefined {
    return undefined;
  }

  async close() {}
}

const measureOurs = (s: Searcher, single: number, batched: number) =>
  measureSearcher(s, { single, batched, batch: BATCH, k: K, repeat });

// ---- the run ----

interface FaissVersions {
  faiss: string;
  numpy: string;
  python: string;
  blas_threshold: number;
  openblas: string | null;
}

/**
 * faiss's pip wheel bundles an OpenBLAS whose DYNAMIC_ARCH may not recognise a newer CPU and
 * fall back to old kernels (on an Ice Lake VM: "Prescott", SSE3, about a quarter of the
 * speed). The tuned faiss rows force the kernel set this CPU has (OPENBLAS_CORETYPE).
 */
function tunedBlas(v: FaissVersions): { core?: string; env: Record<string, string> } {
  const picked = /\s(\w+)\s+MAX_THREADS/.exec(v.openblas ?? "")?.[1] ?? "";
  if (!v.openblas || /SkylakeX|Cooperlake|SapphireRapids|Zen/.test(picked)) return { env: {} };
  let flags = "";
  try {
    flags = /^flags\s*:(.*)$/m.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1] ?? "";
  } catch {}
  const core = / avx512f /.test(`${flags} `)
    ? "SkylakeX"
    : / avx2 /.test(`${flags} `) && picked !== "Haswell"
      ? "Haswell"
      : undefined;
  return core ? { core, env: { OPENBLAS_CORETYPE: core } } : { env: {} };
}

function hasCommand(exe: string, command: string, flag?: string): boolean {
  const top = spawnSync(exe, ["--help"], { encoding: "utf8" });
  if (!new RegExp(`^\\s+${command}\\s`, "m").test(top.stdout ?? "")) return false;
  if (!flag) return true;
  const sub = spawnSync(exe, [command, "--help"], { encoding: "utf8" });
  return (sub.stdout ?? "").includes(flag);
}

function findIndexExe(): string {
  try {
    return nativeExecutable("searchr1-index");
  } catch (err) {
    if (!(err instanceof CliError)) throw err;
    console.error(`bench:dense: ${err.message}`);
    process.exit(1);
  }
}

async function main() {
  const exe = findIndexExe();
  if (parts.has("rerank")) {
    const lines = await rerank({
      hasReranker: hasCommand(exe, "serve", "--reranker"),
      py: runPython,
      python,
      threads,
      work,
      keep: opts.keep ?? false,
      queries: positiveInt("rerank-queries", opts["rerank-queries"], 64),
      candidates: positiveInt("rerank-candidates", opts["rerank-candidates"], 10),
      passes: positiveInt("rerank-passes", opts["rerank-passes"], 1),
    });
    console.log(lines.join("\n"));
    parts.delete("rerank");
    if (parts.size === 0) return;
  }
  const fv = runPython("faiss_bench.py", ["check"]);
  if (fv === null) {
    console.log(
      `bench:dense: skipped: it needs faiss-cpu and numpy, the competitor it measures against, in ${python}.\n` +
        "  pip install faiss-cpu numpy torch transformers   (in a venv; then pass --python " +
        "PATH/TO/venv/bin/python or set DENSE_BENCH_PYTHON)",
    );
    process.exit(0);
  }
  const versions = JSON.parse(fv) as FaissVersions;
  const cpu = cpus()[0]?.model.trim() ?? "unknown CPU";
  const loadStart = loadavg() as [number, number, number];
  const hasServe = hasCommand(exe, "serve");
  const hasFp16 = hasServe
    ? hasCommand(exe, "serve", "--fp16")
    : hasCommand(exe, "search", "--fp16");
  const hasEncode = hasCommand(exe, "encode");
  mkdirSync(work, { recursive: true });
  log(
    `work dir: ${work}; searchr1-index: ${exe} (serve: ${hasServe}, fp16: ${hasFp16}, encode: ${hasEncode})`,
  );

  // --- inputs ---
  log(
    `inputs: ${fmt(nVectors)} × ${dim} vectors, ${nQueries} queries` +
      (parts.has("hnsw") ? `, HNSW M=${hnswM} efConstruction=${efConstruction}` : "") +
      " (made once, then reused) ...",
  );
  const made = faiss<{
    flat: string;
    queries: string;
    sq_fp16: string;
    hnsw: string | null;
    hnsw_build_seconds: number | null;
    seconds: number;
  }>([
    "make",
    "--work",
    dataDir,
    "--vectors",
    String(nVectors),
    "--dim",
    String(dim),
    "--queries",
    String(nQueries),
    "--seed",
    String(SEED),
    "--data",
    data,
    "--rank",
    String(rank),
    "--threads",
    String(threads),
    ...(parts.has("hnsw")
      ? ["--hnsw-m", String(hnswM), "--ef-construction", String(efConstruction)]
      : []),
  ]);
  if (made.hnsw_build_seconds !== null) {
    log(`  faiss built the HNSW graph in ${made.hnsw_build_seconds.toFixed(1)} s`);
  }
  const qt = (await readSafetensors(made.queries)).get("queries");
  if (!qt || qt.shape[0] !== nQueries || qt.shape[1] !== dim) {
    throw new Error(`${made.queries}: not [${nQueries}, ${dim}] queries`);
  }
  const queries = toFloat32(qt);
  const rowJson = range(0, nQueries).map((r) =>
    JSON.stringify(Array.from(queries.subarray(r * dim, (r + 1) * dim))),
  );
  const vectorBytes = nVectors * dim * 4;
  const membw = faiss<{ copy_gbps: number; bytes: number }>(["membw"]);

  const open = async (index: string, extra: string[]): Promise<Searcher> => {
    const args = ["--index", index, "--threads", String(threads), ...extra];
    return hasServe
      ? ServeSearcher.open(exe, args, rowJson, childEnv)
      : new CliSearcher(exe, args, queries, dataDir);
  };
  const pyCommon = [
    "--queries",
    made.queries,
    "--k",
    String(K),
    "--threads",
    String(threads),
    "--batch",
    String(BATCH),
    "--repeat",
    String(repeat),
  ];

  const speed: string[][] = [];
  const bandwidth: string[][] = [];
  const memory: string[][] = [];
  const notes: string[] = [];
  let how = hasServe ? "serve" : "search CLI";
  interface Competitor {
    name: string;
    m: Measured;
    recall: string;
  }
  /** Batch 1, then batch 64: our figures once, then each competitor's, with the ratios. */
  const speedRows = (workload: string, ours: Measured, recallOurs: string, cs: Competitor[]) => {
    for (const b of ["single", "batched"] as const) {
      for (const [i, c] of cs.entries()) {
        const o = ours[b];
        const t = c.m[b].wall;
        speed.push([
          i === 0 ? workload : "",
          b === "single" ? "1" : String(BATCH),
          i === 0 ? fmt(o.wall.qps, 1) : "",
          i === 0 ? fmt(o.search.qps, 1) : "",
          i === 0 ? fmt(o.wall.p50, 1) : "",
          i === 0 ? recallOurs : "",
          c.name,
          fmt(t.qps, 1),
          fmt(t.p50, 1),
          c.recall,
          ratio(o.wall.qps, t.qps),
          ratio(o.search.qps, t.qps),
        ]);
      }
    }
  };
  /** Effective scan bandwidth: bytes of vectors per call / seconds per call. */
  const scanRows = (workload: string, ours: Measured, cs: Competitor[], bytes: number) => {
    for (const b of ["single", "batched"] as const) {
      const n = b === "single" ? 1 : BATCH;
      const gbps = (qps: number) => (bytes * qps) / n / 1e9;
      for (const [i, c] of cs.entries()) {
        bandwidth.push([
          i === 0 ? workload : "",
          String(n),
          i === 0 ? fmt(gbps(ours[b].search.qps), 1) : "",
          c.name,
          fmt(gbps(c.m[b].wall.qps), 1),
        ]);
      }
    }
  };
  /** faiss_bench.py `flat` on `index`: `single` batch-1 and `batched` batch-64 queries. */
  const flatArgs = (index: string, extra: string[] = [], single = nSingle, batched = nBatched) => [
    "flat",
    "--index",
    index,
    "--single",
    String(single),
    "--batched",
    String(batched),
    ...pyCommon,
    ...extra,
  ];
  // faiss's BLAS path with the kernels this CPU supports (see tunedEnv).
  const tuned = tunedBlas(versions);
  const blasName = (n: number) =>
    `faiss, BLAS from 20 queries${tuned.core ? `, OPENBLAS_CORETYPE=${tuned.core}` : ""}, ` +
    `${n} thread${n === 1 ? "" : "s"}`;

  let exact: number[][] = [];
  if (parts.has("flat") || parts.has("fp16") || parts.has("hnsw") || parts.has("build")) {
    // Ground truth: the exact top k of every query (faiss's BLAS path, the fast one).
    log("exact top k of every query (faiss IndexFlatIP) ...");
    exact = faiss<PyTimed>(
      flatArgs(made.flat, ["--blas-threshold", "20", "--repeat", "1"], 0, nQueries),
      tuned.env,
    ).ids.map((l) => l.filter((x) => x >= 0));
    if (parts.has("flat")) {
      log(`searchr1-index ${how} --index flat.index ...`);
      const ours = await measureOurs(await open(made.flat, []), nSingle, nBatched);
      log(`faiss IndexFlatIP (read_index, as shipped), ${threads} threads ...`);
      const f = faiss<PyTimed & { rss: PyRss }>(flatArgs(made.flat));
      const shipped = theirTiming(f, nBatched);
      const blas: Competitor[] = [];
      for (const n of threads > 1 ? [threads, 1] : [threads]) {
        log(`${blasName(n)} ...`);
        const fb = faiss<PyTimed>(
          flatArgs(made.flat, ["--blas-threshold", "20", "--threads", String(n)]),
          tuned.env,
        );
        blas.push({ name: blasName(n), m: theirTiming(fb, nBatched), recall: "1 (exact)" });
      }
      log("faiss IndexFlatIP, IO_FLAG_MMAP_IFC (memory only) ...");
      const fm = faiss<(PyTimed & { rss: PyRss }) | { skipped: string }>(
        flatArgs(made.flat, ["--mmap"], 0, 0),
      );
      const cs: Competitor[] = [
        { name: "faiss IndexFlatIP, as shipped", m: shipped, recall: "1 (exact)" },
        ...blas,
      ];
      speedRows(
        "flat fp32",
        ours,
        `${recall(ours.ids, exact, K).toFixed(3)} (${(100 * identical(ours.ids, shipped.ids)).toFixed(0)} % = faiss)`,
        cs,
      );
      scanRows("flat fp32", ours, cs, vectorBytes);
      memory.push(
        rssRow("faiss IndexFlatIP, read_index (in memory)", f.rss),
        rssRow("searchr1-index serve --index flat.index (memory-mapped)", ours.rss),
      );
      if ("skipped" in fm)
        notes.push(`faiss IndexFlatIP with IO_FLAG_MMAP_IFC: not measured: ${fm.skipped}.`);
      else memory.push(rssRow("faiss IndexFlatIP, read_index with IO_FLAG_MMAP_IFC", fm.rss));
    }
  }

  if (parts.has("fp16")) {
    if (!hasFp16) {
      notes.push("fp16 flat: not measured: this searchr1-index has no --fp16 yet.");
    } else {
      log(`searchr1-index ${how} --fp16 ...`);
      const ours = await measureOurs(await open(made.flat, ["--fp16"]), nSingle, nBatched);
      log("faiss IndexScalarQuantizer QT_fp16 ...");
      const sq = faiss<PyTimed & { rss: PyRss }>(flatArgs(made.sq_fp16));
      const theirs = theirTiming(sq, nBatched);
      const cs: Competitor[] = [
        {
          name: "faiss IndexScalarQuantizer QT_fp16",
          m: theirs,
          recall: recall(theirs.ids, exact, K).toFixed(3),
        },
      ];
      speedRows("flat fp16", ours, recall(ours.ids, exact, K).toFixed(3), cs);
      scanRows("flat fp16", ours, cs, vectorBytes / 2);
      memory.push(
        rssRow("searchr1-index serve --index flat.index --fp16", ours.rss),
        rssRow("faiss IndexScalarQuantizer QT_fp16, read_index", sq.rss),
      );
    }
  }

  if (parts.has("hnsw") && made.hnsw) {
    log(`faiss IndexHNSWFlat, efSearch ${efs.join("/")} ...`);
    const h = faiss<{ rss: PyRss; by: Record<string, PyTimed> }>([
      "search",
      "--index",
      made.hnsw,
      "--ef",
      efs.join(","),
      ...pyCommon,
    ]);
    for (const [i, ef] of efs.entries()) {
      log(`searchr1-index ${how} --index hnsw --ef-search ${ef} ...`);
      const ours = await measureOurs(
        await open(made.hnsw, ["--ef-search", String(ef)]),
        nQueries,
        nQueries,
      );
      const t = h.by[String(ef)];
      if (!t) throw new Error(`faiss_bench.py search: no efSearch ${ef}`);
      const theirs = theirTiming(t, nQueries);
      speedRows(
        `HNSW M=${hnswM}, efSearch ${ef}`,
        ours,
        `${recall(ours.ids, exact, K).toFixed(3)} (${(100 * identical(ours.ids, theirs.ids)).toFixed(0)} % = faiss)`,
        [
          {
            name: "faiss IndexHNSWFlat",
            m: theirs,
            recall: recall(theirs.ids, exact, K).toFixed(3),
          },
        ],
      );
      if (i === 0) {
        memory.push(
          rssRow(`searchr1-index serve --index hnsw (efSearch ${ef})`, ours.rss),
          rssRow("faiss IndexHNSWFlat, read_index", h.rss),
        );
      }
    }
  }

  // --- index types: built by both, served by both ---
  const typeLines: string[] = [];
  if (parts.has("build")) {
    const ivf =
      ivfType !== "none" && hasCommand(exe, "build", "IVF") && hasCommand(exe, "serve", "--nprobe");
    if (ivfType !== "none" && !ivf) {
      notes.push(`${ivfType}: not measured: this searchr1-index builds no IVF-PQ yet.`);
    }
    const all = ivf ? [...types, ivfType] : types;
    typeLines.push(
      ...(await indexTypes({
        exe,
        env: childEnv,
        flat: made.flat,
        dir: dataDir,
        nVectors,
        dim,
        threads,
        rowJson,
        exact,
        k: K,
        batch: BATCH,
        repeat,
        types: all,
        faissTypes,
        efs,
        nprobes,
        efConstruction,
        rescores,
        pyCommon,
        faiss,
      })),
    );
  }

  // --- encoder ---
  const encoder: string[][] = [];
  let hfVersions: { torch: string; transformers: string; blas: string } | undefined;
  if (parts.has("encode")) {
    const hv = runPython("hf_encode.py", ["check"]);
    if (hv === null) {
      notes.push(`encoder: not measured: ${python} has no torch/transformers.`);
    } else if (!hasEncode) {
      notes.push("encoder: not measured: this searchr1-index has no `encode` command yet.");
    } else {
      hfVersions = JSON.parse(hv);
      const model = join(work, "bert-base-random");
      if (!existsSync(join(model, "config.json"))) {
        log(`writing a random BERT-base-shaped model to ${model} ...`);
        runPython("hf_encode.py", [
          "make",
          "--out",
          model,
          "--vocab",
          String(BERT.vocab),
          "--hidden",
          String(BERT.hidden),
          "--intermediate",
          String(BERT.intermediate),
          "--layers",
          String(BERT.layers),
          "--heads",
          String(BERT.heads),
          "--max-positions",
          String(BERT.maxPositions),
        ]);
      }
      const draw = new Rng(20260524);
      const next = (n: number) => draw.int(n);
      const ids = new BigInt64Array(passages * tokens);
      for (let b = 0; b < passages; b++) {
        for (let t = 0; t < tokens; t++) {
          const id =
            t === 0
              ? CLS
              : t === tokens - 1
                ? SEP
                : FIRST_WORDPIECE + next(BERT.vocab - FIRST_WORDPIECE);
          ids[b * tokens + t] = BigInt(id);
        }
      }
      const input = join(work, `encode-${passages}x${tokens}.safetensors`);
      await writeSafetensors(input, [
        { name: "input_ids", dtype: "I64", shape: [passages, tokens], data: ids },
        {
          name: "attention_mask",
          dtype: "I64",
          shape: [passages, tokens],
          data: new BigInt64Array(passages * tokens).fill(1n),
        },
      ]);
      const oursOut = join(work, "encode-ours.safetensors");
      const theirsOut = join(work, "encode-theirs.safetensors");
      const ourSeconds: number[] = [];
      for (let i = 0; i < 2; i++) {
        log(`searchr1-index encode, ${passages} × ${tokens} tokens (run ${i + 1} of 2) ...`);
        const r = spawnSync(
          exe,
          [
            "encode",
            "--model",
            model,
            "--input",
            input,
            "--out",
            oursOut,
            "--pooling",
            "mean",
            "--batch-size",
            String(encodeBatch),
            "--threads",
            String(threads),
          ],
          { encoding: "utf8", env: childEnv },
        );
        if (r.status !== 0) throw new Error(`searchr1-index encode failed: ${r.stderr.trim()}`);
        ourSeconds.push((JSON.parse(r.stdout) as { seconds: number }).seconds);
      }
      log("transformers AutoModel forward (warm-up + 2 passes) ...");
      const hf = JSON.parse(
        runPython("hf_encode.py", [
          "encode",
          "--model",
          model,
          "--input",
          input,
          "--out",
          theirsOut,
          "--threads",
          String(threads),
          "--batch-size",
          String(encodeBatch),
          "--repeat",
          "2",
        ]) ?? "{}",
      ) as { seconds: number; passes: number[]; attn_implementation: string };
      const embeddings = async (file: string) => {
        const t = (await readSafetensors(file)).get("embeddings");
        if (!t || t.shape[0] !== passages || t.shape[1] !== BERT.hidden) {
          throw new Error(`${file}: no 'embeddings' [${passages}, ${BERT.hidden}]`);
        }
        return toFloat32(t);
      };
      const a = await embeddings(oursOut);
      const b = await embeddings(theirsOut);
      let maxDiff = 0;
      let minCos = 1;
      for (let r = 0; r < passages; r++) {
        let dot = 0;
        for (let c = 0; c < BERT.hidden; c++) {
          const x = a[r * BERT.hidden + c] as number;
          const y = b[r * BERT.hidden + c] as number;
          maxDiff = Math.max(maxDiff, Math.abs(x - y));
          dot += x * y;
        }
        minCos = Math.min(minCos, dot);
      }
      const ours = Math.min(...ourSeconds);
      encoder.push([
        `${passages} × ${tokens}`,
        ours.toFixed(2),
        fmt(passages / ours, 1),
        hf.seconds.toFixed(2),
        fmt(passages / hf.seconds, 1),
        ratio(hf.seconds, ours),
        maxDiff.toExponential(1),
        minCos.toFixed(6),
      ]);
      notes.push(
        `encoder: searchr1 runs ${ourSeconds.map((s) => s.toFixed(2)).join(", ")} s; ` +
          `transformers passes ${hf.passes.map((s) => s.toFixed(2)).join(", ")} s ` +
          `(attention ${hf.attn_implementation}).`,
      );
      rmSync(oursOut, { force: true });
      rmSync(theirsOut, { force: true });
      rmSync(input, { force: true });
    }
  }
  if (!hasServe) how = "search CLI (serve is not built)";

  if (!opts.keep) rmSync(work, { recursive: true, force: true });
  else log(`kept ${work}`);

  // --- report ---
  const loadEnd = loadavg() as [number, number, number];
  const lines: string[] = [
    "",
    `## Dense retrieval: searchr1-index vs faiss ${versions.faiss} (CPU)` +
      (hfVersions ? ` and transformers ${hfVersions.transformers}` : ""),
    "",
    `Machine: ${cpu}, ${availableParallelism()} cores, ${fmt(totalmem() / 2 ** 30, 1)} GiB RAM, ` +
      `${process.platform}/${process.arch}, Node ${process.version}, Python ${versions.python} ` +
      `(${python}), numpy ${versions.numpy}` +
      (hfVersions ? `, PyTorch ${hfVersions.torch} (BLAS ${hfVersions.blas})` : "") +
      `. ${threads} threads for every side. Load average (1/5/15 min) ${loadStart.map((l) => l.toFixed(2)).join("/")} ` +
      `at the start, ${loadEnd.map((l) => l.toFixed(2)).join("/")} at the end ` +
      "(a shared VM: other work on it skews the figures).",
    `Data: ${fmt(nVectors)} × ${dim} fp32 unit vectors (${fmt(vectorBytes / 1e6)} MB), ` +
      `${nQueries} queries from the same distribution (seed ${SEED}): ` +
      (data === "uniform"
        ? "uniform on the sphere (i.i.d. normal components, normalised)"
        : `near a random ${rank}-dimensional subspace (z·A + isotropic noise with a tenth ` +
          "of the energy, normalised; learned embeddings also have a low intrinsic dimension)") +
      "; " +
      `k = ${K}. Batch 1: the first ${nSingle} queries one per call (flat), all ${nQueries} ` +
      `(HNSW). Batch ${BATCH}: the first ${nBatched} (flat) or all ${nQueries} (HNSW) queries ` +
      `in calls of ${BATCH}, the median of up to ${repeat} passes (none started after ` +
      `${PASS_BUDGET} s). Recall@${K} against the exact top ${K} (faiss IndexFlatIP); ` +
      '"= faiss": queries whose top 10 is the same list as faiss\'s on the same file.',
    `searchr1 side: searchr1-index ${how}; "wall" = time per call in this driver, the JSON ` +
      'round trip included; "search" = the search_seconds the process reports (the search ' +
      "alone). faiss side: read_index, then index.search in Python, timed around the call " +
      "(no JSON). p50 = median latency of one call. Ratio = faiss time / ours (> 1: searchr1 " +
      "faster), against our wall and our search time.",
    `faiss "as shipped": the pip wheel's defaults: distance_compute_blas_threshold = ` +
      `${fmt(versions.blas_threshold)} (below that many queries per call IndexFlat scans ` +
      "the vectors once per query with SIMD, never sgemm), and its bundled " +
      `${versions.openblas ?? "BLAS"}. "BLAS from 20 queries": faiss's classic threshold ` +
      "(sgemm over query × vector blocks from 20 queries on)" +
      (tuned.core
        ? `, with OPENBLAS_CORETYPE=${tuned.core}, the kernels this CPU has, since the bundled ` +
          "OpenBLAS does not recognise it"
        : "") +
      "; the best flat configuration of faiss we found on this machine.",
    "",
    ...table(
      [
        [
          "index",
          "batch",
          "ours q/s (wall)",
          "ours q/s (search)",
          "ours p50 ms",
          "ours recall@10",
          "competitor",
          "q/s",
          "p50 ms",
          "recall@10",
          "ratio (wall)",
          "ratio (search)",
        ],
        ...speed,
      ],
      new Set([1, 2, 3, 4, 7, 8, 10, 11]),
    ),
  ];
  if (bandwidth.length > 0) {
    lines.push(
      "",
      "Effective scan bandwidth: bytes of vectors scanned per call / seconds per call (ours: " +
        "its search_seconds). Machine: numpy np.copyto of 512 MiB, one thread, best of 5 " +
        `(bytes copied per second; each is read and written): ${fmt(membw.copy_gbps, 1)} GB/s.`,
      "",
      ...table(
        [["index", "batch", "ours GB/s", "competitor", "GB/s"], ...bandwidth],
        new Set([1, 2, 4]),
      ),
    );
  }
  if (memory.length > 0) {
    lines.push(
      "",
      "Memory (MiB): VmRSS (RssAnon + RssFile) of the process from /proc/<pid>/status. RssFile " +
        "of a memory-mapped index is page cache: shared with other processes and the next " +
        "run, and dropped by the kernel under pressure; RssAnon is the process's own memory.",
      "",
      ...table(
        [["process", "before load", "after load", "after the searches"], ...memory],
        new Set(),
      ),
    );
  }
  if (encoder.length > 0) {
    lines.push(
      "",
      `Encoder: random BERT-base-shaped model (${BERT.layers} layers, hidden ${BERT.hidden}, ` +
        `${BERT.heads} heads, intermediate ${BERT.intermediate}, vocab ${BERT.vocab}), fp32 CPU, ` +
        `mean pooling + L2 normalisation, rows in forwards of ${encodeBatch}. Ours: ` +
        "searchr1-index encode (its printed seconds, load excluded, best of 2 runs); theirs: " +
        "transformers AutoModel forward + Search-R1's pooling (best of 2 passes after a warm-up).",
      "",
      ...table(
        [
          [
            "passages × tokens",
            "ours s",
            "ours passages/s",
            "transformers s",
            "transformers passages/s",
            "ratio",
            "max |Δ embedding|",
            "min cosine",
          ],
          ...encoder,
        ],
        new Set([1, 2, 3, 4, 5, 6, 7]),
      ),
    );
  }
  lines.push(...typeLines);
  if (made.hnsw_build_seconds !== null) {
    notes.push(
      `HNSW graph built by faiss in this run: ${made.hnsw_build_seconds.toFixed(1)} s ` +
        `(${threads} threads; later runs with the same --work reuse it).`,
    );
  }
  if (loadStart[0] >= BUSY_LOAD) {
    notes.push(
      `WARNING: the 1-minute load average was ${loadStart[0].toFixed(2)} at the start: other ` +
        "processes competed for the cores; rerun on an idle machine for figures to quote.",
    );
  }
  if (notes.length > 0) lines.push("", ...notes);
  console.log(lines.join("\n"));
}

await main();
