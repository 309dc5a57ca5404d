import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import type http from "node:http";
import os from "node:os";
import path from "node:path";
import { type CliResult, type RunningCli, runCli, startServing } from "../helpers/cli.js";
import { type Reply, request } from "../helpers/http.js";

/**
 * Known rows at the start of every generated corpus, so tests can assert exact documents
 * and formatted text. The rest of the corpus is generated text over a made-up vocabulary.
 */
export const KNOWN_ROWS = {
  /** The example from Search-R1's example/case.txt; "Walker" occurs in no other row. */
  paulWalker: 0,
  /** Text of two lines after the title, and non-ASCII characters. */
  zurich: 1,
  /** Rows 2, 3, 4 have the same contents: equal scores, ranked by ascending row. */
  duplicates: [2, 3, 4],
} as const;

export const PAUL_WALKER_CONTENTS =
  '"Paul Walker"\nPaul William Walker IV was an American actor best known for his role as ' +
  "Brian O'Conner in The Fast and the Furious franchise.";
export const ZURICH_CONTENTS =
  '"Zürich"\nZürich is the largest city in Switzerland.\nIt lies at the north end of Lake Zürich.';
export const DUPLICATE_CONTENTS = '"Copy"\nduplicatum duplicatum text that three rows share';

export interface TestIndex {
  /** Temporary folder holding everything below. */
  dir: string;
  /** The corpus jsonl: rows `{"id": "<row>", "contents": "\"Title\"\ntext"}`. */
  corpus: string;
  /** The BM25 index folder, built by `searchr1 build-index`. */
  index: string;
  /** The corpus lines (row n = lines[n]), as written. */
  lines: string[];
  /** Words of the generated vocabulary (each occurs in some rows). */
  vocabulary: string[];
  cleanup(): void;
}

/** Deterministic pseudo-random numbers in [0, 1) (mulberry32). */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Made-up consonant-vowel words: none is an English stop word. */
export function makeVocabulary(size: number, random: () => number): string[] {
  const c = "bdfgklmnprstvz";
  const v = "aeiou";
  const words = new Set<string>();
  while (words.size < size) {
    let w = "";
    for (let i = 0; i < 3; i++) {
      w += c[Math.floor(random() * c.length)];
      w += v[Math.floor(random() * v.length)];
    }
    words.add(w);
  }
  return [...words];
}

/** Writes a corpus of `rows` rows (the KNOWN_ROWS first) in Search-R1's format. */
export function writeTestCorpus(
  file: string,
  rows: number,
  seed = 1,
): { lines: string[]; vocabulary: string[] } {
  const random = seededRandom(seed);
  const vocabulary = makeVocabulary(400, random);
  // Zipf-like word choice: a few common words, a long tail of rare ones.
  const pick = () => vocabulary[Math.floor(vocabulary.length * random() ** 2.5)] as string;
  const contents: string[] = [PAUL_WALKER_CONTENTS, ZURICH_CONTENTS];
  for (const _ of KNOWN_ROWS.duplicates) contents.push(DUPLICATE_CONTENTS);
  while (contents.length < rows) {
    const title = `${pick()} ${pick()}`;
    const words = Array.from({ length: 20 + Math.floor(random() * 60) }, pick);
    contents.push(`"${title}"\n${words.join(" ")}`);
  }
  const lines = contents.map((text, row) => JSON.stringify({ id: String(row), contents: text }));
  writeFileSync(file, `${lines.join("\n")}\n`);
  return { lines, vocabulary };
}

/**
 * A temporary folder with a generated corpus and its BM25 index, built with the real
 * CLI (`searchr1 build-index`). Build it once per test file (beforeAll) and clean up.
 */
export function buildTestIndex(options: { rows?: number; seed?: number } = {}): TestIndex {
  const dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-retrieval-"));
  const corpus = path.join(dir, "corpus.jsonl");
  const index = path.join(dir, "bm25");
  const { lines, vocabulary } = writeTestCorpus(corpus, options.rows ?? 3000, options.seed);
  const r = runCli(["build-index", "--corpus", corpus, "--out", index, "--quiet"]);
  if (r.code !== 0) {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`build-index failed (exit ${r.code}): ${r.stderr}`);
  }
  return {
    dir,
    corpus,
    index,
    lines,
    vocabulary,
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export interface RunningRetriever {
  /** `http://127.0.0.1:<port>/retrieve`, as the server printed it. */
  url: string;
  /** `http://127.0.0.1:<port>`. */
  base: string;
  cli: RunningCli;
  /** SIGTERM, then the exit code and output. */
  stop(): Promise<CliResult>;
}

/**
 * Starts `searchr1 serve-retriever` with `args` (add `--port 0`) as a child process and
 * resolves once it prints the URL it serves at; rejects with its output if it exits first.
 */
export async function startRetrieverServer(
  args: string[],
  timeoutMs = 20_000,
): Promise<RunningRetriever> {
  const { url, cli, stop } = await startServing(
    ["serve-retriever", ...args],
    /serving \S+ retrieval over .* at (http:\/\/\S+\/retrieve)/,
    { timeoutMs },
  );
  return { url, base: url.replace(/\/retrieve$/, ""), cli, stop };
}

// ---- HTTP clients for the retrieval server

export { type Reply, request };

/** POST /retrieve with a JSON value (or a raw string as is). */
export function retrieve(
  base: string,
  body: unknown,
  options: { agent?: http.Agent } = {},
): Promise<Reply> {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  return request(base, "POST", "/retrieve", text, options);
}

export interface ServedIndex {
  ix: TestIndex;
  server: RunningRetriever;
  /** Stops the server and removes the index. */
  close(): Promise<void>;
}

/** A generated corpus, its BM25 index, and `serve-retriever` over it on a free port. */
export async function serveTestIndex(rows = 300): Promise<ServedIndex> {
  const ix = buildTestIndex({ rows });
  const server = await startRetrieverServer([
    "--index",
    ix.index,
    "--corpus",
    ix.corpus,
    "--port",
    "0",
  ]);
  return {
    ix,
    server,
    close: async () => {
      await server.stop();
      ix.cleanup();
    },
  };
}
