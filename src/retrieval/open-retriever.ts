import { readdir, stat } from "node:fs/promises";
import { resolve } from "node:path";
import { CliError, InputError, UsageError } from "../runtime/errors.js";
import { readMeta } from "./bm25/format.js";
import { Bm25Retriever } from "./bm25/retriever.js";
import { type CorpusStore, openCorpusStore } from "./corpus-store.js";
import type { Retriever } from "./retriever.js";

export interface OpenOptions {
  kind: "bm25" | "e5";
  /** Index folder (bm25) or faiss file (e5). */
  index: string;
  /** Corpus jsonl(.gz) the index was built from. */
  corpus: string;
  /** Search threads; null = all cores. */
  threads: number | null;
}

/** What `GET /health` says about the corpus. */
export interface CorpusInfo {
  path: string;
  rows: number;
  bytes: number;
}

export interface OpenedRetriever {
  retriever: Retriever;
  corpus: CorpusStore;
  corpusInfo: CorpusInfo;
  close(): Promise<void>;
}

const BUILD_HINT =
  "build a searchr1 index with `searchr1 build-index --retriever bm25 --corpus <wiki-18.jsonl> --out <dir>`";

/**
 * Opens a retriever and its corpus store, checking that the corpus is the one indexed.
 * Every problem is a one-line error naming the path: a missing folder, a Lucene/Pyserini
 * index (Search-R1's prebuilt BM25 index), an index of another format, another corpus.
 */
export async function openRetriever(options: OpenOptions): Promise<OpenedRetriever> {
  if (options.kind === "e5") {
    throw new UsageError(
      "serve-retriever --retriever e5: dense retrieval is not implemented yet; " +
        `serve a BM25 index with --retriever bm25 (${BUILD_HINT})`,
    );
  }
  const dir = options.index;
  await checkIndexFolder(dir);
  const meta = await readMeta(dir);
  if (meta.counts.documents !== meta.corpus.rows) {
    throw new InputError(
      `${dir}: the index covers ${meta.counts.documents} documents but its corpus has ` +
        `${meta.corpus.rows} rows; rebuild it with searchr1 build-index`,
    );
  }
  // The corpus check is cheap and the likelier mistake: do it before starting threads.
  const corpus = await openCorpusStore(dir, options.corpus, meta.corpus);
  let retriever: Bm25Retriever;
  try {
    retriever = await Bm25Retriever.open(dir, meta, options.threads);
  } catch (err) {
    await corpus.close();
    if (err instanceof CliError) throw err;
    throw new InputError(
      `${dir}: cannot open the BM25 index (${(err as Error).message}); rebuild it with searchr1 build-index`,
    );
  }
  return {
    retriever,
    corpus,
    corpusInfo: { path: resolve(options.corpus), rows: corpus.rows, bytes: meta.corpus.bytes },
    close: async () => {
      await Promise.all([retriever.close(), corpus.close()]);
    },
  };
}

/** Fails clearly on a missing path, a file, or a Lucene index folder. */
async function checkIndexFolder(dir: string): Promise<void> {
  let info: Awaited<ReturnType<typeof stat>>;
  try {
    info = await stat(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") throw new InputError(`${dir}: no such index folder; ${BUILD_HINT}`);
    throw new InputError(`${dir}: cannot read the index folder (${code})`);
  }
  if (!info.isDirectory()) {
    throw new InputError(
      `${dir}: a file, not an index folder (a faiss file such as e5_Flat.index needs ` +
        `--retriever e5, which is not implemented yet); ${BUILD_HINT}`,
    );
  }
  const names = await readdir(dir);
  if (names.some((n) => n.startsWith("segments_") || n === "write.lock")) {
    throw new InputError(
      `${dir}: a Lucene/Pyserini index (segments_* files), such as Search-R1's ` +
        `PeterJinGo/wiki-18-bm25-index; searchr1 cannot read Lucene indexes. Instead ${BUILD_HINT} ` +
        "(BM25 with Pyserini's defaults k1 0.9, b 0.4) and serve that folder",
    );
  }
}
