import type { ServiceError } from "../runtime/errors.js";
import { JsonLinesService } from "../runtime/json-lines-service.js";
import { nativeExecutable } from "../runtime/native-executable.js";
import type { Spawn } from "../runtime/process-handle.js";
import type { Op, Ops } from "./protocol.js";
import { ScratchDir } from "./scratch.js";
import { Trainer } from "./trainer.js";

export interface TrainerStartOptions {
  device: "auto" | "cpu" | "cuda";
  /** CPU threads; null: the trainer's default (all cores). */
  threads: number | null;
  /** Token rows per vocabulary-sized logits block; null: the trainer's default. */
  logitsChunk?: number | null;
  /** Recompute layer activations in backward (less memory, more time). */
  recompute?: boolean;
  /** Time every backend operation on the device (`--profile`; the `profile` op reads them). */
  profile?: boolean;
  /** Each line the trainer writes on stderr, as it comes. */
  onLine?: (line: string) => void;
  /** Aborting it stops the trainer (SIGTERM); calls then reject. */
  signal?: AbortSignal;
  /** The executable; default the package's native/build/searchr1-trainer. */
  executable?: string;
  /** The one CUDA device this process sees (`CUDA_VISIBLE_DEVICES`); absent: as inherited. */
  cudaDevice?: string;
  /** What starts it: a child of this process (default), or a process on another node. */
  spawn?: Spawn;
  /**
   * One rank of a data-parallel group (TrainerGroup starts them): `--rank`, `--world-size`,
   * `--rendezvous`, `--host` and `--collective-timeout` of `searchr1-trainer serve`.
   */
  rank?: TrainerRank;
}

/** Where a trainer process stands among the ranks of a run (native/src/train/SERVE.md). */
export interface TrainerRank {
  rank: number;
  worldSize: number;
  /** A fresh folder the ranks meet in (on several nodes, one they all mount). */
  rendezvous: string;
  /** The address its Gloo connections listen on (`--host`); absent: the loopback. */
  host?: string;
  /** Its node and place among that node's ranks (`--node`, `--local-rank`); absent: 0. */
  node?: number;
  localRank?: number;
  /** Seconds a collective waits for the other ranks; null: the trainer's default. */
  collectiveTimeout?: number | null;
}

/**
 * `searchr1-trainer serve` as a child process, driven over its stdio protocol
 * (native/src/train/SERVE.md) by a JsonLinesService: a refused command rejects with the
 * trainer's message and the process goes on serving; a death rejects every pending and
 * later call naming how it ended and its last stderr lines. Batch and output files go in
 * `scratch`, which is removed with the process.
 */
export class TrainerProcess extends Trainer {
  /** Where batch and output files for this trainer go; removed on shutdown, kill and death. */
  readonly scratch = new ScratchDir();
  /** Settles once the process has exited, the pending calls rejected, the scratch removed. */
  readonly exited: Promise<void>;

  private constructor(private readonly service: JsonLinesService) {
    super();
    this.exited = service.exited.then(() => this.scratch.remove());
  }

  /** Starts the trainer; rejects if the executable cannot be run. */
  static async start(options: TrainerStartOptions): Promise<TrainerProcess> {
    const args = ["serve", "--device", options.device];
    if (options.threads != null) args.push("--threads", String(options.threads));
    if (options.logitsChunk != null) args.push("--logits-chunk", String(options.logitsChunk));
    if (options.recompute) args.push("--recompute");
    if (options.profile) args.push("--profile");
    const { rank } = options;
    if (rank) {
      args.push("--rank", String(rank.rank), "--world-size", String(rank.worldSize));
      args.push("--rendezvous", rank.rendezvous);
      if (rank.host !== undefined) args.push("--host", rank.host);
      if (rank.node !== undefined) args.push("--node", String(rank.node));
      if (rank.localRank !== undefined) args.push("--local-rank", String(rank.localRank));
      if (rank.collectiveTimeout != null)
        args.push("--collective-timeout", String(rank.collectiveTimeout));
    }
    const who = rank ? `the trainer's rank ${rank.rank}` : "the trainer";
    const service = await JsonLinesService.start({
      executable: options.executable ?? nativeExecutable("searchr1-trainer"),
      args,
      what: `${who} (searchr1-trainer serve)`,
      who,
      onLine: options.onLine,
      signal: options.signal,
      env:
        options.cudaDevice === undefined ? undefined : { CUDA_VISIBLE_DEVICES: options.cudaDevice },
      spawn: options.spawn,
    });
    return new TrainerProcess(service);
  }

  get pid(): number | undefined {
    return this.service.pid;
  }

  /** Why calls fail: the trainer died, was shut down, killed or interrupted; else null. */
  get ended(): ServiceError | null {
    return this.service.ended;
  }

  /** The last lines the trainer wrote on stderr. */
  stderrTail(): string[] {
    return this.service.stderrTail();
  }

  /** Told once, with the error calls reject with, if the trainer ends without being asked. */
  onDeath(listener: (err: ServiceError) => void): void {
    this.service.onDeath(listener);
  }

  /** Sends one command and resolves with its reply (without `id` and `ok`). */
  send<O extends Op>(op: O, fields: Ops[O]["fields"]): Promise<Ops[O]["reply"]> {
    return this.service.send(op, fields) as Promise<Ops[O]["reply"]>;
  }

  /** Asks the trainer to exit, waits for it and removes the scratch folder. */
  async shutdown(): Promise<void> {
    await this.service.shutdown();
    await this.exited;
  }

  /** SIGKILL, for emergencies: pending calls reject; waits for the exit. */
  async kill(): Promise<void> {
    await this.service.kill();
    await this.exited;
  }
}
