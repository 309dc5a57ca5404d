import { createInterface } from "node:readline";
import { ServiceError } from "./errors.js";
import { type ProcessEnd, type ProcessHandle, type Spawn, spawnLocal } from "./process-handle.js";

/** stderr lines kept for the message that reports a death; the last SHOWN are shown. */
const KEPT = 20;
const SHOWN = 10;

export interface JsonLinesServiceOptions {
  executable: string;
  args: readonly string[];
  /** Names the process in messages: "the trainer (searchr1-trainer serve)". */
  what: string;
  /** Names it in refusals: "the trainer" → "the trainer refused log_probs: …". */
  who: string;
  /** Each line the process writes on stderr, as it comes. */
  onLine?: (line: string) => void;
  /** Aborting it stops the process (SIGTERM); calls then reject. */
  signal?: AbortSignal;
  /** Variables added to its environment (the rest is inherited), e.g. CUDA_VISIBLE_DEVICES. */
  env?: Readonly<Record<string, string>>;
  /** What starts it: a child of this process (default), or a process on another node. */
  spawn?: Spawn;
}

/** How long a process asked to stop (SIGTERM) has before it is killed. */
const GRACE_MS = 10_000;

interface Pending {
  op: string;
  resolve: (reply: Record<string, unknown>) => void;
  reject: (err: Error) => void;
}

/**
 * A native process driven over a JSON-lines protocol on its stdio (searchr1-trainer serve,
 * searchr1-index serve): one JSON command per line with an increasing id, one reply per
 * command (`{"id", "ok": true, ...}` or `{"id", "ok": false, "error"}`), matched by id. A
 * refused command rejects with the process's message and the process goes on serving. If
 * the process ends without being asked to, every pending and later call rejects with a
 * ServiceError naming how it ended and its last stderr lines, and the `onDeath` listeners
 * are told.
 *
 * The process runs in its own process group, so a Ctrl-C at the terminal reaches only the
 * controller, which decides how to stop it; if the controller itself dies, the process
 * reads the end of its stdin and exits.
 */
export class JsonLinesService {
  /** Settles once the process has exited and the pending calls have been rejected. */
  readonly exited: Promise<void>;
  private readonly tail: string[] = [];
  private readonly pending = new Map<number, Pending>();
  private readonly deathListeners: ((err: ServiceError) => void)[] = [];
  private nextId = 1;
  /** Why calls fail from now on; null while the process serves. */
  private end: ServiceError | null = null;
  /** An end we asked for (shutdown, kill, abort): not reported as a death. */
  private stopping = false;
  /** Whether it started (an end without a code or signal is then a death, not a failed start). */
  private running = false;

  private constructor(
    private readonly child: ProcessHandle,
    private readonly options: JsonLinesServiceOptions,
  ) {
    child.stdin.on("error", () => {
      // EPIPE once the process is gone: the exit handler reports it.
    });
    createInterface({ input: child.stderr }).on("line", (line) => this.keep(line));
    createInterface({ input: child.stdout }).on("line", (line) => this.onReply(line));
    this.exited = child.ended.then((end) => this.onExit(end));
  }

  /** Starts the process; rejects if the executable cannot be run. */
  static async start(options: JsonLinesServiceOptions): Promise<JsonLinesService> {
    const { signal } = options;
    if (signal?.aborted) throw new ServiceError(`${options.what} was interrupted`);
    const spawn = options.spawn ?? spawnLocal;
    const service = new JsonLinesService(
      spawn(options.executable, options.args, options.env),
      options,
    );
    if (signal) {
      const interrupted = () => service.stopWithin("was interrupted");
      signal.addEventListener("abort", interrupted, { once: true });
      void service.exited.then(() => signal.removeEventListener("abort", interrupted));
    }
    try {
      await service.child.started;
      service.running = true;
    } catch {
      await service.exited;
      throw service.ended;
    }
    return service;
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Why calls fail: the process died, was shut down, killed or interrupted; else null. */
  get ended(): ServiceError | null {
    return this.end;
  }

  /** The last lines the process wrote on stderr. */
  stderrTail(): string[] {
    return [...this.tail];
  }

  /** Told once, with the error calls reject with, if the process ends without being asked. */
  onDeath(listener: (err: ServiceError) => void): void {
    this.deathListeners.push(listener);
  }

  /** Sends one command and resolves with its reply (without `id` and `ok`). */
  send(op: string, fields: object): Promise<Record<string, unknown>> {
    if (this.end) return Promise.reject(this.end);
    const id = this.nextId++;
    return new Promise<Record<string, unknown>>((resolve, reject) => {
      this.pending.set(id, { op, resolve, reject });
      // op and id first on the line, and never overridden by a field of the same name.
      const command = Object.assign({ op, id }, fields, { op, id });
      this.child.stdin.write(`${JSON.stringify(command)}\n`);
    });
  }

  /**
   * Asks the process to exit (after the commands already sent) and waits for it. Resolves
   * also when the process has already gone.
   */
  async shutdown(): Promise<void> {
    if (!this.end) {
      const bye = this.send("shutdown", {});
      this.stopBy("has been shut down");
      this.child.stdin.end(); // the end of stdin is a shutdown too
      await bye.catch(() => {});
    }
    await this.exited;
  }

  /** SIGKILL, for emergencies: pending calls reject; waits for the exit. */
  async kill(): Promise<void> {
    this.stopBy("was killed");
    this.child.kill("SIGKILL");
    await this.exited;
  }

  private stopBy(how: string): void {
    this.stopping = true;
    this.end ??= new ServiceError(`${this.options.what} ${how}`);
  }

  /** SIGTERM, then SIGKILL if it is still there after the grace period. */
  private stopWithin(how: string): void {
    this.stopBy(how);
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), GRACE_MS);
    timer.unref();
    void this.exited.then(() => clearTimeout(timer));
  }

  private keep(line: string): void {
    this.tail.push(line);
    if (this.tail.length > KEPT) this.tail.shift();
    this.options.onLine?.(line);
  }

  private onReply(line: string): void {
    let reply: { id?: unknown; ok?: unknown; error?: unknown } | undefined;
    try {
      reply = JSON.parse(line);
    } catch {
      reply = undefined;
    }
    if (typeof reply !== "object" || reply === null || typeof reply.ok !== "boolean") {
      this.keep(`stdout: ${line}`); // not a reply: kept for the record
      return;
    }
    let id = typeof reply.id === "number" ? reply.id : Number.NaN;
    let waiting = this.pending.get(id);
    if (!waiting) {
      // An id the process could not read back (a command it could not parse): it answers
      // in order, so the reply is the oldest pending command's.
      const oldest = this.pending.entries().next();
      if (oldest.done) {
        this.keep(`stdout: ${line}`);
        return;
      }
      [id, waiting] = oldest.value;
    }
    this.pending.delete(id);
    const { ok, id: _id, error, ...rest } = reply;
    if (ok) waiting.resolve(rest);
    else {
      waiting.reject(
        new ServiceError(`${this.options.who} refused ${waiting.op}: ${String(error)}`),
      );
    }
  }

  private onExit(end: ProcessEnd): void {
    const { what } = this.options;
    if (!this.stopping) {
      const shown = this.tail.filter((l) => l.trim() !== "").slice(-SHOWN);
      const last = shown.length ? `; its last lines:\n  ${shown.join("\n  ")}` : "";
      const how = end.signal ?? end.exitCode ?? end.cause;
      this.end = new ServiceError(
        !this.running && end.signal === undefined && end.exitCode === undefined
          ? `${what} could not start: ${end.cause}`
          : `${what} died (${how})${last}`,
      );
    }
    const err = this.end ?? new ServiceError(`${what} has exited`);
    for (const waiting of this.pending.values()) waiting.reject(err);
    this.pending.clear();
    if (!this.stopping) for (const listener of this.deathListeners) listener(err);
  }
}
