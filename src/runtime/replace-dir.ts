import { rename, rm, stat } from "node:fs/promises";

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
