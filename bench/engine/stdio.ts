// What both modes of bench:engine (CPU: run.ts; GPU: gpu.ts) use to drive searchr1-engine
// directly over its stdio protocol (native/src/engine/PROTOCOL.md), not through
// `searchr1 serve-engine`'s HTTP, so that the figures are the engine's own.
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { log } from "../common.js";

export interface EngineEvent {
  ev: string;
  [key: string]: unknown;
}

/** Start-up lines of the engine's stderr that are noise in a benchmark's progress output. */
const NOISE = /^searchr1(-engine)?: (note|.* KV blocks of)/;

/** One searchr1-engine process. */
export class EngineProcess {
  /** Everything the engine wrote to stderr (its --profile table, say). */
  stderr = "";
  private child: ChildProcessWithoutNullStreams;
  private listeners: ((e: EngineEvent) => void)[] = [];
  private exited: Promise<number | null>;
  private lastId = 0;

  /** `echo`: log the engine's stderr lines as they come, but for its start-up notes. */
  constructor(exe: string, args: string[], env: NodeJS.ProcessEnv, echo = true) {
    this.child = spawn(exe, args, { env, stdio: ["pipe", "pipe", "pipe"] });
    this.child.stderr.on("data", (d: Buffer) => {
      const text = d.toString();
      this.stderr += text;
      if (!echo) return;
      // The start-up lines are noise here; anything else is worth seeing.
      for (const line of text.split("\n")) {
        if (line && !NOISE.test(line)) log(line);
      }
    });
    createInterface({ input: this.child.stdout }).on("line", (line) => {
      const e = JSON.parse(line) as EngineEvent;
      for (const l of [...this.listeners]) l(e);
    });
    // "close", not "exit": by then the engine's stdout and stderr have been read to the end.
    this.exited = new Promise((resolve) => this.child.on("close", (code) => resolve(code)));
  }

  /** A fresh id for a control command. */
  nextId(): number {
    return ++this.lastId;
  }

  send(commands: object[]) {
    this.child.stdin.write(commands.map((c) => `${JSON.stringify(c)}\n`).join(""));
  }

  /** Calls `on` for every event until it returns true. */
  until(on: (e: EngineEvent) => boolean): Promise<void> {
    return new Promise((resolve, reject) => {
      const listener = (e: EngineEvent) => {
        if (e.ev === "error") {
          reject(new Error(`searchr1-engine: ${String(e.message)}`));
          return;
        }
        if (on(e)) {
          this.listeners = this.listeners.filter((l) => l !== listener);
          resolve();
        }
      };
      this.listeners.push(listener);
      this.exited.then((code) => reject(new Error(`searchr1-engine exited (${code})`)));
    });
  }

  /** The `ready` event, once the model is loaded. */
  async ready(): Promise<EngineEvent> {
    let ready: EngineEvent | undefined;
    await this.until((e) => {
      if (e.ev === "ready") ready = e;
      return ready !== undefined;
    });
    return ready as EngineEvent;
  }

  /** Sends control command `op` (with `fields`) and waits for its reply; throws when refused. */
  async control(op: string, fields: object = {}): Promise<EngineEvent> {
    const id = this.nextId();
    let reply: EngineEvent | undefined;
    const done = this.until((e) => {
      if (e.ev === "reply" && e.id === id) reply = e;
      return reply !== undefined;
    });
    this.send([{ ...fields, op, id }]);
    await done;
    if (!reply?.ok) throw new Error(`searchr1-engine: ${op} refused: ${JSON.stringify(reply)}`);
    return reply;
  }

  /** Asks the engine to exit and waits for it; returns its exit code. */
  async shutdown(): Promise<number | null> {
    this.send([{ op: "shutdown" }]);
    this.child.stdin.end();
    return await this.exited;
  }
}

/** A greedy `generate` command run to exactly max_new_tokens (EOS ignored). */
export const greedy = (rid: string, inputIds: number[], maxNew: number) => ({
  op: "generate",
  rid,
  input_ids: inputIds,
  max_new_tokens: maxNew,
  temperature: 0,
  top_p: 1,
  top_k: -1,
  min_p: 0,
  seed: 0,
  stop_token_ids: [],
  ignore_eos: true,
});

/**
 * Sends `commands` (generate commands) and times their decode steps: the seconds per step
 * from the first `tokens` event to the last, over the steps between them. Then flushes the
 * prefix cache, so that the next run computes its prompts again.
 */
export async function timeDecodeSteps(
  engine: EngineProcess,
  commands: object[],
): Promise<{ seconds: number; steps: number }> {
  let first = 0;
  let last = 0;
  let steps = 0;
  let done = 0;
  const finished = engine.until((e) => {
    if (e.ev === "tokens") {
      last = performance.now();
      if (first === 0) first = last;
      else steps++;
    }
    if (e.ev === "done") done++;
    return done === commands.length;
  });
  engine.send(commands);
  await finished;
  await engine.control("flush_cache");
  return { seconds: (last - first) / 1000 / Math.max(steps, 1), steps };
}
