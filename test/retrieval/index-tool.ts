import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { nativeDir } from "../../src/runtime/native-executable.js";

/** The native faiss/encoder tool the dense tests drive. */
export const INDEX_EXE = join(nativeDir(), "searchr1-index");

export interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `searchr1-index <args>` on two threads (and `env` added to the environment) and
 * returns its exit code and output. */
export function runIndex(
  args: string[],
  timeoutMs = 120_000,
  env: Record<string, string> = {},
): Run {
  const r = spawnSync(INDEX_EXE, args, {
    encoding: "utf8",
    timeout: timeoutMs,
    env: { ...process.env, OMP_NUM_THREADS: "2", ...env },
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}
