import { mkdtempSync, rmSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import type { ServiceError } from "../runtime/errors.js";
import type { Spawn } from "../runtime/process-handle.js";
import { TrainerProcess, type TrainerStartOptions } from "./process.js";
import type { Op, Ops, ProfileReply } from "./protocol.js";
import { ScratchDir } from "./scratch.js";
import { Trainer } from "./trainer.js";

export interface TrainerGroupOptions
  extends Omit<TrainerStartOptions, "rank" | "cudaDevice" | "spawn"> {
  /** Ranks to start (data parallel); each is one `searchr1-trainer serve` process. */
  ranks: number;
  /**
   * The one CUDA device each rank sees (`CUDA_VISIBLE_DEVICES`), rank 0 first: rank r runs on
   * devices[r]. Null or absent: the environment as inherited (CPU ranks).
   */
  devices?: readonly string[] | null;
  /** Seconds a collective waits for the other ranks; null: the trainer's default. */
  collectiveTimeout?: number | null;
  /** Ranks on several nodes (`train --nnodes`); absent: all here, meeting on the loopback. */
  nodes?: RankNodes;
}

/** How the ranks of a multi-node run are spread: `perNode` on each node, node 0 first. */
export interface RankNodes {
  perNode: number;
  /** The address rank r's collectives listen on (its node's). */
  host(rank: number): string;
  /** What starts rank r: undefined on node 0 (a child here), the node's link elsewhere. */
  spawn(rank: number): Spawn | undefined;
  /** A folder every node mounts: the rendezvous and the batch files go there. */
  shared: string;
}

/**
 * The data-parallel ranks of one run (native/src/train/SERVE.md), driven as one trainer:
 * `ranks` processes of `searchr1-trainer serve --rank R --world-size N --rendezvous DIR`, with
 * DIR a fresh folder removed at the end (in the temporary folder, or with `nodes` in the
 * folder every node mounts, the ranks of other nodes started through their links) and the
 * CPU threads split among the ranks of a node (on GPUs, rank r sees only `devices[r]`, so
 * each rank's CUDA device 0 is its own). Every
 * command goes to every rank (each takes its share of the batch's rows and the ranks sum their
 * gradients); a call resolves with rank 0's reply once every rank has answered, and rejects
 * with the first refusal (rank 0's first). A rank that dies stops the group: the others are
 * killed, and every pending and later call rejects naming the rank and its last stderr lines.
 * The abort signal (Ctrl-C) stops every rank.
 */
export class TrainerGroup extends Trainer {
  readonly exited: Promise<void>;
  private death: ServiceError | null = null;
  private readonly deathListeners: ((err: ServiceError) => void)[] = [];

  private constructor(
    private readonly ranks: TrainerProcess[],
    /** The folder the ranks met in; removed once they have exited. */
    readonly rendezvous: string,
    /** Where batch and output files go (every rank reads them; rank 0 writes outputs). */
    readonly scratch: ScratchDir,
  ) {
    super();
    this.exited = Promise.all(ranks.map((r) => r.exited)).then(async () => {
      rmSync(rendezvous, { recursive: true, force: true });
      await this.scratch.remove();
    });
    for (const r of ranks) r.onDeath((err) => this.onRankDeath(err));
    // One that died before it could be told (the others wait for it in the rendezvous).
    const gone = ranks.find((r) => r.ended)?.ended;
    if (gone) this.onRankDeath(gone);
  }

  /** Starts every rank; rejects (and stops those started) if one cannot be run. */
  static async start(options: TrainerGroupOptions): Promise<TrainerGroup> {
    const { ranks: n, collectiveTimeout, onLine, devices, nodes, ...rest } = options;
    if (!Number.isInteger(n) || n < 2)
      throw new Error(`TrainerGroup needs 2 or more ranks, got ${n}`);
    if (devices && devices.length < n)
      throw new Error(`${n} trainer ranks but ${devices.length} devices: ${devices.join(",")}`);
    const rendezvous = mkdtempSync(join(nodes?.shared ?? tmpdir(), "searchr1-ranks-"));
    // The CPU threads are shared by the ranks of one node.
    const here = Math.min(n, nodes?.perNode ?? n);
    const threads = Math.max(1, Math.floor((options.threads ?? availableParallelism()) / here));
    const started = await Promise.allSettled(
      Array.from({ length: n }, (_, rank) =>
        TrainerProcess.start({
          ...rest,
          threads,
          onLine: onLine && ((line) => onLine(`rank ${rank}: ${line}`)),
          rank: {
            rank,
            worldSize: n,
            rendezvous,
            collectiveTimeout,
            ...(nodes && {
              host: nodes.host(rank),
              node: Math.floor(rank / nodes.perNode),
              localRank: rank % nodes.perNode,
            }),
          },
          cudaDevice: devices?.[rank],
          spawn: nodes?.spawn(rank),
        }),
      ),
    );
    const ranks = started.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
    const failed = started.find((s) => s.status === "rejected");
    if (failed) {
      await Promise.all(ranks.map((r) => r.kill()));
      rmSync(rendezvous, { recursive: true, force: true });
      throw failed.reason;
    }
    return new TrainerGroup(ranks, rendezvous, new ScratchDir(nodes?.shared));
  }

  /** The ranks' count. */
  get size(): number {
    return this.ranks.length;
  }

  get pid(): number | undefined {
    return this.ranks[0]?.pid;
  }

  /** Every rank's process id, rank 0 first. */
  get pids(): (number | undefined)[] {
    return this.ranks.map((r) => r.pid);
  }

  /** Why calls fail: a rank died (that rank's error), or the group was stopped; else null. */
  get ended(): ServiceError | null {
    return this.death ?? this.ranks.find((r) => r.ended)?.ended ?? null;
  }

  /** The last lines rank 0 wrote on stderr. */
  stderrTail(): string[] {
    return this.ranks[0]?.stderrTail() ?? [];
  }

  /** Told once, with the dead rank's error, if a rank ends without being asked. */
  onDeath(listener: (err: ServiceError) => void): void {
    this.deathListeners.push(listener);
  }

  /** Sends one command to every rank; rank 0's reply once all have answered. */
  async send<O extends Op>(op: O, fields: Ops[O]["fields"]): Promise<Ops[O]["reply"]> {
    return (await this.sendAll(op, fields))[0] as Ops[O]["reply"];
  }

  /** Sends one command to every rank; every rank's reply, in rank order. */
  async sendAll<O extends Op>(op: O, fields: Ops[O]["fields"]): Promise<Ops[O]["reply"][]> {
    if (this.ended) throw this.ended;
    const replies = await Promise.allSettled(this.ranks.map((r) => r.send(op, fields)));
    if (this.death) throw this.death;
    const refused = replies.find((r) => r.status === "rejected");
    if (refused) throw refused.reason;
    return replies.map((r) => (r as PromiseFulfilledResult<Ops[O]["reply"]>).value);
  }

  override profile(): Promise<ProfileReply[]> {
    return this.sendAll("profile", {});
  }

  /** Asks every rank to exit and waits for all; removes the rendezvous and scratch folders. */
  async shutdown(): Promise<void> {
    await Promise.all(this.ranks.map((r) => r.shutdown()));
    await this.exited;
  }

  /** SIGKILL to every rank; waits for them. */
  async kill(): Promise<void> {
    await Promise.all(this.ranks.map((r) => r.kill()));
    await this.exited;
  }

  /** The first death stops the others, which would wait in a collective for the dead one. */
  private onRankDeath(err: ServiceError): void {
    if (this.death) return;
    this.death = err;
    for (const r of this.ranks) if (!r.ended) void r.kill();
    for (const listener of this.deathListeners) listener(err);
  }
}

/** One trainer process for one rank, a TrainerGroup for more. */
export function startTrainer(options: TrainerGroupOptions): Promise<Trainer> {
  const { ranks, collectiveTimeout: _timeout, devices, nodes: _nodes, ...rest } = options;
  return ranks > 1
    ? TrainerGroup.start(options)
    : TrainerProcess.start({ ...rest, cudaDevice: devices?.[0] });
}
