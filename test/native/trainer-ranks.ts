/**
 * `searchr1-trainer serve` ranks driven as one run from a test (native/src/train/SERVE.md,
 * "Several ranks"): `serve --rank R --world-size N` processes on the CPU, over Gloo, one
 * thread each, standing in for N GPUs.
 */
import { expect } from "vitest";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { ServeProcess } from "../helpers/serve-process.js";
import { CPU, tempDir } from "./helpers.js";

/** One rank of `size` (no rank flags when size is 1 and `flags` has none), one thread. */
export function serveRank(
  rank: number,
  size: number,
  rendezvous: string,
  timeout: number,
  flags: string[],
): ServeProcess {
  const ranks =
    size > 1 || flags.includes("--collectives")
      ? ["--rank", String(rank), "--world-size", String(size), "--rendezvous", rendezvous]
      : [];
  return new ServeProcess(
    nativeExecutable("searchr1-trainer"),
    ["serve", "--threads", "1", ...ranks, "--collective-timeout", String(timeout), ...flags],
    { ...process.env, OMP_NUM_THREADS: "1" },
  );
}

/** `size` ranks driven as one: every command to every rank; the replies must agree. */
export class Ranks {
  readonly procs: ServeProcess[];
  constructor(size: number, timeout = 60, flags: string[] = CPU) {
    const rendezvous = tempDir();
    this.procs = Array.from({ length: size }, (_, r) =>
      serveRank(r, size, rendezvous, timeout, flags),
    );
  }

  async ok(op: string, fields: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    const replies = await Promise.all(this.procs.map((p) => p.ok(op, fields)));
    for (const r of replies.slice(1))
      expect(r, `${op}: every rank replies alike`).toEqual(replies[0]);
    return replies[0] as Record<string, unknown>;
  }

  async close(): Promise<(number | null)[]> {
    return Promise.all(this.procs.map((p) => p.close()));
  }
}
