/**
 * What bench/dense/run.ts measures of a search: `searchr1-index serve` driven over its stdio
 * JSON lines (native/src/index/SERVE.md), a process's memory from /proc/<pid>/status, the
 * timing of calls and passes, faiss_bench.py's timings read the same way, and recall.
 */
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { fmt as formatNumber } from "../common.js";

export const fmt = (n: number, digits = 0) => (Number.isFinite(n) ? formatNumber(n, digits) : "—");
export const mib = (bytes: number | undefined) =>
  bytes === undefined ? "—" : fmt(bytes / 2 ** 20);

// ---- memory of a process ----

export interface Rss {
  VmRSS: number;
  RssAnon: number;
  RssFile: number;
}

export function procRss(pid: number): Rss {
  const out: Record<string, number> = {};
  for (const line of readFileSync(`/proc/${pid}/status`, "utf8").split("\n")) {
    const m = /^(VmRSS|RssAnon|RssFile):\s+(\d+) kB/.exec(line);
    if (m) out[m[1] as string] = Number(m[2]) * 1024;
  }
  return out as unknown as Rss;
}

/** VmRSS (RssAnon + RssFile) in MiB. */
export const rssCell = (r: Rss | undefined) =>
  r ? `${mib(r.VmRSS)} (${mib(r.RssAnon)} + ${mib(r.RssFile)})` : "—";

// ---- our side ----

export interface Call {
  /** Top-k row numbers of each query of the call. */
  ids: number[][];
  /** Seconds in this driver from sending the call to having its answer. */
  wall: number;
  /** Seconds the searchr1 process reports for the search itself. */
  search: number;
}

export interface Searcher {
  readonly how: string;
  search(rows: readonly number[], k: number): Promise<Call>;
  rss(): Rss | undefined;
  close(): Promise<void>;
}

interface ServeReply {
  id: number;
  ok: boolean;
  error?: string;
  ids?: number[][];
  search_seconds?: number;
  [key: string]: unknown;
}

/** `searchr1-index serve` over stdio; the request lines for the query rows are made up front. */
export class ServeSearcher implements Searcher {
  readonly how = "serve";
  private child: ChildProcessWithoutNullStreams;
  private waiting = new Map<number, (r: ServeReply) => void>();
  private exited: Promise<number | null>;
  private nextId = 0;
  private stderr = "";

  constructor(
    exe: string,
    args: string[],
    private rowJson: readonly string[],
    env: NodeJS.ProcessEnv,
  ) {
    this.child = spawn(exe, ["serve", ...args], { env, stdio: ["pipe", "pipe", "pipe"] });
    this.child.stderr.on("data", (d: Buffer) => {
      this.stderr += d.toString();
    });
    createInterface({ input: this.child.stdout }).on("line", (line) => {
      const r = JSON.parse(line) as ServeReply;
      const done = this.waiting.get(r.id);
      this.waiting.delete(r.id);
      done?.(r);
    });
    this.exited = new Promise((resolve) => this.child.on("exit", (code) => resolve(code)));
  }

  /**
   * Starts `searchr1-index serve ARGS` and waits for its answer to `info` (the index is open
   * then). `rowJson[r]` is query r as a JSON array, sent as it is.
   */
  static async open(
    exe: string,
    args: string[],
    rowJson: readonly string[],
    env: NodeJS.ProcessEnv,
  ) {
    const s = new ServeSearcher(exe, args, rowJson, env);
    await s.send(`{"op":"info","id":${++s.nextId}}`, s.nextId);
    return s;
  }

  private send(line: string, id: number): Promise<ServeReply> {
    return new Promise((resolve, reject) => {
      this.waiting.set(id, (r) =>
        r.ok
          ? resolve(r)
          : reject(new Error(`searchr1-index serve: ${r.error ?? JSON.stringify(r)}`)),
      );
      this.exited.then((code) =>
        reject(new Error(`searchr1-index serve exited (${code}): ${this.stderr.trim()}`)),
      );
      this.child.stdin.write(`${line}\n`);
    });
  }

  async search(rows: readonly number[], k: number): Promise<Call> {
    const id = ++this.nextId;
    const line = `{"op":"search","id":${id},"k":${k},"vectors":[${rows.map((r) => this.rowJson[r]).join(",")}]}`;
    const t = performance.now();
    const r = await this.send(line, id);
    const wall = (performance.now() - t) / 1000;
    return { ids: r.ids ?? [], wall, search: r.search_seconds ?? Number.NaN };
  }

  rss(): Rss | undefined {
    return this.child.pid === undefined ? undefined : procRss(this.child.pid);
  }

  async close() {
    this.child.stdin.end(`{"op":"shutdown","id":0}\n`);
    await this.exited;
  }
}

// ---- measuring ----

export interface Timing {
  /** Queries per second. */
  qps: number;
  /** Median latency of one call, ms. */
  p50: number;
}

export interface Measured {
  single: { wall: Timing; search: Timing };
  batched: { wall: Timing; search: Timing };
  /** Batch-64 passes run (the median one is reported). */
  passes: number;
  ids: number[][];
  rss?: { loaded?: Rss; searched?: Rss };
}

export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? Number.NaN : (s[(s.length - 1) >> 1] as number);
}

function timing(queries: number, perCall: readonly number[]): Timing {
  return { qps: queries / perCall.reduce((a, b) => a + b, 0), p50: 1000 * median(perCall) };
}

export const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);

/** Seconds after which no new batch-64 pass starts (at least one always runs). */
export const PASS_BUDGET = 15;

/** What one searcher is asked: queries, calls, passes. */
export interface Plan {
  /** Queries 0..single-1 one per call. */
  single: number;
  /** Queries 0..batched-1 in calls of `batch`. */
  batched: number;
  batch: number;
  k: number;
  /** Passes over the batched queries (the median one is reported). */
  repeat: number;
}

/**
 * A warm-up call, `single` queries one per call, then up to `repeat` passes over the first
 * `batched` queries in calls of `batch` (the median pass by wall time); then closes `s`.
 */
export async function measureSearcher(s: Searcher, plan: Plan): Promise<Measured> {
  const { single, batched, batch, k, repeat } = plan;
  const loaded = s.rss();
  await s.search(range(0, Math.min(batch, batched)), k); // warm-up: pages the index in
  const one: Call[] = [];
  for (let q = 0; q < single; q++) one.push(await s.search([q], k));
  const passes: { wall: number; calls: Call[] }[] = [];
  const start = performance.now();
  for (let p = 0; p < repeat; p++) {
    if (p > 0 && (performance.now() - start) / 1000 > PASS_BUDGET) break;
    const calls: Call[] = [];
    for (let q = 0; q < batched; q += batch) {
      calls.push(await s.search(range(q, Math.min(q + batch, batched)), k));
    }
    passes.push({ wall: calls.reduce((a, c) => a + c.wall, 0), calls });
  }
  passes.sort((a, b) => a.wall - b.wall);
  const mid = passes[(passes.length - 1) >> 1] as { calls: Call[] };
  const searched = s.rss();
  await s.close();
  const of = (calls: Call[], n: number, key: "wall" | "search") =>
    timing(
      n,
      calls.map((c) => c[key]),
    );
  return {
    single: { wall: of(one, one.length, "wall"), search: of(one, one.length, "search") },
    batched: { wall: of(mid.calls, batched, "wall"), search: of(mid.calls, batched, "search") },
    passes: passes.length,
    ids: mid.calls.flatMap((c) => c.ids),
    rss: loaded || searched ? { loaded, searched } : undefined,
  };
}

export interface PyPass {
  seconds: number;
  latency_ms: number[];
  passes?: number[];
}

export interface PyTimed {
  single: PyPass;
  batched: PyPass | null;
  ids: number[][];
}

export interface PyRss {
  start: Rss;
  loaded: Rss;
  searched: Rss;
}

export function theirTiming(t: PyTimed, batched: number): Measured {
  const of = (p: PyPass | null, n: number): Timing =>
    p ? { qps: n / p.seconds, p50: median(p.latency_ms) } : { qps: Number.NaN, p50: Number.NaN };
  const single = of(t.single, t.single.latency_ms.length);
  const batch = of(t.batched, batched);
  return {
    single: { wall: single, search: single },
    batched: { wall: batch, search: batch },
    passes: t.batched?.passes?.length ?? 0,
    ids: t.ids.map((l) => l.filter((x) => x >= 0)),
  };
}

/**
 * Mean recall@k of `got` against `truth` (the exact top lists, best first): the share of
 * the exact top k among the first k of `got`, over the queries in `got`.
 */
export function recall(got: number[][], truth: number[][], k: number): number {
  let sum = 0;
  for (const [i, g] of got.entries()) {
    const t = new Set((truth[i] ?? []).slice(0, k));
    let hit = 0;
    for (const x of g.slice(0, k)) if (t.has(x)) hit++;
    sum += hit / Math.max(1, t.size);
  }
  return sum / Math.max(1, got.length);
}

/** Share of queries whose top-k lists are identical (same rows, same order). */
export function identical(a: number[][], b: number[][]): number {
  let same = 0;
  for (const [i, x] of a.entries()) {
    const y = b[i] ?? [];
    if (x.length === y.length && x.every((v, j) => v === y[j])) same++;
  }
  return same / Math.max(1, a.length);
}
