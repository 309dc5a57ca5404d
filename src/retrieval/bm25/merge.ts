import { join } from "node:path";
import { BinaryReader, BinaryWriter, readVarint, writeVarint } from "../../runtime/binary-file.js";
import { FILES, SKIP_BLOCK } from "./format.js";

interface Segment {
  batch: number;
  postings: number;
  last: number;
  bytes: Buffer;
}

/** One run file, positioned on its current term. */
class RunCursor {
  private readonly reader: BinaryReader;
  term: Buffer | null = null;

  constructor(path: string) {
    this.reader = new BinaryReader(path);
    this.advance();
  }

  /** Moves to the next term (null at the end); its segments are read with `segments`. */
  advance(): void {
    if (this.reader.atEnd()) {
      this.term = null;
      this.reader.close();
      return;
    }
    this.term = Buffer.from(this.reader.bytes(this.reader.varint()));
  }

  segments(into: Segment[]): void {
    const n = this.reader.varint();
    for (let i = 0; i < n; i++) {
      const batch = this.reader.varint();
      const postings = this.reader.varint();
      const last = this.reader.varint();
      const bytes = Buffer.from(this.reader.bytes(this.reader.varint()));
      into.push({ batch, postings, last, bytes });
    }
  }
}

/**
 * Merges the workers' sorted runs into the final vocabulary and postings (format.ts).
 * Runs are read sequentially, so memory holds one term's postings, not the index.
 * A segment's first row is absolute; it is re-encoded as a gap from the previous
 * segment's last row and the rest of its bytes are copied unchanged. Walking the copied
 * postings gives each term's largest BM25 saturation tf/(tf + K(dl)) and its skip entries,
 * which let queries prune and jump (engine.ts).
 */
export function mergeRuns(
  runPaths: readonly string[],
  dir: string,
  /** K(dl) = k1·(1 − b + b·dl/avgdl) per norm byte, and each document's norm byte. */
  lengthNorm: Float64Array,
  norms: Uint8Array,
): { terms: number; postings: number } {
  const cursors = runPaths.map((p) => new RunCursor(p)).filter((c) => c.term !== null);
  const heap = new CursorHeap(cursors);
  const termsOut = new BinaryWriter(join(dir, FILES.terms));
  const tableOut = new BinaryWriter(join(dir, FILES.termTable));
  const postingsOut = new BinaryWriter(join(dir, FILES.postings));
  const skipsOut = new BinaryWriter(join(dir, FILES.skips));
  const gap = Buffer.allocUnsafe(10);
  let terms = 0;
  let postings = 0;
  let skipEntries = 0;
  const segments: Segment[] = [];
  while (heap.size > 0) {
    const term = (heap.top() as RunCursor).term as Buffer;
    segments.length = 0;
    while (heap.size > 0 && Buffer.compare((heap.top() as RunCursor).term as Buffer, term) === 0) {
      const c = heap.top() as RunCursor;
      c.segments(segments);
      c.advance();
      heap.replaceTop();
    }
    segments.sort((a, b) => a.batch - b.batch);
    let df = 0;
    for (const s of segments) df += s.postings;
    const start = postingsOut.position;
    const firstSkip = skipEntries;
    let prev = 0;
    let n = 0;
    let maxSat = 0;
    for (const s of segments) {
      const [first, after] = readVarint(s.bytes, 0);
      const gapLen = writeVarint(gap, 0, first - prev);
      // Output offset of input byte i: i − after + gapLen + segStart.
      const shift = postingsOut.position - start + gapLen - after;
      postingsOut.bytes(gap.subarray(0, gapLen));
      postingsOut.bytes(s.bytes.subarray(after));
      let off = after;
      let row = first;
      for (let j = 0; j < s.postings; j++) {
        if (j > 0) {
          const [g, o] = readVarint(s.bytes, off);
          row += g;
          off = o;
        }
        const [tf, o] = readVarint(s.bytes, off);
        off = o;
        const sat = tf / (tf + (lengthNorm[norms[row] as number] as number));
        if (sat > maxSat) maxSat = sat;
        n++;
        if (df > SKIP_BLOCK && (n % SKIP_BLOCK === 0 || n === df)) {
          skipsOut.u32(row);
          skipsOut.u32(off + shift);
          skipEntries++;
        }
      }
      prev = s.last;
    }
    termsOut.bytes(term);
    tableOut.u32(termsOut.position);
    tableOut.u32(df);
    tableOut.u64(start);
    tableOut.f32(maxSat);
    tableOut.u32(firstSkip);
    terms++;
    postings += df;
  }
  termsOut.close();
  tableOut.close();
  postingsOut.close();
  skipsOut.close();
  return { terms, postings };
}

/** Min-heap of run cursors by current term bytes; exhausted cursors drop out. */
class CursorHeap {
  private readonly items: RunCursor[];

  constructor(items: RunCursor[]) {
    this.items = items;
    for (let i = (items.length >> 1) - 1; i >= 0; i--) this.down(i);
  }

  get size(): number {
    return this.items.length;
  }

  top(): RunCursor | undefined {
    return this.items[0];
  }

  /** Restores order after the top cursor advanced (removing it when exhausted). */
  replaceTop(): void {
    const top = this.items[0] as RunCursor;
    if (top.term === null) {
      const last = this.items.pop() as RunCursor;
      if (this.items.length === 0) return;
      this.items[0] = last;
    }
    this.down(0);
  }

  private less(a: RunCursor, b: RunCursor): boolean {
    return Buffer.compare(a.term as Buffer, b.term as Buffer) < 0;
  }

  private down(i: number): void {
    const n = this.items.length;
    let at = i;
    for (;;) {
      const l = 2 * at + 1;
      const r = l + 1;
      let m = at;
      if (l < n && this.less(this.items[l] as RunCursor, this.items[m] as RunCursor)) m = l;
      if (r < n && this.less(this.items[r] as RunCursor, this.items[m] as RunCursor)) m = r;
      if (m === at) return;
      const t = this.items[m] as RunCursor;
      this.items[m] = this.items[at] as RunCursor;
      this.items[at] = t;
      at = m;
    }
  }
}
