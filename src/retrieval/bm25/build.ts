import { mkdir, rm, stat, writeFile } from "node:fs/promises";
import { availableParallelism } from "node:os";
import { dirname, join, resolve } from "node:path";
import { Worker } from "node:worker_threads";
import { InputError } from "../../runtime/errors.js";
import { packageVersion } from "../../runtime/package-root.js";
import type { Progress } from "../../runtime/progress.js";
import { refuseExisting, replaceDir } from "../../runtime/replace-dir.js";
import { type AnalyzerOptions, DEFAULT_ANALYZER } from "../analyzer.js";
import { corpusBatches, type LineBatch } from "../corpus-batches.js";
import { CorpusStoreWriter, corpusKind, identifyCorpus } from "../corpus-store.js";
import type { BatchMessage, FromWorker, ToWorker, WorkerSetup } from "./build-worker.js";
import {
  FILES,
  FORMAT,
  FORMAT_VERSION,
  type IndexMeta,
  lengthNormTable,
  lengthToNorm,
} from "./format.js";
import { mergeRuns } from "./merge.js";

export interface BuildOptions {
  corpus: string;
  out: string;
  k1: number;
  b: number;
  /** Worker threads analysing documents; null = all cores. */
  threads: number | null;
  /** Memory for buffered postings, all workers together, before they spill runs. */
  memoryMb: number;
  overwrite: boolean;
  analyzer?: AnalyzerOptions;
  progress: Progress;
  signal?: AbortSignal;
}

/**
 * Bytes a buffered posting costs in a worker at its peak: three int32 arrays that grow by
 * doubling, plus two more while a run is sorted for writing.
 */
const BYTES_PER_POSTING = 32;
const MAX_IN_FLIGHT = 2;

/**
 * Builds a BM25 index folder (format.ts) from a jsonl(.gz) corpus: the main thread cuts
 * the corpus into batches and writes the corpus store; worker threads analyse the
 * batches and spill sorted runs; the runs are merged at the end. Everything is written
 * into `<out>.partial-<pid>` and renamed to `out` only when complete.
 */
export async function buildBm25Index(options: BuildOptions): Promise<IndexMeta> {
  const started = Date.now();
  const analyzer = options.analyzer ?? DEFAULT_ANALYZER;
  const out = resolve(options.out);
  await checkPaths(options.corpus, out, options.overwrite);
  const identity = await identifyCorpus(options.corpus);

  const tmp = `${out}.partial-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  await mkdir(join(tmp, "runs"), { recursive: true });
  const threads = Math.max(1, options.threads ?? availableParallelism());
  const budget = options.memoryMb * 2 ** 20;
  const maxPostings = Math.max(1024, Math.floor(budget / threads / BYTES_PER_POSTING));
  const batchBytes = Math.min(4 << 20, Math.max(64 << 10, Math.floor(budget / threads / 16)));

  const pool = new BuildPool(threads, (i) => ({
    analyzer,
    corpus: options.corpus,
    maxPostings,
    runPrefix: join(tmp, "runs", `w${i}-`),
  }));
  const abort = () => pool.fail(new Error("interrupted"));
  options.signal?.addEventListener("abort", abort);
  try {
    const store = new CorpusStoreWriter(tmp, corpusKind(options.corpus));
    const task = options.progress.task("indexing", undefined, "passages");
    let rows = 0;
    let batchId = 0;
    for await (const batch of corpusBatches(options.corpus, batchBytes, options.signal)) {
      storeRows(store, batch);
      await pool.submit(batchId++, batch);
      rows = batch.firstRow + batch.starts.length;
      task.update(pool.rowsDone);
    }
    store.finish(identity.bytes);
    if (rows === 0)
      throw new InputError(
        `${options.corpus}: no rows (expected jsonl lines with "id" and "contents")`,
      );
    const runs = await pool.finish();
    task.update(pool.rowsDone);
    task.finish();

    options.progress.log(`merging ${runs.length} sorted run${runs.length === 1 ? "" : "s"}`);
    const norms = pool.norms.subarray(0, rows);
    const lengthNorm = lengthNormTable(options.k1, options.b, rows, pool.tokens);
    const { terms, postings } = mergeRuns(runs, tmp, lengthNorm, norms);
    await rm(join(tmp, "runs"), { recursive: true, force: true });
    await writeFile(join(tmp, FILES.norms), norms);

    const meta: IndexMeta = {
      format: FORMAT,
      version: FORMAT_VERSION,
      analyzer: {
        tokenizer: "uax29",
        possessive: true,
        lowercase: true,
        stopwords: [...analyzer.stopwords],
        stemmer: analyzer.stem ? "porter" : "none",
      },
      bm25: { k1: options.k1, b: options.b, norms: "lucene-byte4" },
      counts: { documents: rows, terms, postings, tokens: pool.tokens },
      corpus: { path: resolve(options.corpus), rows, ...identity },
      built: {
        at: new Date().toISOString(),
        seconds: (Date.now() - started) / 1000,
        searchr1: packageVersion(),
      },
    };
    await writeFile(join(tmp, FILES.meta), `${JSON.stringify(meta, null, 2)}\n`);
    await replaceDir(tmp, out);
    return meta;
  } catch (err) {
    await pool.close();
    await rm(tmp, { recursive: true, force: true });
    throw err;
  } finally {
    options.signal?.removeEventListener("abort", abort);
  }
}

function storeRows(store: CorpusStoreWriter, batch: LineBatch): void {
  const bytes = Buffer.from(batch.bytes.buffer, batch.bytes.byteOffset, batch.bytes.length);
  for (let i = 0; i < batch.starts.length; i++) {
    store.add(batch.offsets[i] as number, bytes.subarray(batch.starts[i], batch.ends[i]));
  }
}

async function checkPaths(corpus: string, out: string, overwrite: boolean): Promise<void> {
  const info = await stat(corpus).catch(() => null);
  if (!info) throw new InputError(`${corpus}: no such corpus file`);
  if (!info.isFile())
    throw new InputError(`${corpus}: not a file (expected a jsonl or jsonl.gz corpus)`);
  await refuseExisting(out, overwrite);
  await mkdir(dirname(out), { recursive: true });
}

interface PoolWorker {
  worker: Worker;
  inFlight: number;
}

/** Worker threads fed with batches; each batch goes to the least busy worker. */
class BuildPool {
  private readonly workers: PoolWorker[];
  private error: Error | null = null;
  private wake: (() => void) | null = null;
  private finished: string[][] = [];
  norms = new Uint8Array(1 << 16);
  tokens = 0;
  rowsDone = 0;
  private readonly firstRows = new Map<number, number>();

  constructor(n: number, setup: (i: number) => WorkerSetup) {
    const url = new URL("./build-worker.js", import.meta.url);
    this.workers = Array.from({ length: n }, (_, i) => {
      const entry: PoolWorker = { worker: new Worker(url, { workerData: setup(i) }), inFlight: 0 };
      entry.worker.on("message", (msg: FromWorker) => this.onMessage(entry, msg));
      entry.worker.on("error", (err) => this.fail(err));
      return entry;
    });
  }

  fail(err: Error): void {
    this.error ??= err;
    this.notify();
  }

  private notify(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  private onMessage(entry: PoolWorker, msg: FromWorker): void {
    if (msg.type === "error") {
      this.fail(new InputError(msg.message));
      return;
    }
    if (msg.type === "batch-done") {
      entry.inFlight--;
      const first = this.firstRows.get(msg.id) as number;
      this.firstRows.delete(msg.id);
      this.recordLengths(first, msg.lengths);
    } else {
      this.finished.push(msg.runs);
    }
    this.notify();
  }

  private recordLengths(first: number, lengths: Uint32Array): void {
    const need = first + lengths.length;
    if (need > this.norms.length) {
      const bigger = new Uint8Array(Math.max(need, this.norms.length * 2));
      bigger.set(this.norms);
      this.norms = bigger;
    }
    for (let i = 0; i < lengths.length; i++) {
      const len = lengths[i] as number;
      this.norms[first + i] = lengthToNorm(len);
      this.tokens += len;
    }
    this.rowsDone += lengths.length;
  }

  private waitForChange(): Promise<void> {
    return new Promise((resolve) => {
      this.wake = resolve;
    });
  }

  async submit(id: number, batch: LineBatch): Promise<void> {
    for (;;) {
      if (this.error) throw this.error;
      const free = this.workers.reduce((a, b) => (b.inFlight < a.inFlight ? b : a));
      if (free.inFlight < MAX_IN_FLIGHT) {
        free.inFlight++;
        this.firstRows.set(id, batch.firstRow);
        const msg: BatchMessage = {
          type: "batch",
          id,
          bytes: batch.bytes,
          starts: batch.starts,
          ends: batch.ends,
          firstRow: batch.firstRow,
          lineNumbers: batch.lineNumbers,
        };
        free.worker.postMessage(msg satisfies ToWorker, [batch.bytes.buffer as ArrayBuffer]);
        return;
      }
      await this.waitForChange();
    }
  }

  /** Waits for every batch, has each worker spill its last run, and returns all runs. */
  async finish(): Promise<string[]> {
    while (this.workers.some((w) => w.inFlight > 0)) {
      if (this.error) throw this.error;
      await this.waitForChange();
    }
    for (const w of this.workers) w.worker.postMessage({ type: "finish" } satisfies ToWorker);
    while (this.finished.length < this.workers.length) {
      if (this.error) throw this.error;
      await this.waitForChange();
    }
    await this.close();
    return this.finished.flat();
  }

  async close(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.worker.terminate()));
  }
}
