import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { Analyzer } from "../../src/retrieval/analyzer.js";
import { Bm25Engine, loadShared } from "../../src/retrieval/bm25/engine.js";
import { readMeta } from "../../src/retrieval/bm25/format.js";
import { runCli } from "../helpers/cli.js";
import { generateCorpus, generateQueries } from "./generated-corpus.js";

const K1 = 0.9;
const B = 0.4;

/**
 * Lucene scores with the document length rounded down to 4 significant bits above 24
 * (SmallFloat.intToByte4). The representable lengths are 0..23 and 24 + {0..7, 8·2^s..15·2^s}.
 */
function luceneLength(dl: number): number {
  if (dl < 24) return dl;
  const x = dl - 24;
  if (x < 8) return dl;
  const shift = Math.floor(Math.log2(x)) - 3;
  return 24 + Math.floor(x / 2 ** shift) * 2 ** shift;
}

interface Brute {
  tf: Map<string, number>[];
  length: number[];
  df: Map<string, number>;
  avgdl: number;
}

function bruteIndex(lines: string[]): Brute {
  const a = new Analyzer();
  const tf = lines.map((l) => {
    const m = new Map<string, number>();
    for (const t of a.analyze(JSON.parse(l).contents)) m.set(t, (m.get(t) ?? 0) + 1);
    return m;
  });
  const length = tf.map((m) => [...m.values()].reduce((s, x) => s + x, 0));
  const df = new Map<string, number>();
  for (const m of tf) for (const t of m.keys()) df.set(t, (df.get(t) ?? 0) + 1);
  return { tf, length, df, avgdl: length.reduce((s, x) => s + x, 0) / lines.length };
}

/** Every document scored, sorted best first (ties by row), the top k kept. */
function bruteSearch(ix: Brute, query: string, k: number): { row: number; score: number }[] {
  const counts = new Map<string, number>();
  for (const t of new Analyzer().analyze(query)) counts.set(t, (counts.get(t) ?? 0) + 1);
  const n = ix.tf.length;
  const scored: { row: number; score: number }[] = [];
  ix.tf.forEach((m, row) => {
    let score = 0;
    let matched = false;
    for (const [t, c] of counts) {
      const f = m.get(t);
      const df = ix.df.get(t);
      if (!f || !df) continue;
      matched = true;
      const idf = Math.log(1 + (n - df + 0.5) / (df + 0.5));
      const dl = luceneLength(ix.length[row] as number);
      score += (c * idf * f) / (f + K1 * (1 - B + (B * dl) / ix.avgdl));
    }
    if (matched) scored.push({ row, score });
  });
  scored.sort((x, y) => y.score - x.score || x.row - y.row);
  return scored.slice(0, k);
}

describe("BM25 ranking against a brute-force BM25", () => {
  const dir = mkdtempSync(join(tmpdir(), "searchr1-bm25-rank-"));
  const corpus = generateCorpus(3000);
  const queries = generateQueries(corpus, 300);
  let engine: Bm25Engine;
  let brute: Brute;

  beforeAll(async () => {
    writeFileSync(join(dir, "corpus.jsonl"), `${corpus.join("\n")}\n`);
    // Small memory: many spilled runs from two threads, merged.
    const r = runCli([
      "build-index",
      "--corpus",
      join(dir, "corpus.jsonl"),
      "--out",
      join(dir, "idx"),
      "--threads",
      "2",
      "--memory-mb",
      "0.05",
      "--quiet",
    ]);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    engine = new Bm25Engine(loadShared(join(dir, "idx"), await readMeta(join(dir, "idx"))));
    brute = bruteIndex(corpus);
  });

  it("counts what the corpus holds", async () => {
    const meta = await readMeta(join(dir, "idx"));
    expect(meta.counts.documents).toBe(corpus.length);
    expect(meta.counts.terms).toBe(brute.df.size);
    expect(meta.counts.postings).toBe(brute.tf.reduce((s, m) => s + m.size, 0));
    expect(meta.counts.tokens).toBe(brute.length.reduce((s, x) => s + x, 0));
    expect(meta.bm25).toEqual({ k1: K1, b: B, norms: "lucene-byte4" });
  });

  it("returns the same documents in the same order with the same scores (1e-5)", () => {
    let compared = 0;
    for (const q of queries) {
      for (const k of [1, 3, 10, 50]) {
        const want = bruteSearch(brute, q, k);
        const got = engine.searchOne(q, k);
        expect(
          got.map((h) => h.row),
          `${q} @${k}`,
        ).toEqual(want.map((h) => h.row));
        got.forEach((h, i) => {
          expect(Math.abs(h.score - (want[i]?.score as number))).toBeLessThan(1e-5);
        });
        compared += got.length;
      }
    }
    expect(compared).toBeGreaterThan(1000);
  });

  it("breaks ties by row: duplicated passages come in ascending row order", () => {
    // Row 102 repeats row 5 (see generateCorpus), so any query matching one matches both.
    const text = JSON.parse(corpus[5] as string).contents as string;
    const hits = engine.searchOne(text, 2000);
    const five = hits.findIndex((h) => h.row === 5);
    expect(hits[five + 1]).toEqual({ row: 102, score: hits[five]?.score });
  });

  it("finds nothing for stop words only or unknown words", () => {
    expect(engine.searchOne("the of and", 3)).toEqual([]);
    expect(engine.searchOne("zzzunknownzzz", 3)).toEqual([]);
    expect(engine.searchOne("", 3)).toEqual([]);
  });

  it("builds the same index whatever the threads and memory", () => {
    const r = runCli([
      "build-index",
      "--corpus",
      join(dir, "corpus.jsonl"),
      "--out",
      join(dir, "idx1"),
      "--threads",
      "1",
      "--quiet",
    ]);
    expect(r.code).toBe(0);
    for (const f of ["terms.bin", "terms.tab", "postings.bin", "norms.bin", "corpus.offsets"]) {
      expect(readFileSync(join(dir, "idx1", f)).equals(readFileSync(join(dir, "idx", f))), f).toBe(
        true,
      );
    }
  });
});
