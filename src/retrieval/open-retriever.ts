import { readdir, stat } from "node:fs/promises";
import { join, resolve } from "node:path";
import type { ServiceError } from "../runtime/errors.js";
import { CliError, InputError, UsageError } from "../runtime/errors.js";
import type { Progress } from "../runtime/progress.js";
import { readMeta } from "./bm25/format.js";
import { Bm25Retriever } from "./bm25/retriever.js";
import { openCachedCorpus } from "./corpus-cache.js";
import { type CorpusStore, openCorpusStore } from "./corpus-store.js";
import { checkEncoderFolder } from "./dense/index-process.js";
import { denseRecipe, type Pooling } from "./dense/recipe.js";
import { DenseRetriever } from "./dense/retriever.js";
import type { Retriever, RetrieverKind } from "./retriever.js";

export interface OpenOptions {
  kind: RetrieverKind;
  /** Index folder (bm25) or faiss file (e5, bge). */
  index: string;
  /** Corpus jsonl(.gz) the index was built from. */
  corpus: string;
  /** Search threads; null = all cores. */
  threads: number | null;
  /** The dense retrievers' settings (ignored for bm25). */
  dense?: DenseSettings;
}

export interface DenseSettings {
  /** Encoder folder; required for a dense retriever. */
  model: string | null;
  pooling: Pooling | null;
  maxLength: number;
  device: "auto" | "cpu" | "cuda";
  efSearch: number | null;
  /** IVF lists probed; null: the native default. */
  nprobe: number | null;
  /** Flat file whose exact vectors rescore the index's candidates; null: none. */
  rescoreFrom: string | null;
  /** Candidates rescored per result (k times this); null: the native default. */
  rescoreCandidates: number | null;
  fp16: boolean;
  /** Search-R1's --faiss_gpu: the index on the GPU(s) (fp16, sharded over `gpus`). */
  faissGpu: boolean;
  gpus: number | null;
  /** Notes for the user (a GPU that cannot be used). */
  log: (line: string) => void;
  /** Where the corpus's row store is kept (corpus-cache.ts). */
  corpusCache: string;
  /** Progress of a first-time corpus scan. */
  progress: Progress;
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
  /** Told if a process the retriever needs dies while serving (dense: the native index). */
  onDeath?(listener: (err: ServiceError) => void): void;
}

const BUILD_HINT =
  "build a searchr1 index with `searchr1 build-index --retriever bm25 --corpus <wiki-18.jsonl> --out <dir>`";

/**
 * Opens a retriever and its corpus store, checking that the corpus is the one indexed.
 * Every problem is a one-line error naming the path: a missing folder, a Lucene/Pyserini
 * index (Search-R1's prebuilt BM25 index), an index of another format, another corpus.
 */
export async function openRetriever(options: OpenOptions): Promise<OpenedRetriever> {
  if (options.kind !== "bm25") return openDense(options, options.kind);
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
    throw new UsageError(
      `${dir}: a file, not a BM25 index folder (a faiss file such as e5_Flat.index is ` +
        "served with --retriever e5 --retriever-model <encoder folder>)",
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

/**
 * A faiss index file with the native encoder and searcher, and the corpus's row store
 * from the cache (made on first use). The index must cover exactly the corpus's rows: its
 * row numbers are the corpus rows, as in Search-R1.
 */
async function openDense(
  options: OpenOptions,
  kind: Exclude<RetrieverKind, "bm25">,
): Promise<OpenedRetriever> {
  const dense = options.dense;
  const flag = `--retriever ${kind}`;
  if (!dense?.model) {
    throw new UsageError(
      `${flag} needs the encoder: set --retriever-model (e.g. a download of intfloat/e5-base-v2)`,
    );
  }
  const info = await stat(options.index).catch(() => null);
  if (!info) throw new InputError(`${options.index}: no such index file`);
  if (info.isDirectory()) {
    const bm25 = await stat(join(options.index, "meta.json")).catch(() => null);
    throw new UsageError(
      `${options.index}: a folder, not a faiss index file${bm25 ? " (a BM25 index: serve it with --retriever bm25)" : ""}`,
    );
  }
  await checkEncoderFolder(dense.model);
  // The index first: a bad file is found before a long first scan of the corpus.
  const open = (device: "auto" | "cpu" | "cuda") =>
    DenseRetriever.open({
      kind,
      index: options.index,
      model: dense.model as string,
      recipe: denseRecipe(kind, { pooling: dense.pooling, maxLength: dense.maxLength }),
      efSearch: dense.efSearch,
      nprobe: dense.nprobe,
      rescoreFrom: dense.rescoreFrom,
      rescoreCandidates: dense.rescoreCandidates,
      fp16: dense.fp16,
      device,
      gpus: device === "cuda" ? dense.gpus : null,
      threads: options.threads,
    });
  let retriever: DenseRetriever;
  if (!dense.faissGpu) retriever = await open(dense.device);
  else {
    try {
      retriever = await open("cuda");
    } catch (err) {
      // Search-R1's launch lines pass --faiss_gpu everywhere: without a usable GPU the
      // search runs on the CPU (exact for Flat files, as on the GPU) after a note.
      if (!(err instanceof UsageError && err.message.startsWith("--device cuda"))) throw err;
      dense.log(`note: --faiss_gpu: ${err.message}; searching on the CPU`);
      retriever = await open(dense.device);
    }
  }
  let corpus: Awaited<ReturnType<typeof openCachedCorpus>>;
  try {
    corpus = await openCachedCorpus(options.corpus, dense.corpusCache, dense.progress);
  } catch (err) {
    await retriever.close();
    throw err;
  }
  if (retriever.documents !== corpus.store.rows) {
    await Promise.all([retriever.close(), corpus.store.close()]);
    throw new InputError(
      `${options.index} holds ${retriever.documents} vectors but ${options.corpus} has ` +
        `${corpus.store.rows} rows: the index's row numbers must be the corpus's rows ` +
        "(serve the corpus the index was built from)",
    );
  }
  return {
    retriever,
    corpus: corpus.store,
    corpusInfo: {
      path: resolve(options.corpus),
      rows: corpus.store.rows,
      bytes: corpus.identity.bytes,
    },
    close: async () => {
      await Promise.all([retriever.close(), corpus.store.close()]);
    },
    onDeath: (listener) => retriever.onDeath(listener),
  };
}
