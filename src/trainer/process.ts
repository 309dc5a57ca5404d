import { once } from "node:events";
import { createInterface } from "node:readline";
import { execa, type Result, type ResultPromise } from "execa";
import { ServiceError } from "../runtime/errors.js";
import { nativeExecutable } from "./native.js";
import type {
  ActorMetrics,
  CriticMetrics,
  ExportFields,
  LoadCheckpointFields,
  LoadFields,
  LoadReply,
  LogProbsFields,
  Op,
  Ops,
  SaveCheckpointFields,
  StepReply,
  UpdateActorFields,
  UpdateCriticFields,
  ValuesFields,
} from "./protocol.js";
import { ScratchDir } from "./scratch.js";

const WHAT = "the trainer (searchr1-trainer serve)";
/** stderr lines kept for the message that reports a death; the last SHOWN are shown. */
const KEPT = 20;
const SHOWN = 10;

export interface TrainerStartOptions {
  device: "auto" | "cpu" | "cuda";
  /** CPU threads; null: the trainer's default (all cores). */
  threads: number | null;
  /** Token rows per vocabulary-sized logits block; null: the trainer's default. */
  logitsChunk?: number | null;
  /** Recompute layer activations in backward (less memory, more time). */
  recompute?: boolean;
  /** Each line the trainer writes on stderr, as it comes. */
  onLine?: (line: string) => void;
  /** Aborting it stops the trainer (SIGTERM); calls then reject. */
  signal?: AbortSignal;
  /** The executable; default the package's native/build/searchr1-trainer. */
  executable?: string;
}

interface Pending {
  op: Op;
  resolve: (reply: Record<string, unknown>) => void;
  reject: (err: Error) => void;
}

/**
 * `searchr1-trainer serve` as a child process, driven over its stdio protocol
 * (native/src/train/SERVE.md): one JSON command per line with an increasing id, one reply
 * per command, matched by id. A refused command rejects with the trainer's message and the
 * process goes on serving. If the process ends without being asked to, every pending and
 * later call rejects with a ServiceError naming how it ended and its last stderr lines, and
 * the `onDeath` listeners are told. Batch and output files go in `scratch`, which is
 * removed with the process.
 *
 * The trainer runs in its own process group, so a Ctrl-C at the terminal reaches only the
 * controller, which decides how to stop it; if the controller itself dies, the trainer
 * reads the end of its stdin and exits.
 */
export class TrainerProcess {
  /** Where batch and output files for this trainer go; removed on shutdown, kill and death. */
  readonly scratch = new ScratchDir();
  /** Settles once the process has exited and the pending calls have been rejected. */
  readonly exited: Promise<void>;
  private readonly tail: string[] = [];
  private readonly pending = new Map<number, Pending>();
  private readonly deathListeners: ((err: ServiceError) => void)[] = [];
  private nextId = 1;
  /** Why calls fail from now on; null while the trainer serves. */
  private end: ServiceError | null = null;
  /** An end we asked for (shutdown, kill, abort): not reported as a death. */
  private stopping = false;

  private constructor(
    private readonly child: ResultPromise,
    private readonly onLine: (line: string) => void,
  ) {
    child.stdin?.on("error", () => {
      // EPIPE once the trainer is gone: the exit handler reports it.
    });
    createInterface({ input: child.stderr as NodeJS.ReadableStream }).on("line", (line) =>
      this.keep(line),
    );
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on("line", (line) =>
      this.onReply(line),
    );
    this.exited = child.then((result) => this.onExit(result));
  }

  /** Starts the trainer; rejects if the executable cannot be run. */
  static async start(options: TrainerStartOptions): Promise<TrainerProcess> {
    const executable = options.executable ?? nativeExecutable("searchr1-trainer");
    const args = ["serve", "--device", options.device];
    if (options.threads != null) args.push("--threads", String(options.threads));
    if (options.logitsChunk != null) args.push("--logits-chunk", String(options.logitsChunk));
    if (options.recompute) args.push("--recompute");
    const child = execa(executable, args, {
      stdin: "pipe",
      stdout: "pipe",
      stderr: "pipe",
      buffer: false, // the replies are read as they come, never collected
      reject: false,
      detached: true,
      cancelSignal: options.signal,
      forceKillAfterDelay: 10_000,
    });
    const trainer = new TrainerProcess(child, options.onLine ?? (() => {}));
    const { signal } = options;
    if (signal) {
      const interrupted = () => trainer.stopBy("was interrupted");
      if (signal.aborted) interrupted(); // execa does not start it then
      signal.addEventListener("abort", interrupted, { once: true });
      void trainer.exited.then(() => signal.removeEventListener("abort", interrupted));
    }
    try {
      await once(child, "spawn");
    } catch {
      await trainer.exited;
      throw trainer.ended;
    }
    return trainer;
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Why calls fail: the trainer died, was shut down, killed or interrupted; else null. */
  get ended(): ServiceError | null {
    return this.end;
  }

  /** The last lines the trainer wrote on stderr. */
  stderrTail(): string[] {
    return [...this.tail];
  }

  /** Told once, with the error calls reject with, if the trainer ends without being asked. */
  onDeath(listener: (err: ServiceError) => void): void {
    this.deathListeners.push(listener);
  }

  /** Sends one command and resolves with its reply (without `id` and `ok`). */
  send<O extends Op>(op: O, fields: Ops[O]["fields"]): Promise<Ops[O]["reply"]> {
    if (this.end) return Promise.reject(this.end);
    const id = this.nextId++;
    return new Promise<Record<string, unknown>>((resolve, reject) => {
      this.pending.set(id, { op, resolve, reject });
      // op and id first on the line, and never overridden by a field of the same name.
      const command = Object.assign({ op, id }, fields, { op, id });
      this.child.stdin?.write(`${JSON.stringify(command)}\n`);
    }) as Promise<Ops[O]["reply"]>;
  }

  load(fields: LoadFields): Promise<LoadReply> {
    return this.send("load", fields);
  }

  /** Writes `log_probs` and `entropy` (F32 [B, T]) to `out`. */
  async logProbs(fields: LogProbsFields): Promise<void> {
    await this.send("log_probs", fields);
  }

  /** Writes the critic's `values` (F32 [B, T]) to `out`. */
  async values(fields: ValuesFields): Promise<void> {
    await this.send("values", fields);
  }

  updateActor(fields: UpdateActorFields): Promise<ActorMetrics> {
    return this.send("update_actor", fields);
  }

  updateCritic(fields: UpdateCriticFields): Promise<CriticMetrics> {
    return this.send("update_critic", fields);
  }

  /** Writes the policy as a Hugging Face folder (the protocol's `export`). */
  async exportPolicy(fields: ExportFields): Promise<void> {
    await this.send("export", fields);
  }

  saveCheckpoint(fields: SaveCheckpointFields): Promise<StepReply> {
    return this.send("save_checkpoint", fields);
  }

  loadCheckpoint(fields: LoadCheckpointFields): Promise<StepReply> {
    return this.send("load_checkpoint", fields);
  }

  /**
   * Asks the trainer to exit (after the commands already sent), waits for it and removes
   * the scratch folder. Resolves also when the trainer has already gone.
   */
  async shutdown(): Promise<void> {
    if (!this.end) {
      const bye = this.send("shutdown", {});
      this.stopBy("has been shut down");
      this.child.stdin?.end(); // the end of stdin is a shutdown too
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
    this.end ??= new ServiceError(`${WHAT} ${how}`);
  }

  private keep(line: string): void {
    this.tail.push(line);
    if (this.tail.length > KEPT) this.tail.shift();
    this.onLine(line);
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
      // An id the trainer could not read back (a command it could not parse): it answers
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
    else waiting.reject(new ServiceError(`the trainer refused ${waiting.op}: ${String(error)}`));
  }

  private async onExit(result: Result): Promise<void> {
    if (!this.stopping) {
      const shown = this.tail.filter((l) => l.trim() !== "").slice(-SHOWN);
      const last = shown.length ? `; its last lines:\n  ${shown.join("\n  ")}` : "";
      const how = result.signal ?? result.exitCode;
      const cause = (result.cause as Error | undefined)?.message ?? result.shortMessage;
      this.end = new ServiceError(
        how === undefined ? `${WHAT} could not start: ${cause}` : `${WHAT} died (${how})${last}`,
      );
    }
    const err = this.end ?? new ServiceError(`${WHAT} has exited`);
    for (const waiting of this.pending.values()) waiting.reject(err);
    this.pending.clear();
    if (!this.stopping) for (const listener of this.deathListeners) listener(err);
    await this.scratch.remove();
  }
}
