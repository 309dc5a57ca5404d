import { closeSync, fstatSync, openSync, readFileSync, readSync } from "node:fs";
import { join } from "node:path";
import { Analyzer } from "../analyzer.js";
import type { Hit } from "../retriever.js";
import {
  FILES,
  type IndexMeta,
  idf,
  lengthNormTable,
  SKIP_BLOCK,
  TERM_RECORD_BYTES,
} from "./format.js";
import { TopK } from "./top-k.js";

/**
 * The parts of an index every search thread needs, in shared memory so that worker
 * threads do not each hold a copy. Postings stay on disk and are read per query (the
 * page cache keeps the hot ones), so memory does not grow with the corpus text.
 */
export interface Bm25Shared {
  dir: string;
  meta: IndexMeta;
  terms: Uint8Array;
  /** terms.tab as u32 words (6 per term). */
  table: Uint32Array;
  /** skips.bin as u32 words (2 per entry). */
  skips: Uint32Array;
  norms: Uint8Array;
}

const WORDS = TERM_RECORD_BYTES / 4;

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
  const skips = readShared(join(dir, FILES.skips));
  if (table.length !== meta.counts.terms * TERM_RECORD_BYTES) {
    throw new Error(
      `${join(dir, FILES.termTable)}: expected ${meta.counts.terms} terms; the file is truncated or from another index`,
    );
  }
  if (norms.length !== meta.counts.documents) {
    throw new Error(
      `${join(dir, FILES.norms)}: expected ${meta.counts.documents} documents, found ${norms.length}`,
    );
  }
  const words = (u: Uint8Array) => new Uint32Array(u.buffer, 0, u.length >>> 2);
  return { dir, meta, terms, table: words(table), skips: words(skips), norms };
}

const END = 0x7fffffff;
/** Bounds are widened by this factor before pruning: f32 maxima and summation order. */
const SLACK = 1 + 1e-6;

/** A query term's position in its postings, decoded one document at a time. */
class Cursor {
  off = 0;
  idx = -1;
  /** The current document (END past the last); 0 before the first, whose gap is its row. */
  row = 0;
  tf = 0;

  constructor(
    private readonly buf: Buffer,
    private readonly df: number,
    /** Index of the term's first skip entry, or -1 for short lists. */
    private readonly skipBase: number,
    private readonly skips: Uint32Array,
    readonly weight: number,
    /** The most this term adds to any document's score. */
    readonly bound: number,
  ) {}

  next(): void {
    if (++this.idx >= this.df) {
      this.row = END;
      return;
    }
    const p = this.buf;
    // Two LEB128 varints, decoded inline: this is where queries spend their time.
    let b = p[this.off++] as number;
    let gap = b & 0x7f;
    for (let s = 128; b >= 0x80; s *= 128) {
      b = p[this.off++] as number;
      gap += (b & 0x7f) * s;
    }
    b = p[this.off++] as number;
    let tf = b & 0x7f;
    for (let s = 128; b >= 0x80; s *= 128) {
      b = p[this.off++] as number;
      tf += (b & 0x7f) * s;
    }
    this.row += gap;
    this.tf = tf;
  }

  /** Moves to the first document ≥ target, jumping over whole blocks with the skip entries. */
  advanceTo(target: number): void {
    if (this.row >= target) return;
    if (this.skipBase >= 0) {
      const { skips } = this;
      const blocks = Math.ceil(this.df / SKIP_BLOCK);
      let b = this.idx < 0 ? 0 : Math.floor(this.idx / SKIP_BLOCK);
      if ((skips[2 * (this.skipBase + b)] as number) < target) {
        do b++;
        while (b < blocks && (skips[2 * (this.skipBase + b)] as number) < target);
        if (b >= blocks) {
          this.idx = this.df;
          this.row = END;
          return;
        }
        // Resume just after block b − 1: its last row is the base of the next gap.
        this.row = skips[2 * (this.skipBase + b - 1)] as number;
        this.off = skips[2 * (this.skipBase + b - 1) + 1] as number;
        this.idx = b * SKIP_BLOCK - 1;
      }
    }
    do this.next();
    while (this.row < target);
  }
}

interface BatchCache {
  buffers: Map<number, Buffer>;
  bytes: number;
}
const SHARED_BYTES = 64 << 20;

/**
 * Exact top-k BM25 over one index, document at a time with MaxScore pruning: query terms
 * are ordered by the most they can add to a score; once the k-th best score so far
 * exceeds what the weakest terms together can add, documents that only those terms
 * contain are never visited, and their lists are only consulted (with skips) for
 * documents the stronger terms bring. One engine per thread.
 */
export class Bm25Engine {
  private readonly analyzer: Analyzer;
  private readonly fd: number;
  private readonly postingsEnd: number;
  private readonly lengthNorm: Float64Array;
  private readonly maxSat: Float32Array;
  private readonly encoder = new TextEncoder();

  constructor(private readonly index: Bm25Shared) {
    const { meta } = index;
    this.analyzer = new Analyzer({
      stopwords: meta.analyzer.stopwords,
      stem: meta.analyzer.stemmer === "porter",
    });
    this.fd = openSync(join(index.dir, FILES.postings), "r");
    this.postingsEnd = fstatSync(this.fd).size;
    const { k1, b } = meta.bm25;
    this.lengthNorm = lengthNormTable(k1, b, meta.counts.documents, meta.counts.tokens);
    this.maxSat = new Float32Array(index.table.buffer, 0, index.table.length);
  }

  /** Index of a term in the vocabulary, or -1. */
  lookup(term: string): number {
    const key = this.encoder.encode(term);
    const { terms, table } = this.index;
    let lo = 0;
    let hi = this.index.meta.counts.terms - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      const start = mid === 0 ? 0 : (table[(mid - 1) * WORDS] as number);
      const end = table[mid * WORDS] as number;
      const c = compareBytes(terms, start, end, key);
      if (c === 0) return mid;
      if (c < 0) lo = mid + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  private postingsStart(t: number): number {
    const { table } = this.index;
    if (t >= this.index.meta.counts.terms) return this.postingsEnd;
    return (table[t * WORDS + 2] as number) + (table[t * WORDS + 3] as number) * 0x100000000;
  }

  /**
   * A term's postings bytes. Within one batch of queries they are kept in `shared` (up
   * to SHARED_BYTES) so that a term several queries use is read once.
   */
  private postings(t: number, shared: BatchCache): Buffer {
    const cached = shared.buffers.get(t);
    if (cached) return cached;
    const start = this.postingsStart(t);
    const len = this.postingsStart(t + 1) - start;
    const buf = Buffer.allocUnsafe(len);
    let got = 0;
    while (got < len) {
      const n = readSync(this.fd, buf, got, len - got, start + got);
      if (n === 0) throw new Error(`${join(this.index.dir, FILES.postings)}: truncated`);
      got += n;
    }
    if (shared.bytes + len <= SHARED_BYTES) {
      shared.buffers.set(t, buf);
      shared.bytes += len;
    }
    return buf;
  }

  /** One cursor per distinct query term found: Lucene's bag of words boosts a repeated term by its count. */
  private cursors(query: string, shared: BatchCache): Cursor[] {
    const counts = new Map<string, number>();
    for (const t of this.analyzer.analyze(query)) counts.set(t, (counts.get(t) ?? 0) + 1);
    const { table, skips } = this.index;
    const n = this.index.meta.counts.documents;
    const out: Cursor[] = [];
    for (const [term, count] of counts) {
      const t = this.lookup(term);
      if (t < 0) continue;
      const df = table[t * WORDS + 1] as number;
      const weight = count * idf(n, df);
      const skipBase = df > SKIP_BLOCK ? (table[t * WORDS + 5] as number) : -1;
      const bound = weight * (this.maxSat[t * WORDS + 4] as number);
      const c = new Cursor(this.postings(t, shared), df, skipBase, skips, weight, bound);
      c.next();
      out.push(c);
    }
    return out.sort((a, b) => a.bound - b.bound);
  }

  searchOne(query: string, topk: number, shared: BatchCache = newCache()): Hit[] {
    const cursors = this.cursors(query, shared);
    const n = cursors.length;
    // prefix[i]: the most terms 0..i (the weakest) can add together.
    const prefix = new Float64Array(n);
    let sum = 0;
    for (let i = 0; i < n; i++) {
      sum += (cursors[i] as Cursor).bound;
      prefix[i] = sum * SLACK;
    }
    const { lengthNorm } = this;
    const norms = this.index.norms;
    const top = new TopK(topk);
    // Documents are visited in ascending row order, so a later document that only ties
    // the k-th score ranks below it: pruning at "cannot exceed" keeps ties exact.
    let essential = 0;
    for (;;) {
      let d = END;
      for (let i = essential; i < n; i++) {
        const row = (cursors[i] as Cursor).row;
        if (row < d) d = row;
      }
      if (d === END) break;
      const k = lengthNorm[norms[d] as number] as number;
      let score = 0;
      for (let i = essential; i < n; i++) {
        const c = cursors[i] as Cursor;
        if (c.row !== d) continue;
        score += (c.weight * c.tf) / (c.tf + k);
        c.next();
      }
      let i = essential - 1;
      for (; i >= 0; i--) {
        if (score + (prefix[i] as number) <= top.threshold) break;
        const c = cursors[i] as Cursor;
        c.advanceTo(d);
        if (c.row === d) score += (c.weight * c.tf) / (c.tf + k);
      }
      if (i >= 0 || !top.offer(d, score)) continue;
      while (essential < n && (prefix[essential] as number) <= top.threshold) essential++;
    }
    return top.hits();
  }

  /** A batch of queries, sharing the postings they have in common. */
  search(queries: readonly string[], topk: number): Hit[][] {
    const shared = newCache();
    return queries.map((q) => this.searchOne(q, topk, shared));
  }

  close(): void {
    closeSync(this.fd);
  }
}

function newCache(): BatchCache {
  return { buffers: new Map(), bytes: 0 };
}

function compareBytes(buf: Uint8Array, start: number, end: number, key: Uint8Array): number {
  const n = Math.min(end - start, key.length);
  for (let i = 0; i < n; i++) {
    const d = (buf[start + i] as number) - (key[i] as number);
    if (d !== 0) return d;
  }
  return end - start - key.length;
}
