/**
 * The native `searchr1-engine` as a child process: started, watched, and driven over its
 * stdio protocol (./protocol.ts). Each sequence registers a handler under its rid and
 * receives its tokens, then `done` or an error; control commands get a promise of their
 * reply. When the process dies, every live sequence and pending command fails with
 * EngineDied, which names the engine, how it ended and the last lines of its stderr.
 *
 * The engine runs in its own process group, so a Ctrl-C at the terminal reaches only the
 * server, which drains and then shuts the engine down; if the server itself dies, the
 * engine sees the end of its stdin and exits.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { CliError } from "../runtime/errors.js";
import { nativeExecutable } from "../runtime/native-executable.js";
import {
  type ControlCommand,
  type DoneEvent,
  type EngineEvent,
  type GenerateCommand,
  parseEvent,
  type ReadyEvent,
  type ReplyEvent,
  type TopLogprob,
} from "./protocol.js";

export interface EngineLaunchOptions {
  /** Hugging Face model folder. */
  model: string;
  device: "auto" | "cpu" | "cuda";
  /** null: the engine's defaults, for this and the options below. */
  threads: number | null;
  contextLength: number | null;
  kvCacheMb: number | null;
  /** On a GPU: the fraction of its memory for weights and KV cache together. */
  gpuMemoryUtilization?: number | null;
  maxRunning: number | null;
  chunkTokens: number | null;
  /** On a GPU: every step op by op, no CUDA graphs (`--enforce-eager`). */
  enforceEager?: boolean;
  /** Each line the engine writes on stderr (its log), as it comes. */
  onLog?: (line: string) => void;
  /** The executable; default the package's native/build/searchr1-engine. */
  executable?: string;
  /** Aborting it before the engine is ready stops the engine (SIGTERM). */
  signal?: AbortSignal;
}

/** What happens to one sequence, in order: tokens, then `done` or `error` (never both). */
export interface SequenceHandler {
  /** `top`: the most likely tokens, when the command asked for top_logprobs (else empty). */
  token(id: number, logprob: number, top: TopLogprob[]): void;
  done(event: DoneEvent): void;
  /** EngineRefused (an `error` event for this rid) or EngineDied. */
  error(err: Error): void;
}

/** The engine refused one request (an `error` event naming its rid). */
export class EngineRefused extends Error {
  override readonly name = "EngineRefused";
}

/** The engine process ended while it was needed. Exit 1 (2 when it rejected its options). */
export class EngineDied extends CliError {}

/** Lines of the engine's stderr kept for error messages. */
const STDERR_LINES = 20;
/** Window over which tokens/s is measured. */
const THROUGHPUT_MS = 10_000;

export class NativeEngine {
  private readonly sequences = new Map<string, SequenceHandler>();
  private readonly replies = new Map<
    number,
    { resolve: (r: ReplyEvent) => void; reject: (e: Error) => void }
  >();
  private readonly stderr: string[] = [];
  private nextId = 1;
  private stopping = false;
  private death: EngineDied | null = null;
  private readonly deathListeners: ((err: EngineDied) => void)[] = [];
  private readyInfo: ReadyEvent | null = null;
  private tokenBytesSent = false;
  private version = "";
  /** [time, tokens] of the decode steps of the last THROUGHPUT_MS. */
  private readonly steps: [number, number][] = [];
  /** Resolves when the process has exited and its output is read. */
  readonly closed: Promise<void>;

  private constructor(
    private readonly child: ChildProcess,
    private readonly executable: string,
    private readonly onLog: (line: string) => void,
  ) {
    let closed!: () => void;
    this.closed = new Promise((resolve) => {
      closed = resolve;
    });
    child.on("close", (code, signal) => {
      this.onClose(code, signal);
      closed();
    });
    child.on("error", (err: NodeJS.ErrnoException) => {
      // Spawning failed (no such file, not executable): there is no process to close.
      this.stderr.push(`cannot run ${executable}: ${err.message}`);
      if (child.pid === undefined) {
        this.onClose(null, null);
        closed();
      }
    });
    child.stdin?.on("error", () => {
      // EPIPE after the engine died: the close handler reports it.
    });
    createInterface({ input: child.stderr as NodeJS.ReadableStream }).on("line", (line) => {
      this.stderr.push(line);
      if (this.stderr.length > STDERR_LINES) this.stderr.shift();
      this.onLog(line);
    });
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on("line", (line) =>
      this.onLine(line),
    );
  }

  /**
   * Starts the engine and resolves once it has loaded the model (its `ready` event);
   * rejects with EngineDied, carrying its stderr, when it exits first.
   */
  static start(options: EngineLaunchOptions): Promise<NativeEngine> {
    const executable = options.executable ?? nativeExecutable("searchr1-engine");
    const args = ["--model", options.model, "--device", options.device];
    const optional: [string, number | null][] = [
      ["--threads", options.threads],
      ["--context-length", options.contextLength],
      ["--kv-cache-mb", options.kvCacheMb],
      ["--gpu-memory-utilization", options.gpuMemoryUtilization ?? null],
      ["--max-running", options.maxRunning],
      ["--chunk-tokens", options.chunkTokens],
    ];
    for (const [flag, value] of optional) if (value !== null) args.push(flag, String(value));
    if (options.enforceEager) args.push("--enforce-eager");
    const child = spawn(executable, args, { stdio: ["pipe", "pipe", "pipe"], detached: true });
    const engine = new NativeEngine(child, executable, options.onLog ?? (() => {}));
    const stop = () => {
      if (!engine.readyInfo) child.kill("SIGTERM");
    };
    options.signal?.addEventListener("abort", stop, { once: true });
    return new Promise<NativeEngine>((resolve, reject) => {
      engine.readyWaiter = { resolve: () => resolve(engine), reject };
    }).finally(() => options.signal?.removeEventListener("abort", stop));
  }

  private readyWaiter: { resolve: () => void; reject: (err: Error) => void } | null = null;

  /** The `ready` event: vocabulary, context length, KV blocks, EOS ids, device. */
  get info(): ReadyEvent {
    if (!this.readyInfo) throw new Error("the engine is not ready");
    return this.readyInfo;
  }

  /** The weight version of the last finished sequence or weight update. */
  get weightVersion(): string {
    return this.version;
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Sequences queued or running in the engine (as far as this side knows). */
  get liveSequences(): number {
    return this.sequences.size;
  }

  /** Why the engine is gone, when it is. */
  get dead(): EngineDied | null {
    return this.death;
  }

  /** Output tokens per second over the last THROUGHPUT_MS. */
  throughput(): number {
    const now = performance.now();
    this.pruneSteps(now);
    const tokens = this.steps.reduce((sum, [, n]) => sum + n, 0);
    return tokens / (THROUGHPUT_MS / 1000);
  }

  private countTokens(n: number): void {
    const now = performance.now();
    this.steps.push([now, n]);
    this.pruneSteps(now);
  }

  private pruneSteps(now: number): void {
    let old = 0;
    while (
      old < this.steps.length &&
      (this.steps[old] as [number, number])[0] < now - THROUGHPUT_MS
    )
      old++;
    if (old > 0) this.steps.splice(0, old);
  }

  /** The last lines the engine wrote on stderr. */
  stderrTail(): string[] {
    return [...this.stderr];
  }

  /** Called once if the engine dies while it is in use (not after `shutdown`). */
  onDeath(listener: (err: EngineDied) => void): void {
    this.deathListeners.push(listener);
  }

  /** Queues one sequence; its events go to `handler`. */
  generate(command: GenerateCommand, handler: SequenceHandler): void {
    if (this.death) {
      handler.error(this.death);
      return;
    }
    if (this.sequences.has(command.rid)) throw new Error(`rid ${command.rid} is already live`);
    this.sequences.set(command.rid, handler);
    this.send(command);
  }

  /** Ends a sequence early (its `done` event, reason abort, follows); no-op once finished. */
  abort(rid: string): void {
    if (this.sequences.has(rid) && !this.death) this.send({ op: "abort", rid });
  }

  /**
   * Gives the engine each token's bytes (`tokenBytes`, read once), which requests with a
   * grammar need; a no-op after the first call. The engine reads its stdin in order, so a
   * `generate` sent after this finds them.
   */
  sendTokenBytes(tokenBytes: () => string[]): void {
    if (this.tokenBytesSent) return;
    const tokens = tokenBytes();
    this.tokenBytesSent = true;
    this.control({ op: "token_bytes", tokens }).then(
      (reply) => {
        if (!reply.ok) this.onLog(`engine refused the token bytes: ${reply.message}`);
      },
      () => {}, // a dead engine fails the requests themselves
    );
  }

  /** Sends a control command and resolves with its reply (rejects if the engine dies). */
  control(command: ControlCommand): Promise<ReplyEvent> {
    if (this.death) return Promise.reject(this.death);
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.replies.set(id, { resolve, reject });
      this.send({ ...command, id });
    });
  }

  /**
   * Asks the engine to exit (it aborts what is left) and waits for it; kills it after
   * `graceMs`. Live sequences end with EngineDied.
   */
  async shutdown(graceMs = 10_000): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null || this.death) {
      await this.closed;
      return;
    }
    this.stopping = true;
    this.send({ op: "shutdown" });
    this.child.stdin?.end();
    const timer = setTimeout(() => this.child.kill("SIGKILL"), graceMs);
    timer.unref();
    await this.closed;
    clearTimeout(timer);
  }

  private send(message: object): void {
    const stdin = this.child.stdin;
    if (stdin && !stdin.destroyed && stdin.writable) stdin.write(`${JSON.stringify(message)}\n`);
  }

  private onLine(line: string): void {
    if (line.trim() === "") return;
    let event: EngineEvent;
    try {
      event = parseEvent(line);
    } catch (err) {
      this.onLog(`(stdout line that is not an event: ${(err as Error).message}) ${line}`);
      return;
    }
    switch (event.ev) {
      case "ready":
        this.readyInfo = event;
        this.version = event.weight_version;
        this.readyWaiter?.resolve();
        this.readyWaiter = null;
        return;
      case "tokens":
        this.countTokens(event.out.length);
        for (const [rid, id, logprob, top] of event.out) {
          this.sequences.get(rid)?.token(id, logprob, top ?? []);
        }
        return;
      case "done": {
        this.version = event.weight_version;
        const handler = this.sequences.get(event.rid);
        this.sequences.delete(event.rid);
        handler?.done(event);
        return;
      }
      case "error": {
        if (event.rid === null) {
          this.onLog(`engine refused a command line: ${event.message}`);
          return;
        }
        const handler = this.sequences.get(event.rid);
        this.sequences.delete(event.rid);
        handler?.error(new EngineRefused(event.message));
        return;
      }
      case "reply": {
        if (typeof event.weight_version === "string") this.version = event.weight_version;
        const waiter = this.replies.get(event.id);
        this.replies.delete(event.id);
        waiter?.resolve(event);
        return;
      }
    }
  }

  private onClose(code: number | null, signal: NodeJS.Signals | null): void {
    const how =
      signal !== null
        ? `was killed by ${signal}`
        : code === null
          ? "could not be started"
          : `exited with code ${code}`;
    const tail = this.stderr.length
      ? `; the last lines of its stderr:\n${this.stderr.map((l) => `  ${l}`).join("\n")}`
      : "; it wrote nothing on stderr";
    const what = this.readyInfo
      ? `the native engine (${this.executable}, pid ${this.child.pid})`
      : `the native engine (${this.executable}) could not load the model and`;
    this.death = new EngineDied(`${what} ${how}${tail}`, code === 2 ? 2 : 1);
    const death = this.death;
    this.readyWaiter?.reject(death);
    this.readyWaiter = null;
    for (const handler of this.sequences.values()) handler.error(death);
    this.sequences.clear();
    for (const waiter of this.replies.values()) waiter.reject(death);
    this.replies.clear();
    if (!this.stopping && this.readyInfo)
      for (const listener of this.deathListeners) listener(death);
  }
}
