import { renameSync, rmSync, writeFileSync } from "node:fs";

/**
 * Writes a small file whole or not at all: to `<path>.tmp-<pid>`, then renamed over `path`,
 * so a reader (or an interrupted run) never sees half of it.
 */
export function writeFileAtomic(path: string, data: string | Uint8Array): void {
  const tmp = `${path}.tmp-${process.pid}`;
  try {
    writeFileSync(tmp, data);
    renameSync(tmp, path);
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  }
}
