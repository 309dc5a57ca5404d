import { lstat, readdir, rename, rm, stat } from "node:fs/promises";
import { UsageError } from "./errors.js";

/**
 * Puts a finished folder `tmp` at `out`. An existing `out` is moved aside first and
 * removed only once the new one is in place; if that last rename fails it is restored.
 */
export async function replaceDir(tmp: string, out: string): Promise<void> {
  const old = `${out}.old-${process.pid}`;
  const existed = await stat(out).then(
    () => true,
    () => false,
  );
  if (existed) await rename(out, old);
  try {
    await rename(tmp, out);
  } catch (e) {
    if (existed) await rename(old, out);
    throw e;
  }
  if (existed) await rm(old, { recursive: true, force: true });
}

/**
 * The one rule every command applies to its output (a folder or a file): a path that
 * exists is refused, naming it and `--overwrite` (a usage error, exit 2), unless
 * `overwrite` is set; the new output then replaces it only once complete (replaceDir for a
 * folder, a rename for a file). A missing path or an empty folder is no output yet.
 */
export async function refuseExisting(path: string, overwrite: boolean): Promise<void> {
  if (overwrite) return;
  const info = await lstat(path).catch(() => undefined);
  if (!info) return;
  if (info.isDirectory() && (await readdir(path).catch(() => [path])).length === 0) return;
  throw new UsageError(`${path}: already exists; pass --overwrite to replace it`);
}
