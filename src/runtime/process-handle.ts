import type { Readable, Writable } from "node:stream";
import { execa } from "execa";

/** How a process ended: its exit code, or the signal that ended it, or why it never ran. */
export interface ProcessEnd {
  exitCode?: number;
  signal?: string;
  /** Why it could not start, or why its end is known without a code (a node that left). */
  cause?: string;
}

/**
 * A running process as its stdio and its end: a child of this process (spawnLocal), or one
 * that a node of a multi-node run started for it (src/nodes, its stdio relayed over TCP).
 */
export interface ProcessHandle {
  readonly pid: number | undefined;
  readonly stdin: Writable;
  readonly stdout: Readable;
  readonly stderr: Readable;
  /** Settles once the process has ended; never rejects. */
  readonly ended: Promise<ProcessEnd>;
  /** Resolves once it runs; rejects (and `ended` says why) if it cannot start. */
  readonly started: Promise<void>;
  kill(signal: "SIGTERM" | "SIGKILL"): void;
}

/** Starts `executable args` with `env` added to its environment. */
export type Spawn = (
  executable: string,
  args: readonly string[],
  env?: Readonly<Record<string, string>>,
) => ProcessHandle;

/**
 * A child process in its own process group (a Ctrl-C at the terminal reaches only this
 * process, which decides how to stop it), its stdio piped and never buffered.
 */
export const spawnLocal: Spawn = (executable, args, env) => {
  const child = execa(executable, [...args], {
    stdin: "pipe",
    stdout: "pipe",
    stderr: "pipe",
    buffer: false,
    env,
    reject: false,
    detached: true,
  });
  const ended = child.then(
    (r): ProcessEnd => ({
      exitCode: r.exitCode,
      signal: r.signal,
      cause: (r.cause as Error | undefined)?.message ?? r.shortMessage,
    }),
  );
  return {
    pid: child.pid,
    stdin: child.stdin as Writable,
    stdout: child.stdout as Readable,
    stderr: child.stderr as Readable,
    ended,
    started: new Promise<void>((resolve, reject) => {
      child.once("spawn", () => resolve());
      child.once("error", reject);
    }),
    kill: (signal) => {
      child.kill(signal);
    },
  };
};
