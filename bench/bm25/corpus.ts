/**
 * Deterministic synthetic corpus for the BM25 benchmark: wiki-18-shaped jsonl rows
 * (`{"id": "123", "contents": "\"Title\"\ntext..."}`) whose words follow a Zipf law over
 * an English-ish vocabulary. Word forms are stems plus suffixes ("-s", "-ed", "-ing",
 * "-ation", ...), so a stemmer conflates some of them; the most frequent ranks are real
 * English function words, Lucene's stop words among them.
 */
import { closeSync, existsSync, openSync, renameSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { Rng } from "../../src/runtime/rng.js";

/** Bump when the generator changes, so that a cached corpus is not reused. */
const GENERATOR_VERSION = 2;

export interface CorpusParams {
  passages: number;
  /** Distinct word forms. */
  vocab: number;
  /** Zipf exponent s: P(rank r) ∝ r^-s. */
  exponent: number;
  minWords: number;
  maxWords: number;
  seed: number;
}

export const DEFAULT_CORPUS: CorpusParams = {
  passages: 1_000_000,
  vocab: 300_000,
  exponent: 1.07,
  minWords: 60,
  maxWords: 120,
  seed: 42,
};

/** Uniform floats in [0, 1) from the project's seeded generator (src/runtime/rng.ts). */
function rng(seed: number): () => number {
  const r = new Rng(seed);
  return () => r.uniform();
}

// The top ranks: English function words in roughly their Wikipedia order. All 33 of
// Lucene's stop words are here, so both engines drop the same frequent tokens.
// biome-ignore format: one list
const FUNCTION_WORDS = [
  "the", "of", "and", "in", "to", "a", "was", "is", "for", "as", "on", "by", "with", "he",
  "that", "at", "from", "his", "it", "an", "were", "are", "which", "this", "also", "be",
  "has", "or", "had", "first", "one", "their", "its", "new", "after", "but", "who", "not",
  "they", "have", "her", "she", "two", "been", "other", "when", "there", "all", "into",
  "more", "during", "may", "only", "would", "most", "some", "such", "where", "these",
  "then", "no", "if", "will", "than", "between", "about", "over", "under", "while",
];

// biome-ignore format: tables
const ONSETS = [
  "", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
  "z", "br", "cr", "dr", "fr", "gr", "pr", "tr", "bl", "cl", "fl", "gl", "pl", "sl", "ch",
  "sh", "th", "st", "sp", "sc", "qu", "wh",
];
// biome-ignore format: tables
const VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ea", "ee", "ou", "oo", "io", "y"];
// biome-ignore format: tables
const CODAS = [
  "", "", "", "n", "r", "l", "s", "t", "m", "nd", "nt", "st", "rk", "ck", "ng", "rt", "ll",
  "ss", "x", "ct", "mp", "lt",
];
// Suffixes that Porter strips or rewrites ("" = the bare stem).
// biome-ignore format: tables
const SUFFIXES = [
  "s", "ed", "ing", "er", "ers", "ly", "ness", "ment", "ments", "ation", "ations", "ive",
  "ity", "al", "ally", "ful", "less", "ism", "ist", "ists", "es", "ize", "izes", "ized",
  "able", "ency", "ent", "ence", "ional", "ousness",
];

function pick<T>(r: () => number, xs: readonly T[]): T {
  return xs[Math.floor(r() * xs.length)] as T;
}

function stem(r: () => number): string {
  const syllables = 1 + Math.floor(r() * r() * 3.2);
  let s = "";
  for (let i = 0; i < syllables; i++) {
    s += (i === 0 ? pick(r, ONSETS) : pick(r, ONSETS.slice(1))) + pick(r, VOWELS);
    if (i === syllables - 1 || r() < 0.4) s += pick(r, CODAS);
  }
  return s.length < 2 ? `${s}x` : s;
}

/**
 * The vocabulary in Zipf-rank order (index 0 = most frequent): function words first,
 * then word forms of random stems, in a shuffled order (so a stem's forms get unrelated
 * frequencies, as "run" and "runner" do).
 */
export function vocabulary(params: CorpusParams): string[] {
  const r = rng(params.seed ^ 0x5bd1e995);
  const seen = new Set<string>(FUNCTION_WORDS);
  const forms: string[] = [];
  const want = params.vocab - FUNCTION_WORDS.length;
  while (forms.length < want) {
    const s = stem(r);
    if (seen.has(s)) continue;
    seen.add(s);
    forms.push(s);
    const extra = Math.floor(r() * 4);
    for (let i = 0; i < extra && forms.length < want; i++) {
      const f = s + pick(r, SUFFIXES);
      if (seen.has(f)) continue;
      seen.add(f);
      forms.push(f);
    }
  }
  for (let i = forms.length - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    const t = forms[i] as string;
    forms[i] = forms[j] as string;
    forms[j] = t;
  }
  return [...FUNCTION_WORDS, ...forms];
}

/** Vose's alias method over Zipf weights: O(1) samples of a rank in [0, n). */
export class ZipfSampler {
  private readonly prob: Float64Array;
  private readonly alias: Int32Array;

  constructor(
    readonly n: number,
    exponent: number,
  ) {
    const w = new Float64Array(n);
    let total = 0;
    for (let i = 0; i < n; i++) {
      w[i] = (i + 1) ** -exponent;
      total += w[i] as number;
    }
    this.prob = new Float64Array(n);
    this.alias = new Int32Array(n);
    const small: number[] = [];
    const large: number[] = [];
    for (let i = 0; i < n; i++) {
      w[i] = ((w[i] as number) * n) / total;
      ((w[i] as number) < 1 ? small : large).push(i);
    }
    while (small.length > 0 && large.length > 0) {
      const s = small.pop() as number;
      const l = large.pop() as number;
      this.prob[s] = w[s] as number;
      this.alias[s] = l;
      w[l] = (w[l] as number) + (w[s] as number) - 1;
      ((w[l] as number) < 1 ? small : large).push(l);
    }
    for (const i of [...small, ...large]) this.prob[i] = 1;
  }

  sample(r: () => number): number {
    const x = r() * this.n;
    const i = Math.floor(x);
    return x - i < (this.prob[i] as number) ? i : (this.alias[i] as number);
  }
}

function capitalize(w: string): string {
  return w.charAt(0).toUpperCase() + w.slice(1);
}

/** Where the corpus for these parameters lives in `work` (one file per parameter set). */
export function corpusPath(work: string, p: CorpusParams): string {
  return join(
    work,
    `corpus-g${GENERATOR_VERSION}-n${p.passages}-v${p.vocab}-s${p.exponent}-w${p.minWords}_${p.maxWords}-seed${p.seed}.jsonl`,
  );
}

/**
 * Writes the corpus unless a complete one with the same parameters is already there
 * (it is written under a temporary name and renamed at the end). Returns its path and
 * whether it was generated now.
 */
export function ensureCorpus(
  work: string,
  params: CorpusParams,
  log: (msg: string) => void,
): { path: string; generated: boolean; seconds: number } {
  const path = corpusPath(work, params);
  if (existsSync(path)) return { path, generated: false, seconds: 0 };
  const started = process.hrtime.bigint();
  const words = vocabulary(params);
  const zipf = new ZipfSampler(words.length, params.exponent);
  const r = rng(params.seed);
  const tmp = `${path}.partial-${process.pid}`;
  const fd = openSync(tmp, "w");
  const span = params.maxWords - params.minWords + 1;
  const chunk: string[] = [];
  for (let id = 0; id < params.passages; id++) {
    // Title: 1-3 capitalised content words (skipping the function-word ranks).
    const titleWords = 1 + Math.floor(r() * 3);
    const title: string[] = [];
    while (title.length < titleWords) {
      const rank = zipf.sample(r);
      if (rank >= FUNCTION_WORDS.length) title.push(capitalize(words[rank] as string));
    }
    const n = params.minWords + Math.floor(r() * span);
    let text = "";
    let sentence = 0;
    for (let i = 0; i < n; i++) {
      let w: string;
      const x = r();
      if (x < 0.015)
        w = String(1000 + Math.floor(r() * 1025)); // years and numbers
      else w = words[zipf.sample(r)] as string;
      if (sentence === 0) {
        w = capitalize(w);
        if (i > 0) text += " ";
      } else text += x > 0.94 ? ", " : " ";
      text += w;
      sentence++;
      if (i === n - 1 || (sentence >= 8 && r() < 0.12)) {
        text += ".";
        sentence = 0;
      }
    }
    const contents = `"${title.join(" ")}"\n${text}`;
    chunk.push(`{"id": "${id}", "contents": ${JSON.stringify(contents)}}\n`);
    if (chunk.length === 10_000 || id === params.passages - 1) {
      writeSync(fd, chunk.join(""));
      chunk.length = 0;
      if ((id + 1) % 200_000 === 0) log(`  generated ${(id + 1).toLocaleString("en-US")} passages`);
    }
  }
  closeSync(fd);
  renameSync(tmp, path);
  writeFileSync(`${path}.params.json`, `${JSON.stringify(params)}\n`);
  return { path, generated: true, seconds: Number(process.hrtime.bigint() - started) / 1e9 };
}

/**
 * Benchmark queries of 2-8 words: each word is drawn from the corpus' Zipf law (common
 * words, stop words included) with probability 0.7, otherwise uniformly from ranks past
 * the first 1,000 (rare words, as names and specific terms are in real questions).
 */
export function makeQueries(params: CorpusParams, count: number, seed: number): string[] {
  const words = vocabulary(params);
  const zipf = new ZipfSampler(words.length, params.exponent);
  const r = rng(seed);
  const out: string[] = [];
  for (let q = 0; q < count; q++) {
    const n = 2 + Math.floor(r() * 7);
    const qs: string[] = [];
    for (let i = 0; i < n; i++) {
      const rank = r() < 0.7 ? zipf.sample(r) : 1000 + Math.floor(r() * (words.length - 1000));
      qs.push(words[rank] as string);
    }
    out.push(qs.join(" "));
  }
  return out;
}
