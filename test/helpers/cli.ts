import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

export const BIN = fileURLToPath(new URL("../../bin/searchr1", import.meta.url));

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the built CLI (bin/searchr1 → dist/) as a user would, without a terminal. */
export function runCli(
  args: string[],
  options: { cwd?: string; env?: Record<string, string> } = {},
): CliResult {
  const r = spawnSync(process.execPath, [BIN, ...args], {
    cwd: options.cwd,
    env: { ...process.env, ...options.env },
    encoding: "utf8",
    timeout: 60_000,
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}
