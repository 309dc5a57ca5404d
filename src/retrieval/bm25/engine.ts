import { closeSync, fstatSync, openSync, readFileSync, readSync } from "node:fs";
import { join } from "node:path";
import { Analyzer } from "../analyzer.js";
import type { Hit } from "../retriever.js";
import { FILES, type IndexMeta, idf, normToLength, TERM_RECORD_BYTES } from "./format.js";

/**
 * The parts of an index every search thread needs, in shared memory so that worker
 * threads do not each hold a copy. Postings stay on disk and are read per query (the
 * page cache keeps the hot ones), so memory does not grow with the corpus text.
 */
export interface Bm25Shared {
  dir: string;
  meta: IndexMeta;
  terms: Uint8Array;
  table: Uint32Array;
  norms: Uint8Array;
}

function readShared(path: string): Uint8Array {
  const bytes = readFileSync(path);
  const shared = new Uint8Array(new SharedArrayBuffer(Math.max(bytes.length, 4)), 0, bytes.length);
  shared.set(bytes);
  return shared;
}

export function loadShared(dir: string, meta: IndexMeta): Bm25Shared {
  const table = readShared(join(dir, FILES.termTable));
  const norms = readShared(join(dir, FILES.norms));
  const terms = readShared(join(dir, FILES.terms));
  const where = (what: string) => `${join(dir, what)}: `;
  if (table.length !== meta.counts.terms * TERM_RECORD_BYTES) {
    throw new Error(
      `${where(FILES.termTable)}expected ${meta.counts.terms} terms, the file is truncated or from another index`,
    );
  }
  if (norms.length !== meta.counts.documents) {
    throw new Error(
      `${where(FILES.norms)}expected ${meta.counts.documents} documents, found ${norms.length}`,
    );
  }
  return {
    dir,
    meta,
    terms,
    table: new Uint32Array(table.buffer, 0, table.length / 4),
    norms,
  };
}

/** Exact top-k BM25 over one index, term at a time. One engine per thread. */
export class Bm25Engine {
  private readonly analyzer: Analyzer;
  private readonly fd: number;
  private readonly postingsEnd: number;
  private readonly lengthNorm = new Float64Array(256);
  private readonly acc: Float64Array;
  private readonly touched: Int32Array;
  private readonly encoder = new TextEncoder();
  private buf = Buffer.allocUnsafe(1 << 16);

  constructor(private readonly index: Bm25Shared) {
    const { meta } = index;
    this.analyzer = new Analyzer({
      stopwords: meta.analyzer.stopwords,
      stem: meta.analyzer.stemmer === "porter",
    });
    this.fd = openSync(join(index.dir, FILES.postings), "r");
    this.postingsEnd = fstatSync(this.fd).size;
    const { k1, b } = meta.bm25;
    const avgdl = meta.counts.tokens / Math.max(1, meta.counts.documents);
    for (let n = 0; n < 256; n++) {
      this.lengthNorm[n] = k1 * (1 - b + (b * normToLength(n)) / (avgdl || 1));
    }
    this.acc = new Float64Array(meta.counts.documents);
    this.touched = new Int32Array(meta.counts.documents);
  }

  /** Index of a term in the vocabulary, or -1. */
  lookup(term: string): number {
    const key = this.encoder.encode(term);
    const { terms, table } = this.index;
    let lo = 0;
    let hi = this.index.meta.counts.terms - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      const start = mid === 0 ? 0 : (table[(mid - 1) * 4] as number);
      const end = table[mid * 4] as number;
      const c = compareBytes(terms, start, end, key);
      if (c === 0) return mid;
      if (c < 0) lo = mid + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  private postings(t: number): Buffer {
    const { table } = this.index;
    const start = (table[t * 4 + 2] as number) + (table[t * 4 + 3] as number) * 0x100000000;
    const next = t + 1 < this.index.meta.counts.terms;
    const end = next
      ? (table[t * 4 + 6] as number) + (table[t * 4 + 7] as number) * 0x100000000
      : this.postingsEnd;
    const len = end - start;
    if (len > this.buf.length) this.buf = Buffer.allocUnsafe(Math.max(len, this.buf.length * 2));
    let got = 0;
    while (got < len) {
      const n = readSync(this.fd, this.buf, got, len - got, start + got);
      if (n === 0) throw new Error(`${join(this.index.dir, FILES.postings)}: truncated`);
      got += n;
    }
    return this.buf;
  }

  /** Query terms with their weights: Lucene's bag of words boosts a repeated term by its count. */
  private queryTerms(query: string): { term: number; weight: number }[] {
    const counts = new Map<string, number>();
    for (const t of this.analyzer.analyze(query)) counts.set(t, (counts.get(t) ?? 0) + 1);
    const out: { term: number; weight: number }[] = [];
    const n = this.index.meta.counts.documents;
    for (const [t, count] of counts) {
      const id = this.lookup(t);
      if (id < 0) continue;
      out.push({ term: id, weight: count * idf(n, this.index.table[id * 4 + 1] as number) });
    }
    return out;
  }

  searchOne(query: string, topk: number): Hit[] {
    const { acc, touched, lengthNorm } = this;
    const norms = this.index.norms;
    let nTouched = 0;
    for (const { term, weight } of this.queryTerms(query)) {
      const df = this.index.table[term * 4 + 1] as number;
      const p = this.postings(term);
      let off = 0;
      let row = 0;
      for (let i = 0; i < df; i++) {
        // Two LEB128 varints, decoded inline: this loop is the query's cost.
        let b = p[off++] as number;
        let gap = b & 0x7f;
        for (let s = 128; b >= 0x80; s *= 128) {
          b = p[off++] as number;
          gap += (b & 0x7f) * s;
        }
        b = p[off++] as number;
        let tf = b & 0x7f;
        for (let s = 128; b >= 0x80; s *= 128) {
          b = p[off++] as number;
          tf += (b & 0x7f) * s;
        }
        row += gap;
        const prev = acc[row] as number;
        if (prev === 0) touched[nTouched++] = row;
        acc[row] = prev + (weight * tf) / (tf + (lengthNorm[norms[row] as number] as number));
      }
    }
    const hits = topOf(acc, touched, nTouched, topk);
    for (let i = 0; i < nTouched; i++) acc[touched[i] as number] = 0;
    return hits;
  }

  search(queries: readonly string[], topk: number): Hit[][] {
    return queries.map((q) => this.searchOne(q, topk));
  }

  close(): void {
    closeSync(this.fd);
  }
}

function compareBytes(buf: Uint8Array, start: number, end: number, key: Uint8Array): number {
  const n = Math.min(end - start, key.length);
  for (let i = 0; i < n; i++) {
    const d = (buf[start + i] as number) - (key[i] as number);
    if (d !== 0) return d;
  }
  return end - start - key.length;
}

/** Whether hit (sa, ra) ranks below (sb, rb): lower score, or same score and later row. */
function worse(sa: number, ra: number, sb: number, rb: number): boolean {
  return sa < sb || (sa === sb && ra > rb);
}

/** The k best touched documents, best first: a size-k heap with the worst on top. */
function topOf(acc: Float64Array, touched: Int32Array, n: number, k: number): Hit[] {
  const rows = new Int32Array(k);
  const scores = new Float64Array(k);
  let size = 0;
  for (let i = 0; i < n; i++) {
    const row = touched[i] as number;
    const score = acc[row] as number;
    if (size < k) {
      // sift up
      let at = size++;
      while (at > 0) {
        const parent = (at - 1) >> 1;
        if (!worse(score, row, scores[parent] as number, rows[parent] as number)) break;
        rows[at] = rows[parent] as number;
        scores[at] = scores[parent] as number;
        at = parent;
      }
      rows[at] = row;
      scores[at] = score;
    } else if (worse(scores[0] as number, rows[0] as number, score, row)) {
      // replace the worst, sift down
      let at = 0;
      for (;;) {
        const l = 2 * at + 1;
        if (l >= size) break;
        const r = l + 1;
        const m =
          r < size &&
          worse(scores[r] as number, rows[r] as number, scores[l] as number, rows[l] as number)
            ? r
            : l;
        if (!worse(scores[m] as number, rows[m] as number, score, row)) break;
        rows[at] = rows[m] as number;
        scores[at] = scores[m] as number;
        at = m;
      }
      rows[at] = row;
      scores[at] = score;
    }
  }
  const hits: Hit[] = [];
  for (let i = 0; i < size; i++) hits.push({ row: rows[i] as number, score: scores[i] as number });
  return hits.sort((a, b) => b.score - a.score || a.row - b.row);
}
