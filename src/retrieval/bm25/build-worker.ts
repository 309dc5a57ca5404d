import { parentPort, workerData } from "node:worker_threads";
import { BinaryWriter, writeVarint } from "../../runtime/binary-file.js";
import { Analyzer, type AnalyzerOptions } from "../analyzer.js";
import { corpusContents } from "../corpus-batches.js";

/**
 * Index-building worker: analyses batches of corpus lines and buffers (term, row, tf)
 * postings; when the buffer passes its budget it spills a sorted run file. A run holds,
 * per term (sorted by UTF-8 bytes), one segment of postings per batch, so the merge can
 * put segments from all runs in batch order and copy their bytes instead of decoding them.
 *
 * Run file, per term: varint term length, term bytes, varint segment count, then per
 * segment: varint batch id, varint postings, varint last row, varint byte length, postings (varint row gap,
 * varint tf; the first gap is the absolute row).
 */

export interface WorkerSetup {
  analyzer: AnalyzerOptions;
  corpus: string;
  /** Postings buffered before a run is spilled. */
  maxPostings: number;
  /** Where this worker's runs go, as `<prefix><n>.run`. */
  runPrefix: string;
}

export interface BatchMessage {
  type: "batch";
  id: number;
  /** The lines of the batch, as one buffer. */
  bytes: Uint8Array;
  starts: Uint32Array;
  ends: Uint32Array;
  /** Row of the first line (blank lines are not rows). */
  firstRow: number;
  /** 1-based line number of each row in the corpus file, for error messages. */
  lineNumbers: Float64Array;
}

export type ToWorker = BatchMessage | { type: "finish" };

export type FromWorker =
  | { type: "batch-done"; id: number; lengths: Uint32Array }
  | { type: "finished"; runs: string[] }
  | { type: "error"; message: string };

const setup = workerData as WorkerSetup;
const port = parentPort;
if (!port) throw new Error("build-worker must run as a worker thread");

const analyzer = new Analyzer(setup.analyzer);
const decoder = new TextDecoder();
const runs: string[] = [];

// The run being buffered.
let termIds = new Map<string, number>();
let terms: string[] = [];
/** Raw token → term id, or -1 for stop words: one lookup per token on the hot path. */
let tokenIds = new Map<string, number>();
let tids = new Int32Array(1 << 16);
let rows = new Int32Array(1 << 16);
let tfs = new Int32Array(1 << 16);
let count = 0;
/** Batches in this run, in arrival order (ascending rows): id and first row. */
let batchIds: number[] = [];
let batchFirstRows: number[] = [];
// Per-document scratch: where each term of the current document sits in the arrays.
let seenIn = new Int32Array(1 << 12).fill(-1);
let slotOf = new Int32Array(1 << 12);

function grow(): void {
  const n = tids.length * 2;
  const t = new Int32Array(n);
  t.set(tids);
  tids = t;
  const r = new Int32Array(n);
  r.set(rows);
  rows = r;
  const f = new Int32Array(n);
  f.set(tfs);
  tfs = f;
}

function termId(token: string): number {
  let id = tokenIds.get(token);
  if (id !== undefined) return id;
  const term = analyzer.term(token);
  if (term === null) id = -1;
  else {
    id = termIds.get(term);
    if (id === undefined) {
      id = terms.length;
      terms.push(term);
      termIds.set(term, id);
      if (id >= seenIn.length) {
        const s = new Int32Array(seenIn.length * 2).fill(-1);
        s.set(seenIn);
        seenIn = s;
        const o = new Int32Array(slotOf.length * 2);
        o.set(slotOf);
        slotOf = o;
      }
    }
  }
  tokenIds.set(token, id);
  return id;
}

const tokens: string[] = [];

/** Adds one document; returns its length (terms after stop words). */
function addDocument(row: number, text: string): number {
  analyzer.tokens(text, tokens);
  let length = 0;
  for (const token of tokens) {
    const id = termId(token);
    if (id < 0) continue;
    length++;
    if (seenIn[id] === row) {
      (tfs[slotOf[id] as number] as number)++;
      continue;
    }
    if (count === tids.length) grow();
    seenIn[id] = row;
    slotOf[id] = count;
    tids[count] = id;
    rows[count] = row;
    tfs[count] = 1;
    count++;
  }
  tokens.length = 0;
  return length;
}

function handleBatch(msg: BatchMessage): Uint32Array {
  const lengths = new Uint32Array(msg.starts.length);
  batchIds.push(msg.id);
  batchFirstRows.push(msg.firstRow);
  for (let i = 0; i < msg.starts.length; i++) {
    const line = decoder.decode(msg.bytes.subarray(msg.starts[i], msg.ends[i]));
    lengths[i] = addDocument(
      msg.firstRow + i,
      corpusContents(line, setup.corpus, msg.lineNumbers[i] as number),
    );
  }
  return lengths;
}

/** Index of the batch holding `row`: the last whose first row is ≤ it. */
function batchOf(row: number): number {
  let lo = 0;
  let hi = batchFirstRows.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if ((batchFirstRows[mid] as number) <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** Writes the buffered postings as a sorted run and starts an empty one. */
function spill(): void {
  if (count === 0) return;
  const nTerms = terms.length;
  // Counting sort by term id keeps each term's postings in row order (stable); rows and
  // frequencies are moved into term order so the write-out below reads them sequentially.
  const starts = new Int32Array(nTerms + 1);
  for (let i = 0; i < count; i++) (starts[(tids[i] as number) + 1] as number)++;
  for (let t = 0; t < nTerms; t++)
    starts[t + 1] = (starts[t + 1] as number) + (starts[t] as number);
  const byTermRow = new Int32Array(count);
  const byTermTf = new Int32Array(count);
  const fill = starts.slice(0, nTerms);
  for (let i = 0; i < count; i++) {
    const at = (fill[tids[i] as number] as number)++;
    byTermRow[at] = rows[i] as number;
    byTermTf[at] = tfs[i] as number;
  }

  const encoded = terms.map((t) => Buffer.from(t, "utf8"));
  const sorted = Array.from({ length: nTerms }, (_, i) => i).sort((a, b) =>
    Buffer.compare(encoded[a] as Buffer, encoded[b] as Buffer),
  );

  const path = `${setup.runPrefix}${runs.length}.run`;
  const out = new BinaryWriter(path);
  let segBuf = Buffer.allocUnsafe(1 << 16);
  for (const t of sorted) {
    const name = encoded[t] as Buffer;
    const from = starts[t] as number;
    const to = starts[t + 1] as number;
    // Split the term's postings into one segment per batch.
    const segments: { batch: number; n: number; last: number; bytes: Buffer }[] = [];
    let i = from;
    while (i < to) {
      const firstRow = byTermRow[i] as number;
      const b = batchOf(firstRow);
      const end = b + 1 < batchFirstRows.length ? (batchFirstRows[b + 1] as number) : Infinity;
      let off = 0;
      let prev = 0;
      let last = firstRow;
      const first = i;
      while (i < to) {
        const row = byTermRow[i] as number;
        if (row >= end) break;
        if (off + 20 > segBuf.length) {
          const bigger = Buffer.allocUnsafe(segBuf.length * 2);
          segBuf.copy(bigger, 0, 0, off);
          segBuf = bigger;
        }
        off = writeVarint(segBuf, off, row - prev);
        off = writeVarint(segBuf, off, byTermTf[i] as number);
        prev = row;
        last = row;
        i++;
      }
      segments.push({
        batch: batchIds[b] as number,
        n: i - first,
        last,
        bytes: Buffer.from(segBuf.subarray(0, off)),
      });
    }
    out.varint(name.length);
    out.bytes(name);
    out.varint(segments.length);
    for (const s of segments) {
      out.varint(s.batch);
      out.varint(s.n);
      out.varint(s.last);
      out.varint(s.bytes.length);
      out.bytes(s.bytes);
    }
  }
  out.close();
  runs.push(path);

  termIds = new Map();
  terms = [];
  tokenIds = new Map();
  count = 0;
  batchIds = [];
  batchFirstRows = [];
  seenIn = new Int32Array(1 << 12).fill(-1);
  slotOf = new Int32Array(1 << 12);
  if (tids.length > 1 << 16) {
    tids = new Int32Array(1 << 16);
    rows = new Int32Array(1 << 16);
    tfs = new Int32Array(1 << 16);
  }
}

port.on("message", (msg: ToWorker) => {
  try {
    if (msg.type === "batch") {
      const lengths = handleBatch(msg);
      if (count >= setup.maxPostings) spill();
      const reply: FromWorker = { type: "batch-done", id: msg.id, lengths };
      port.postMessage(reply, [lengths.buffer as ArrayBuffer]);
    } else {
      spill();
      const reply: FromWorker = { type: "finished", runs };
      port.postMessage(reply);
    }
  } catch (err) {
    const reply: FromWorker = { type: "error", message: (err as Error).message };
    port.postMessage(reply);
  }
});
