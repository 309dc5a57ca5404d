import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { z } from "zod";
import { InputError } from "../../runtime/errors.js";

/**
 * The searchr1 BM25 index folder (format version 1). All integers little-endian.
 *
 *   meta.json     what the index is: analyzer, BM25 parameters, counts, corpus identity
 *   terms.bin     the vocabulary: UTF-8 terms concatenated, sorted by their bytes
 *   terms.tab     24 bytes per term, in the same order: u32 end of the term in terms.bin,
 *                 u32 document frequency, u64 start of its postings in postings.bin,
 *                 f32 its largest saturation tf/(tf + K(dl)) (× idf = its best score),
 *                 u32 index of its first entry in skips.bin
 *   postings.bin  per term, per document in ascending row order: varint(row gap) then
 *                 varint(term frequency); the first gap is the row itself. A term's
 *                 postings end where the next term's start (the last: at the end of file).
 *   skips.bin     for each term with more than SKIP_BLOCK postings, one entry per block of
 *                 SKIP_BLOCK postings (the last may be shorter): u32 last row of the block,
 *                 u32 offset just past the block, relative to the term's postings
 *   norms.bin     1 byte per document: its length (terms after stop words) encoded as
 *                 Lucene's SmallFloat.intToByte4, the same lossy norm Lucene scores with
 *   corpus.*      the corpus store (see corpus-store.ts)
 *
 * Varints are LEB128: 7 bits per byte, low bits first, high bit set on all but the last.
 */
export const FORMAT = "searchr1-bm25";
export const FORMAT_VERSION = 1;
export const TERM_RECORD_BYTES = 24;
export const SKIP_BLOCK = 128;

export const FILES = {
  meta: "meta.json",
  terms: "terms.bin",
  termTable: "terms.tab",
  postings: "postings.bin",
  skips: "skips.bin",
  norms: "norms.bin",
} as const;

export const corpusIdentitySchema = z.object({
  /** Path as given at build time (informative; the server checks the rest). */
  path: z.string(),
  kind: z.enum(["jsonl", "jsonl.gz"]),
  bytes: z.number().int().nonnegative(),
  /** sha256 of the file's first and last MiB: tell a different file of the same size apart cheaply. */
  head_sha256: z.string(),
  tail_sha256: z.string(),
  rows: z.number().int().nonnegative(),
});
export type CorpusIdentity = z.infer<typeof corpusIdentitySchema>;

export const metaSchema = z.object({
  format: z.literal(FORMAT),
  version: z.literal(FORMAT_VERSION),
  analyzer: z.object({
    tokenizer: z.literal("uax29"),
    possessive: z.boolean(),
    lowercase: z.boolean(),
    stopwords: z.array(z.string()),
    stemmer: z.enum(["porter", "none"]),
  }),
  bm25: z.object({ k1: z.number(), b: z.number(), norms: z.literal("lucene-byte4") }),
  counts: z.object({
    documents: z.number().int().nonnegative(),
    terms: z.number().int().nonnegative(),
    postings: z.number().int().nonnegative(),
    /** Σ document lengths (Lucene's sumTotalTermFreq); avgdl = tokens / documents. */
    tokens: z.number().int().nonnegative(),
  }),
  corpus: corpusIdentitySchema,
  built: z.object({ at: z.string(), seconds: z.number(), searchr1: z.string() }),
});
export type IndexMeta = z.infer<typeof metaSchema>;

export async function readMeta(dir: string): Promise<IndexMeta> {
  const path = join(dir, FILES.meta);
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") throw new InputError(notAnIndexMessage(dir));
    throw new InputError(`${path}: cannot read (${code})`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new InputError(`${path}: not valid JSON`);
  }
  const parsed = metaSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue?.path.join(".") || "(root)";
    throw new InputError(
      `${path}: not a searchr1 BM25 index of format version ${FORMAT_VERSION} (${where}: ${issue?.message}); rebuild it with searchr1 build-index`,
    );
  }
  return parsed.data;
}

function notAnIndexMessage(dir: string): string {
  return (
    `${dir}: no ${FILES.meta}, so not a searchr1 BM25 index. A Lucene/Pyserini index ` +
    "(such as PeterJinGo/wiki-18-bm25-index) cannot be read; build one with " +
    "`searchr1 build-index --retriever bm25 --corpus <wiki-18.jsonl> --out <dir>`"
  );
}

// Lucene's SmallFloat int4/byte4 codes (org.apache.lucene.util.SmallFloat): lengths below
// 24 are exact, larger ones keep 4 significant bits, rounded down.
function longToInt4(i: number): number {
  const numBits = 32 - Math.clz32(i);
  if (numBits < 4) return i;
  const shift = numBits - 4;
  return ((i >>> shift) & 0x07) | ((shift + 1) << 3);
}

function int4ToLong(i: number): number {
  const bits = i & 0x07;
  const shift = (i >>> 3) - 1;
  return shift === -1 ? bits : (bits | 0x08) * 2 ** shift;
}

const NUM_FREE_VALUES = 255 - longToInt4(0x7fffffff);

/** Document length → norm byte (0..255). */
export function lengthToNorm(length: number): number {
  if (length < NUM_FREE_VALUES) return length;
  return NUM_FREE_VALUES + longToInt4(length - NUM_FREE_VALUES);
}

/** Norm byte → the document length BM25 scores with. */
export function normToLength(norm: number): number {
  if (norm < NUM_FREE_VALUES) return norm;
  return NUM_FREE_VALUES + int4ToLong(norm - NUM_FREE_VALUES);
}

/** K(dl) = k1·(1 − b + b·dl/avgdl) for each norm byte: the length part of every BM25 score. */
export function lengthNormTable(
  k1: number,
  b: number,
  documents: number,
  tokens: number,
): Float64Array {
  const avgdl = documents > 0 && tokens > 0 ? tokens / documents : 1;
  const table = new Float64Array(256);
  for (let n = 0; n < 256; n++) table[n] = k1 * (1 - b + (b * normToLength(n)) / avgdl);
  return table;
}

/** idf as Lucene ≥ 8 computes it: ln(1 + (N − n + 0.5) / (n + 0.5)). */
export function idf(documents: number, df: number): number {
  return Math.log(1 + (documents - df + 0.5) / (df + 0.5));
}
