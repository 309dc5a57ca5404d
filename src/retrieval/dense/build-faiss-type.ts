import { spawn } from "node:child_process";
import { InputError, UsageError } from "../../runtime/errors.js";
import { nativeExecutable } from "../../runtime/native-executable.js";
import type { Progress, ProgressTask } from "../../runtime/progress.js";

/** What `searchr1-index build` reports (native/src/cli/index/main.cpp, cmd_build). */
export interface BuiltFaissIndex {
  /** faiss's class: IndexHNSWFlat, IndexHNSWSQ, IndexScalarQuantizer, IndexIVFPQ, IndexFlatIP. */
  type: string;
  factory: string;
  ntotal: number;
  bytes: number;
  max_level: number;
  graph_seconds: number;
  seconds: number;
}

export interface FaissTypeOptions {
  /** The IndexFlatIP file with the encoded passages. */
  flat: string;
  out: string;
  /** An index_factory string (Search-R1's --faiss_type): HNSW64, SQ8, IVF4096,PQ64, ... */
  faissType: string;
  /** HNSW build beam; null for types without a graph. */
  efConstruction: number | null;
  threads: number | null;
  progress: Progress;
  signal?: AbortSignal;
}

/** What each stage of `searchr1-index build` counts (its progress lines). */
const STAGE_UNITS: Record<string, string> = {
  clustering: "k-means iterations",
  quantizer: "PQ sub-quantizers",
};

/**
 * Refuses, before any passage is encoded, an IVF{n},PQ{M} type whose M does not divide the
 * encoder's size `dim` (the native builder would refuse it after the encoding).
 */
export function checkFaissType(faissType: string, dim: number): void {
  const m = /,PQ(\d+)/.exec(faissType);
  if (m && dim % Number(m[1]) !== 0) {
    throw new UsageError(
      `--faiss-type ${faissType}: PQ${m[1]} does not divide the encoder's size d = ${dim} into ` +
        "equal sub-vectors (M must divide d)",
    );
  }
}

/**
 * Builds the faiss index `faissType` names over the vectors of a flat file with the native
 * builder (`searchr1-index build`: faiss's algorithms, faiss's file format), which writes
 * `out` at a temporary name and renames it when complete. Its stderr progress lines
 * (`... build T: graph 1200/50000 (2%)`) drive a progress bar per stage, and its notes (an
 * IVF trained on fewer vectors than faiss asks for) are logged. A refusal naming its
 * `--type` is reported as `--faiss-type`'s.
 */
export function buildFaissType(options: FaissTypeOptions): Promise<BuiltFaissIndex> {
  const args = ["build", "--from", options.flat, "--type", options.faissType];
  args.push("--out", options.out, "--overwrite");
  if (options.efConstruction !== null) {
    args.push("--ef-construction", String(options.efConstruction));
  }
  if (options.threads !== null) args.push("--threads", String(options.threads));
  const child = spawn(nativeExecutable("searchr1-index"), args, {
    stdio: ["ignore", "pipe", "pipe"],
  });
  const onAbort = () => child.kill("SIGTERM");
  options.signal?.addEventListener("abort", onAbort, { once: true });
  let stdout = "";
  let pending = "";
  let lastError = "";
  let task: { stage: string; bar: ProgressTask } | null = null;
  const line = (text: string) => {
    const m = /^searchr1-index: build \S+: (\w+) (\d+)\/(\d+) \(\d+%\)$/.exec(text);
    if (!m) {
      const note = /^searchr1-index: (note: .*)$/.exec(text);
      if (note) options.progress.log(note[1] as string);
      else if (text.trim() !== "") lastError = text;
      return;
    }
    const [, stage, done, total] = m as unknown as [string, string, string, string];
    if (task?.stage !== stage) {
      task?.bar.finish();
      task = {
        stage,
        bar: options.progress.task(stage, Number(total), STAGE_UNITS[stage] ?? "vectors"),
      };
    }
    task.bar.update(Number(done));
  };
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
    stdout += chunk;
  });
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    pending += chunk;
    const lines = pending.split("\n");
    pending = lines.pop() as string;
    for (const l of lines) line(l);
  });
  return new Promise((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code, signal) => {
      options.signal?.removeEventListener("abort", onAbort);
      if (pending) line(pending);
      (task as { bar: ProgressTask } | null)?.bar.finish();
      if (code === 0) {
        resolve(JSON.parse(stdout.trim().split("\n").at(-1) as string) as BuiltFaissIndex);
        return;
      }
      const m = /^searchr1-index: (error: )?(.*)$/.exec(lastError);
      const message = m
        ? (m[2] as string).replace(/^--type /, "--faiss-type ")
        : `searchr1-index build ended (${signal ?? code})`;
      reject(code === 2 && m && !m[1] ? new UsageError(message) : new InputError(message));
    });
  });
}
