/**
 * `npm run bench:dense -- --parts build`: each index type built by searchr1 (the product's
 * build step, src/retrieval/dense/build-faiss-type.ts, which `build-index --faiss-type T` runs
 * once the passages are encoded: `searchr1-index build --from flat.index --type T`) and by
 * faiss (faiss_bench.py `build`: index_factory(d, T, METRIC_INNER_PRODUCT), train, add,
 * write_index), over the same flat file; then each file searched: ours by `searchr1-index
 * serve` at each efSearch / nprobe, with and without `--rescore-from` the flat file, theirs
 * by faiss (faiss_bench.py `search`; rescored by faiss's IndexRefine over the flat index read
 * into memory, k_factor the same). Reported: build times, file sizes, the serve process's
 * memory (own and file-backed), recall@3 and recall@10 against exact search, queries/s; and
 * a projection of each type's file to wiki-18's 21,015,324 vectors. run.ts describes the
 * data, the queries and the ground truth.
 */
import { existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import {
  type BuiltFaissIndex,
  buildFaissType,
} from "../../src/retrieval/dense/build-faiss-type.js";
import { createProgress } from "../../src/runtime/progress.js";
import { table } from "../../src/runtime/table.js";
import { log } from "../common.js";
import {
  fmt,
  type Measured,
  measureSearcher,
  mib,
  type PyRss,
  type PyTimed,
  type Rss,
  recall,
  rssCell,
  ServeSearcher,
  theirTiming,
} from "./measure.js";

/** wiki-18's passages (Search-R1's corpus), the size the projection table scales to. */
export const WIKI18_PASSAGES = 21_015_324;
/** The memory the issue's goal allows for serving wiki-18 (bytes, decimal GB). */
const GOAL_BYTES = 16e9;
/** The recall@3 against exact search the goal asks for. */
const GOAL_RECALL3 = 0.95;

export interface IndexTypesSetup {
  /** searchr1-index. */
  exe: string;
  env: NodeJS.ProcessEnv;
  /** The IndexFlatIP file of the vectors (faiss_bench.py make). */
  flat: string;
  /** Where built files (and their build reports) are kept and found again. */
  dir: string;
  nVectors: number;
  dim: number;
  threads: number;
  /** Query i as a JSON array. */
  rowJson: readonly string[];
  /** Exact top k of every query. */
  exact: number[][];
  k: number;
  batch: number;
  repeat: number;
  /** index_factory strings, built in this order. */
  types: string[];
  /** Those of `types` faiss builds too. */
  faissTypes: Set<string>;
  efs: number[];
  nprobes: number[];
  efConstruction: number;
  /** Candidates rescored per result, one rescored search each (serve's --rescore-candidates, faiss's k_factor). */
  rescores: number[];
  /** faiss_bench.py's arguments for the queries, k, threads, batch and repeats. */
  pyCommon: string[];
  faiss: <T>(args: string[]) => T;
}

interface Built {
  bytes: number;
  seconds: number;
  /** From an earlier run's file (same --work, same parameters). */
  cached: boolean;
}

interface OursBuilt extends Built {
  graphSeconds: number;
}

interface FaissBuilt extends Built {
  train: number;
  add: number;
  write: number;
}

/** One search setting of one type: ours and faiss's. */
interface Served {
  setting: string;
  /** Candidates rescored per result; 0: not rescored. */
  rescore: number;
  ours: Measured;
  theirs?: Measured;
}

const isHnsw = (type: string) => /^HNSW\d+/.test(type);
const isIvf = (type: string) => /^IVF\d+/.test(type);
const fileName = (who: string, type: string, efc: number) =>
  `${who}-${type.replaceAll(",", "_")}${isHnsw(type) ? `-efc${efc}` : ""}.index`;

/** A build's report beside its file: reused when both are there. */
function cachedReport<T>(file: string): T | null {
  const json = `${file}.json`;
  return existsSync(file) && existsSync(json)
    ? (JSON.parse(readFileSync(json, "utf8")) as T)
    : null;
}

async function buildOurs(s: IndexTypesSetup, type: string): Promise<OursBuilt & { file: string }> {
  const file = join(s.dir, fileName("searchr1", type, s.efConstruction));
  const cached = cachedReport<OursBuilt>(file);
  if (cached) return { ...cached, cached: true, file };
  log(`searchr1 build ${type} (build-index's index step) ...`);
  const t = performance.now();
  const r: BuiltFaissIndex = await buildFaissType({
    flat: s.flat,
    out: file,
    faissType: type,
    efConstruction: isHnsw(type) ? s.efConstruction : null,
    threads: s.threads,
    progress: createProgress({ stream: process.stderr, intervalS: 30 }),
  });
  log(`  ${r.seconds.toFixed(1)} s (wall ${((performance.now() - t) / 1000).toFixed(1)} s)`);
  const built: OursBuilt = {
    bytes: statSync(file).size,
    seconds: r.seconds,
    graphSeconds: r.graph_seconds,
    cached: false,
  };
  writeFileSync(`${file}.json`, JSON.stringify(built));
  return { ...built, file };
}

function buildFaiss(s: IndexTypesSetup, type: string): FaissBuilt & { file: string } {
  // IVF…,PQ…np: no polysemous training (ours has none; see the report).
  const factory = isIvf(type) ? `${type}np` : type;
  const file = join(s.dir, fileName("faiss", factory, s.efConstruction));
  const cached = cachedReport<FaissBuilt>(file);
  if (cached) return { ...cached, cached: true, file };
  log(
    `faiss build ${isIvf(type) ? `${type}np` : type} (index_factory, train, add, write_index) ...`,
  );
  const r = s.faiss<{
    train_seconds: number;
    add_seconds: number;
    write_seconds: number;
    seconds: number;
    bytes: number;
  }>([
    "build",
    "--from",
    s.flat,
    "--type",
    factory,
    "--out",
    file,
    "--threads",
    String(s.threads),
    "--ef-construction",
    String(s.efConstruction),
  ]);
  log(`  ${r.seconds.toFixed(1)} s`);
  const built: FaissBuilt = {
    bytes: r.bytes,
    seconds: r.seconds,
    train: r.train_seconds,
    add: r.add_seconds,
    write: r.write_seconds,
    cached: false,
  };
  writeFileSync(`${file}.json`, JSON.stringify(built));
  return { ...built, file };
}

/** The settings a type is searched at: efSearch values, nprobe values, or the one way. */
function settings(
  s: IndexTypesSetup,
  type: string,
): { name: string; serve: string[]; py: string[] }[] {
  if (isHnsw(type)) {
    return s.efs.map((e) => ({
      name: `efSearch ${e}`,
      serve: ["--ef-search", String(e)],
      py: ["--ef", String(e)],
    }));
  }
  if (isIvf(type)) {
    return s.nprobes.map((p) => ({
      name: `nprobe ${p}`,
      serve: ["--nprobe", String(p)],
      py: ["--nprobe", String(p)],
    }));
  }
  return [{ name: "exhaustive", serve: [], py: [] }];
}

interface TypeResult {
  type: string;
  ours: OursBuilt;
  theirs?: FaissBuilt;
  /** faiss's process after read_index and the searches, less before (its index's memory). */
  theirMemory?: number;
  served: Served[];
}

async function measureType(s: IndexTypesSetup, type: string): Promise<TypeResult> {
  const ours = await buildOurs(s, type);
  const theirs = s.faissTypes.has(type) ? buildFaiss(s, type) : undefined;
  const plan = { single: 0, batched: s.rowJson.length, batch: s.batch, k: s.k, repeat: s.repeat };
  const served: Served[] = [];
  let theirMemory: number | undefined;
  for (const rescore of type === "Flat" ? [0] : [0, ...s.rescores]) {
    const ways = settings(s, type);
    type Searched = { rss: PyRss; by: Record<string, PyTimed> };
    let py: Searched | undefined;
    if (theirs) {
      log(`faiss search ${type}${rescore ? " + IndexRefine" : ""} ...`);
      const list = (i: number) => ways.map((w) => w.py[i]).join(",");
      py = s.faiss<Searched>([
        "search",
        "--index",
        theirs.file,
        ...s.pyCommon,
        "--single",
        "0",
        ...(ways[0]?.py.length ? [ways[0].py[0] as string, list(1)] : []),
        ...(rescore ? ["--refine", s.flat, "--k-factor", String(rescore)] : []),
      ]);
      if (!rescore) theirMemory = py.rss.searched.VmRSS - py.rss.start.VmRSS;
    }
    for (const way of ways) {
      log(`searchr1-index serve ${type}, ${way.name}${rescore ? ", rescored" : ""} ...`);
      const args = ["--index", ours.file, "--threads", String(s.threads), ...way.serve];
      if (rescore) {
        args.push("--rescore-from", s.flat, "--rescore-candidates", String(rescore));
      }
      const m = await measureSearcher(
        await ServeSearcher.open(s.exe, args, s.rowJson, s.env),
        plan,
      );
      const t = py?.by[way.py[1] ?? "-"];
      served.push({
        setting: way.name,
        rescore,
        ours: m,
        theirs: t ? theirTiming(t, s.rowJson.length) : undefined,
      });
    }
  }
  return { type, ours, theirs, theirMemory, served };
}

/**
 * Bytes of a file of `type` that do not grow with the vectors: an IVF-PQ's centroids
 * (nlist × d floats) and PQ centroids (2^nbits × d floats); nothing worth counting otherwise.
 */
function fixedBytes(type: string, dim: number): number {
  const m = /^IVF(\d+),PQ\d+(?:x(\d+))?$/.exec(type);
  return m ? (Number(m[1]) + 2 ** Number(m[2] ?? 8)) * dim * 4 : 0;
}

const r3 = (x: number) => x.toFixed(3);
const gb = (bytes: number) => (bytes / 1e9).toFixed(1);
const gib = (bytes: number) => (bytes / 2 ** 30).toFixed(1);

/** The build part's tables and notes (markdown-ready plain text). */
export async function indexTypes(s: IndexTypesSetup): Promise<string[]> {
  const results: TypeResult[] = [];
  for (const type of s.types) results.push(await measureType(s, type));

  const buildRows = results.map((r) => [
    r.type,
    `${r.ours.seconds.toFixed(1)}${r.ours.cached ? "*" : ""}`,
    r.theirs ? `${r.theirs.seconds.toFixed(1)}${r.theirs.cached ? "*" : ""}` : "—",
    r.theirs ? `${(r.theirs.seconds / r.ours.seconds).toFixed(2)}×` : "—",
    mib(r.ours.bytes),
    r.theirs ? mib(r.theirs.bytes) : "—",
    fmt(r.ours.bytes / s.nVectors),
    r.theirMemory === undefined ? "—" : mib(r.theirMemory),
  ]);
  const serveRows: string[][] = [];
  for (const r of results) {
    for (const [i, v] of r.served.entries()) {
      const t = v.theirs;
      const rss: Rss | undefined = v.ours.rss?.searched;
      serveRows.push([
        i === 0 ? r.type : "",
        v.setting,
        v.rescore ? `k·${v.rescore}` : "no",
        rssCell(rss),
        r3(recall(v.ours.ids, s.exact, 3)),
        r3(recall(v.ours.ids, s.exact, s.k)),
        fmt(v.ours.batched.search.qps),
        t ? r3(recall(t.ids, s.exact, 3)) : "—",
        t ? r3(recall(t.ids, s.exact, s.k)) : "—",
        t ? fmt(t.batched.wall.qps) : "—",
        t ? `${(v.ours.batched.search.qps / t.batched.wall.qps).toFixed(2)}×` : "—",
      ]);
    }
  }
  const split = results
    .filter((r) => r.theirs)
    .map((r) => {
      const t = r.theirs as FaissBuilt;
      return `${r.type} ${t.train.toFixed(1)} / ${t.add.toFixed(1)} / ${t.write.toFixed(1)}`;
    });
  const ourGraph = results
    .filter((r) => r.ours.graphSeconds > 0)
    .map((r) => `${r.type} ${r.ours.graphSeconds.toFixed(1)}`);
  const scale = WIKI18_PASSAGES / s.nVectors;
  const flatBytes = statSync(s.flat).size;
  const projectionRows = results.map((r) => {
    const best = (rescore: number) => {
      const rows = r.served.filter((v) => v.rescore === rescore);
      if (rows.length === 0) return "—";
      const scored = rows.map((v) => ({ v, r3: recall(v.ours.ids, s.exact, 3) }));
      const good = scored.find((x) => x.r3 >= GOAL_RECALL3) ?? scored.at(-1);
      return good
        ? `${r3(good.r3)} (${good.v.setting}, ${fmt(good.v.ours.batched.search.qps)} q/s)`
        : "—";
    };
    const fixed = fixedBytes(r.type, s.dim);
    const perVector = (r.ours.bytes - fixed) / s.nVectors;
    const bytes = fixed + perVector * WIKI18_PASSAGES;
    return [
      r.type,
      fmt(perVector),
      gb(bytes),
      gib(bytes),
      best(0),
      ...s.rescores.map(best),
      bytes <= GOAL_BYTES ? "yes" : "no",
    ];
  });
  return [
    "",
    `### Index types: build and serve, ${fmt(s.nVectors)} vectors`,
    "",
    "Build: seconds to build the index from the flat file and write it. searchr1: " +
      "`searchr1-index build --from flat.index --type T` as `build-index --faiss-type T` runs " +
      "it after encoding (the seconds it reports: from the flat file opened to the file " +
      "renamed into place); faiss: index_factory(d, T, METRIC_INNER_PRODUCT), train, add, " +
      `write_index (the vectors already in memory). Both on ${s.threads} threads, HNSW ` +
      `efConstruction ${s.efConstruction} on both sides. * = built by an earlier run with ` +
      "the same --work (its time then). Ratio = faiss / ours. faiss memory: VmRSS of faiss's " +
      "process after read_index and the searches, less before (the index in memory). " +
      "IVF-PQ: faiss builds IVF…,PQ…np, without the polysemous training index_factory adds " +
      "by default (it only renumbers the PQ centroids for polysemous_ht searches, which " +
      "neither side's search uses, and ours leaves it out; it alone took 11 minutes at 5,000 " +
      "vectors on 2 busy cores). faiss train / add / write s: " +
      `${split.join("; ") || "—"}. Our graph s: ${ourGraph.join("; ") || "—"}.`,
    "",
    ...table(
      [
        [
          "type",
          "ours s",
          "faiss s",
          "ratio",
          "ours MiB",
          "faiss MiB",
          "bytes/vector",
          "faiss memory MiB",
        ],
        ...buildRows,
      ],
      new Set([1, 2, 3, 4, 5, 6, 7]),
    ),
    "",
    `Serve: all ${s.rowJson.length} queries in calls of ${s.batch}, k = ${s.k}, the median ` +
      `of up to ${s.repeat} passes. Ours: \`searchr1-index serve\` of our file (its ` +
      "search_seconds); rescore k·N: `--rescore-from flat.index --rescore-candidates N` (the " +
      "index's top k·N rescored exactly from the memory-mapped flat file). Memory: VmRSS " +
      "(RssAnon + RssFile) MiB of the serve process after the searches; RssFile is the " +
      "mapped files' pages (page cache). faiss: its search of its own file; rescored: " +
      "IndexRefine over the flat index read into memory, k_factor N. " +
      "Recall against the exact top k (faiss IndexFlatIP). Ratio = our q/s / faiss's.",
    "",
    ...table(
      [
        [
          "type",
          "setting",
          "rescore",
          "ours memory MiB",
          "ours r@3",
          "ours r@10",
          "ours q/s",
          "faiss r@3",
          "faiss r@10",
          "faiss q/s",
          "ratio",
        ],
        ...serveRows,
      ],
      new Set([4, 5, 6, 7, 8, 9, 10]),
    ),
    "",
    `PROJECTION to wiki-18 (${fmt(WIKI18_PASSAGES)} × ${s.dim} vectors) from this run's ` +
      `files: our file's bytes per vector at ${fmt(s.nVectors)} × ${fmt(WIKI18_PASSAGES)} = ` +
      "the file serve maps and pages in (the RAM to serve it from memory; the process's own " +
      "memory is a few MiB more). Exact for flat and SQ files (a header aside); for HNSW " +
      "the vectors or codes plus the graph's bytes per vector, which M fixes; for IVF-PQ the " +
      "codes and ids per vector plus the centroids and PQ tables once (at this nlist). Recall is NOT " +
      `measured at 21M: it is this run's at ${fmt(s.nVectors)} vectors (HNSW and IVF lose ` +
      "some at a larger n for the same setting). Rescoring reads k·N rows per query of the " +
      `flat file (${gb(flatBytes * scale)} GB at 21M, on disk; only the rows read enter the ` +
      `page cache). Recall@3: the first setting reaching ${GOAL_RECALL3}, else the best.`,
    "",
    ...table(
      [
        [
          "type",
          "bytes/vector",
          "GB at 21M",
          "GiB at 21M",
          "recall@3 at n (no rescore)",
          ...s.rescores.map((n) => `recall@3 at n (rescore k·${n})`),
          "≤ 16 GB",
        ],
        ...projectionRows,
      ],
      new Set([1, 2, 3]),
    ),
  ];
}
