import { createHash } from "node:crypto";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { userCacheDir } from "../runtime/cache-dir.js";
import { InputError } from "../runtime/errors.js";
import type { Progress } from "../runtime/progress.js";
import { replaceDir } from "../runtime/replace-dir.js";
import { type CorpusIdentity, corpusIdentitySchema } from "./bm25/format.js";
import { corpusBatches } from "./corpus-batches.js";
import {
  type CorpusStore,
  CorpusStoreWriter,
  corpusKind,
  identifyCorpus,
  openCorpusStore,
} from "./corpus-store.js";

/**
 * Random access to the rows of a corpus that has no searchr1 index folder beside it (a
 * faiss index is one file: Search-R1's e5_Flat.index over wiki-18.jsonl). The row store
 * (corpus-store.ts) is made once per corpus, in a cache folder named by the corpus's
 * identity (size and the hashes of its first and last MiB), and reused by every later
 * server over the same file; a changed file gets a new entry.
 */
export interface CachedCorpus {
  store: CorpusStore;
  identity: CorpusIdentity;
  /** The cache entry's folder. */
  dir: string;
}

const META = "corpus.json";

/** `$XDG_CACHE_HOME/searchr1/corpus`, else `~/.cache/searchr1/corpus`. */
export function defaultCorpusCache(): string {
  return userCacheDir("corpus");
}

export async function openCachedCorpus(
  corpusPath: string,
  cacheRoot: string,
  progress: Progress,
  signal?: AbortSignal,
): Promise<CachedCorpus> {
  let identity: Omit<CorpusIdentity, "rows" | "path">;
  try {
    identity = await identifyCorpus(corpusPath);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") throw new InputError(`${corpusPath}: no such corpus file`);
    throw new InputError(`${corpusPath}: cannot read the corpus (${(err as Error).message})`);
  }
  const key = createHash("sha256")
    .update(`${identity.kind}:${identity.bytes}:${identity.head_sha256}:${identity.tail_sha256}`)
    .digest("hex")
    .slice(0, 24);
  const dir = join(cacheRoot, key);
  let full = await readEntry(dir);
  if (full === null) {
    full = await writeEntry(dir, corpusPath, identity, progress, signal);
  }
  const store = await openCorpusStore(dir, corpusPath, full);
  return { store, identity: full, dir };
}

async function readEntry(dir: string): Promise<CorpusIdentity | null> {
  const text = await readFile(join(dir, META), "utf8").catch(() => null);
  if (text === null) return null;
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return null; // not ours, or damaged: made again
  }
  const parsed = corpusIdentitySchema.safeParse(json);
  return parsed.success ? parsed.data : null;
}

/** Streams the corpus once into a new cache entry, written aside and renamed into place. */
async function writeEntry(
  dir: string,
  corpusPath: string,
  identity: Omit<CorpusIdentity, "rows" | "path">,
  progress: Progress,
  signal?: AbortSignal,
): Promise<CorpusIdentity> {
  const tmp = `${dir}.partial-${process.pid}`;
  try {
    await mkdir(tmp, { recursive: true });
  } catch (err) {
    throw new InputError(
      `${tmp}: cannot create the corpus cache (${(err as NodeJS.ErrnoException).code}); ` +
        "set --corpus-cache to a writable folder",
    );
  }
  try {
    const writer = new CorpusStoreWriter(tmp, corpusKind(corpusPath));
    const task = progress.task("indexing corpus rows", identity.bytes, "B");
    let rows = 0;
    for await (const batch of corpusBatches(corpusPath, 4 << 20, signal)) {
      const bytes = Buffer.from(batch.bytes.buffer, batch.bytes.byteOffset, batch.bytes.length);
      for (let i = 0; i < batch.starts.length; i++) {
        writer.add(batch.offsets[i] as number, bytes.subarray(batch.starts[i], batch.ends[i]));
      }
      rows = batch.firstRow + batch.starts.length;
      const end = (batch.offsets[0] as number) + (batch.ends.at(-1) as number);
      task.update(Math.min(end, identity.bytes)); // gzip: offsets count decompressed bytes
    }
    writer.finish(identity.bytes);
    task.finish();
    const full: CorpusIdentity = { path: resolve(corpusPath), rows, ...identity };
    await writeFile(join(tmp, META), `${JSON.stringify(full, null, 2)}\n`);
    await replaceDir(tmp, dir);
    return full;
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
}
