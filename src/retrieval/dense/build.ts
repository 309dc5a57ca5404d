import { createHash } from "node:crypto";
import { mkdir, readFile, rm, stat } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import { InputError, UsageError } from "../../runtime/errors.js";
import type { Progress } from "../../runtime/progress.js";
import { refuseExisting } from "../../runtime/replace-dir.js";
import { writeFileAtomic } from "../../runtime/write-atomic.js";
import { loadEncoderTokenizer } from "../../text/encoder-tokenizer.js";
import type { TextTokenizer } from "../../text/tokenizer.js";
import { corpusBatches, corpusContents } from "../corpus-batches.js";
import { identifyCorpus } from "../corpus-store.js";
import { buildFaissType, checkFaissType } from "./build-faiss-type.js";
import { checkEncoderFolder, IndexProcess } from "./index-process.js";
import type { DenseRecipe } from "./recipe.js";

export interface DenseBuildOptions {
  corpus: string;
  /** The faiss index file to write (e5_Flat.index). */
  out: string;
  /** index_factory string (Search-R1's --faiss_type): Flat, HNSW64, SQ8, IVF4096,PQ64, ... */
  faissType: string;
  /** HNSW build beam (types with a graph); null otherwise. */
  efConstruction: number | null;
  /** Encoder folder. */
  model: string;
  recipe: DenseRecipe;
  /** Passages per encoder call; each call's rows are durable once it returns. */
  batchSize: number;
  device: "auto" | "cpu" | "cuda";
  threads: number | null;
  overwrite: boolean;
  progress: Progress;
  signal?: AbortSignal;
}

export interface DenseBuildResult {
  rows: number;
  /** faiss's class of the file written (IndexFlatIP, IndexHNSWFlat, ...). */
  type: string;
  /** Rows found already encoded in the partial file (a resumed build). */
  resumedAt: number;
  bytes: number;
  seconds: number;
}

/** What a partial build was started with: a resume must use the same. */
interface BuildState {
  format: "searchr1-dense-build";
  corpus: { path: string; bytes: number; head_sha256: string; tail_sha256: string };
  model: { path: string; config_sha256: string };
  recipe: DenseRecipe;
}

/**
 * Builds an IndexFlatIP file, as Search-R1's index_builder.py does (passage prefix, the
 * encoder's pooling and L2 normalisation, one vector per corpus row in row order), that
 * faiss reads. The corpus is streamed and encoded in batches by the native encoder, which
 * appends each batch's vectors to `<out>.partial` and makes them durable before it
 * answers: an interrupted build (Ctrl-C, a crash, a power cut) resumes from the rows
 * already there when run again with the same settings (`<out>.partial.json` records them).
 * The file appears at `out` only when complete.
 *
 * Another `faissType` (HNSW64, SQ8, ...) is built from those vectors: the encoded flat file
 * is completed at `<out>.flat.partial`, then the native builder (build-faiss-type.ts) makes
 * the index at `out` and the flat file is removed. A build interrupted after the encoding
 * resumes at the index step (the graph itself starts again).
 */
export async function buildDenseIndex(options: DenseBuildOptions): Promise<DenseBuildResult> {
  const started = Date.now();
  const { corpus } = options;
  const out = resolve(options.out);
  const partial = `${out}.partial`;
  const statePath = `${partial}.json`;
  const corpusInfo = await stat(corpus).catch(() => null);
  if (!corpusInfo?.isFile()) {
    throw new InputError(`${corpus}: no such corpus file (expected a jsonl or jsonl.gz corpus)`);
  }
  await refuseExisting(out, options.overwrite);
  await checkEncoderFolder(options.model);
  await mkdir(dirname(out), { recursive: true });
  const native = await IndexProcess.start({
    model: options.model,
    pooling: options.recipe.pooling,
    normalize: options.recipe.normalize,
    device: options.device,
    threads: options.threads,
    signal: options.signal,
  });
  try {
    // Texts are cut to the encoder's positions when the recipe allows more.
    const { info } = native;
    checkFaissType(options.faissType, info.encoder.dim);
    const recipe = {
      ...options.recipe,
      maxLength: Math.min(options.recipe.maxLength, info.encoder.max_position_embeddings),
    };
    const state = await buildState(corpus, options.model, recipe);
    const flat = options.faissType === "Flat" ? out : `${out}.flat.partial`;
    await checkPartial(partial, statePath, state, options.overwrite);
    if (flat !== out) await checkPartial(flat, statePath, state, options.overwrite);
    const encoded = flat !== out && (await exists(flat));
    const tokenizer = loadEncoderTokenizer(options.model, {
      maxLength: recipe.maxLength,
      missing: "the encoder's tokenizer.json (or a BERT vocab.txt) is needed to encode the corpus",
    });
    writeFileAtomic(statePath, `${JSON.stringify(state, null, 2)}\n`);
    let resumedAt = 0;
    if (encoded) {
      options.progress.log(`resuming at the index: ${flat} holds every passage encoded`);
    } else {
      resumedAt = await native.buildOpen(partial);
      if (resumedAt > 0) {
        options.progress.log(
          `resuming ${partial}: ${resumedAt.toLocaleString("en-US")} passages already encoded`,
        );
      }
      const rows = await encodeCorpus({ ...options, recipe }, native, tokenizer, resumedAt);
      if (rows < resumedAt) {
        throw new InputError(
          `${partial} holds ${resumedAt} vectors but ${corpus} has only ${rows} rows: remove it`,
        );
      }
    }
    const done = encoded ? null : await native.buildCommit(flat);
    if (flat === out) {
      await rm(statePath, { force: true });
      const { rows, bytes } = done as { rows: number; bytes: number };
      return {
        rows,
        type: "IndexFlatIP",
        resumedAt,
        bytes,
        seconds: (Date.now() - started) / 1000,
      };
    }
    await native.shutdown();
    const built = await buildFaissType({
      flat,
      out,
      faissType: options.faissType,
      efConstruction: options.efConstruction,
      threads: options.threads,
      progress: options.progress,
      signal: options.signal,
    });
    await rm(flat, { force: true });
    await rm(statePath, { force: true });
    return {
      rows: built.ntotal,
      type: built.type,
      resumedAt: encoded ? built.ntotal : resumedAt,
      bytes: built.bytes,
      seconds: (Date.now() - started) / 1000,
    };
  } finally {
    await native.shutdown();
  }
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

/** Streams the corpus from row `from`, encodes and appends; resolves with the corpus's rows. */
async function encodeCorpus(
  options: DenseBuildOptions,
  native: IndexProcess,
  tokenizer: TextTokenizer,
  from: number,
): Promise<number> {
  const { corpus, recipe, batchSize } = options;
  const total = (await stat(corpus)).size;
  const task = options.progress.task("encoding", total, "B");
  const started = Date.now();
  let texts: string[] = [];
  let appended = from;
  // One batch is encoded by the native process while the next is tokenized here.
  let inFlight: Promise<number> | null = null;
  const flush = async () => {
    const ids = await tokenizer.encodeBatch(texts, { addSpecialTokens: true });
    texts = [];
    if (inFlight) appended = await inFlight;
    inFlight = native.buildAppend(ids);
    inFlight.catch(() => {}); // awaited by the next flush; not unhandled meanwhile
  };
  let rows = 0;
  for await (const batch of corpusBatches(corpus, 4 << 20, options.signal)) {
    const bytes = Buffer.from(batch.bytes.buffer, batch.bytes.byteOffset, batch.bytes.length);
    for (let i = 0; i < batch.starts.length; i++) {
      if (batch.firstRow + i < from) continue;
      const line = bytes.toString("utf8", batch.starts[i], batch.ends[i]);
      let contents: string;
      try {
        contents = corpusContents(line, corpus, batch.lineNumbers[i] as number);
      } catch (err) {
        throw new InputError((err as Error).message);
      }
      texts.push(recipe.passagePrefix + contents);
      if (texts.length === batchSize) await flush();
    }
    rows = batch.firstRow + batch.starts.length;
    const seconds = (Date.now() - started) / 1000;
    const rate = seconds > 0 ? Math.round((appended - from) / seconds) : 0;
    task.update(
      Math.min(total, (batch.offsets[0] as number) + (batch.ends.at(-1) as number)),
      ` | ${appended.toLocaleString("en-US")} passages, ${rate.toLocaleString("en-US")} passages/s`,
    );
  }
  if (rows === 0) {
    throw new InputError(`${corpus}: no rows (expected jsonl lines with "id" and "contents")`);
  }
  if (texts.length > 0) await flush();
  if (inFlight) appended = await inFlight;
  task.finish();
  return rows;
}

async function buildState(corpus: string, model: string, recipe: DenseRecipe): Promise<BuildState> {
  const config = await readFile(`${model}/config.json`);
  const { bytes, head_sha256, tail_sha256 } = await identifyCorpus(corpus);
  return {
    format: "searchr1-dense-build",
    corpus: { path: resolve(corpus), bytes, head_sha256, tail_sha256 },
    model: {
      path: resolve(model),
      config_sha256: createHash("sha256").update(config).digest("hex"),
    },
    recipe,
  };
}

/**
 * A partial build of the same corpus, encoder and recipe is resumed. One of other
 * settings is refused (naming what differs) unless `overwrite`, which discards it.
 */
async function checkPartial(
  partial: string,
  statePath: string,
  state: BuildState,
  overwrite: boolean,
): Promise<void> {
  if (!(await exists(partial))) return;
  const text = await readFile(statePath, "utf8").catch(() => null);
  const before = text === null ? null : (JSON.parse(text) as BuildState);
  const differs = before === null ? "its settings file is missing" : difference(before, state);
  if (differs === null) return;
  if (!overwrite) {
    throw new UsageError(
      `${partial}: an unfinished build with other settings (${differs}); pass --overwrite ` +
        "to discard it, or run with its settings to resume it",
    );
  }
  await rm(partial, { force: true });
  await rm(statePath, { force: true });
}

function difference(a: BuildState, b: BuildState): string | null {
  if (a.format !== b.format) return "format";
  const { path: _a, ...corpusA } = a.corpus;
  const { path: _b, ...corpusB } = b.corpus;
  if (JSON.stringify(corpusA) !== JSON.stringify(corpusB)) return `corpus ${a.corpus.path}`;
  if (JSON.stringify(a.model) !== JSON.stringify(b.model)) return `encoder ${a.model.path}`;
  for (const key of Object.keys(b.recipe) as (keyof DenseRecipe)[]) {
    if (a.recipe[key] !== b.recipe[key]) return `${key} ${JSON.stringify(a.recipe[key])}`;
  }
  return null;
}
