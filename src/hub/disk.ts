import { statfs } from "node:fs/promises";
import path from "node:path";
import { InputError } from "../runtime/errors.js";
import { formatBytes } from "../runtime/progress.js";

/** Free bytes for an unprivileged user on the filesystem that holds `dir` (or would). */
export async function freeBytes(dir: string): Promise<number> {
  let probe = path.resolve(dir);
  for (;;) {
    try {
      const s = await statfs(probe);
      return s.bavail * s.bsize;
    } catch (err) {
      const parent = path.dirname(probe);
      if ((err as NodeJS.ErrnoException).code !== "ENOENT" || parent === probe) throw err;
      probe = parent;
    }
  }
}

export interface SpaceNeed {
  /** What the need is for, e.g. "downloads", "joining index parts". */
  label: string;
  bytes: number;
}

/** Refuses to start a transfer that cannot fit, saying how much is missing. */
export async function ensureSpace(dir: string, needs: SpaceNeed[]): Promise<void> {
  const total = needs.reduce((s, n) => s + n.bytes, 0);
  if (total === 0) return;
  const free = await freeBytes(dir);
  if (free >= total) return;
  const parts = needs
    .filter((n) => n.bytes > 0)
    .map((n) => `${n.label} ${formatBytes(n.bytes)}`)
    .join(" + ");
  throw new InputError(
    `not enough disk space in ${dir}: need ${formatBytes(total)} (${parts}), ${formatBytes(free)} free; free ${formatBytes(total - free)} or choose another --save-path`,
  );
}
