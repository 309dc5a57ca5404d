import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, rename, rm } from "node:fs/promises";
import { pipeline } from "node:stream/promises";
import { createGunzip } from "node:zlib";
import * as tar from "tar";

/** Concatenates files in order into `output` (Search-R1's `cat part_* > e5_Flat.index`), streamed. */
export async function joinFiles(
  sources: string[],
  output: string,
  signal: AbortSignal,
): Promise<void> {
  const tmp = `${output}.incomplete`;
  try {
    const out = createWriteStream(tmp);
    for (const src of sources) {
      const input = createReadStream(src, { highWaterMark: 4 << 20, signal });
      await pipeline(input, out, { end: false, signal });
    }
    await new Promise<void>((resolve, reject) =>
      out.end((err?: Error | null) => (err ? reject(err) : resolve())),
    );
    await rename(tmp, output);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
}

/** Expands a .gz next to itself (`gzip -d`), streamed; nothing is left behind on failure. */
export async function gunzipFile(
  source: string,
  output: string,
  signal: AbortSignal,
): Promise<void> {
  const tmp = `${output}.incomplete`;
  try {
    const input = createReadStream(source, { highWaterMark: 4 << 20, signal });
    await pipeline(input, createGunzip(), createWriteStream(tmp), { signal });
    await rename(tmp, output);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
}

/** Names a `.tar`, `.tar.gz` or `.tgz` file would be extracted from; undefined for others. */
export function archiveStem(file: string): string | undefined {
  const m = /^(.*)\.(tar|tar\.gz|tgz)$/.exec(file);
  return m?.[1];
}

/**
 * Extracts an archive into `dir` as `tar -xf` would, refusing entries that escape it;
 * returns the top-level names it created.
 */
export async function extractTar(archive: string, dir: string): Promise<string[]> {
  await mkdir(dir, { recursive: true });
  const top = new Set<string>();
  await tar.x({
    file: archive,
    cwd: dir,
    strict: true,
    preservePaths: false,
    filter: (entry) => {
      const first = entry.replace(/^\.\//, "").split("/")[0];
      if (first) top.add(first);
      return true;
    },
  });
  return [...top];
}
