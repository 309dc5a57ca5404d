import { ServiceError } from "../../runtime/errors.js";
import type { EngineClient, EngineRoute, TurnOutput, TurnRequest } from "./types.js";

/**
 * The replicas of one engine (`train --gpus N` starts one per device) as one client, routed
 * as verl's agent loop routes its servers (verl/experimental/agent_loop/agent_loop.py,
 * AsyncLLMServerManager): every turn of a trajectory goes to the replica that served its
 * first turn, whose prefix cache holds the context so far; a new trajectory goes to the
 * least loaded replica, the one with the fewest trajectories in flight (ties: the lowest
 * index). verl counts the requests each server was ever given (a heap it never decrements);
 * counting the trajectories still in flight follows the load as it is, and the lowest index
 * on a tie makes the choice a pure function of the loads.
 *
 * Routing never changes what is generated: every request carries its own seed and every
 * replica samples by the same rule, so a trajectory's tokens are the same on any replica (the
 * engine's log-probs may round differently with the batch a replica happens to run).
 * A replica's failure rejects naming it (`engine replica 1: ...`); new weights (and the
 * release and resume of the KV cache's memory) go to every replica at once.
 */
export class EngineRouter implements EngineClient {
  private readonly inFlight: number[];
  private readonly given: number[];

  constructor(readonly replicas: readonly EngineClient[]) {
    if (replicas.length === 0) throw new Error("EngineRouter needs at least one replica");
    this.inFlight = replicas.map(() => 0);
    this.given = replicas.map(() => 0);
  }

  /** Replica 0's URL (each replica has its own; see `replicas`). */
  get url(): string {
    return (this.replicas[0] as EngineClient).url;
  }

  /** Trajectories (and single requests) in flight on each replica, replica 0 first. */
  get load(): readonly number[] {
    return [...this.inFlight];
  }

  /** Trajectories (and single requests) each replica has been given so far. */
  get served(): readonly number[] {
    return [...this.given];
  }

  /**
   * A route for one trajectory: its first turn picks the least loaded replica, and every
   * later turn goes there too; `release()` when the trajectory is over (idempotent).
   */
  route(): EngineRoute {
    let replica: number | null = null;
    let released = false;
    return {
      generate: (request, signal) => {
        if (released) return Promise.reject(new Error("an engine route was used after release"));
        if (replica === null) {
          replica = this.leastLoaded();
          this.inFlight[replica] = (this.inFlight[replica] ?? 0) + 1;
          this.given[replica] = (this.given[replica] ?? 0) + 1;
        }
        const chosen = replica;
        return this.on(chosen, (engine) => engine.generate(request, signal));
      },
      release: () => {
        if (released) return;
        released = true;
        if (replica !== null) this.inFlight[replica] = (this.inFlight[replica] ?? 1) - 1;
      },
    };
  }

  /** One request outside a trajectory: the least loaded replica, counted while it runs. */
  async generate(request: TurnRequest, signal?: AbortSignal): Promise<TurnOutput> {
    const route = this.route();
    try {
      return await route.generate(request, signal);
    } finally {
      route.release();
    }
  }

  /** Every replica loads the folder, all at once; rejects naming the first that failed. */
  updateWeightsFromDisk(modelPath: string): Promise<void> {
    return this.updateWeightsFromDiskOf(() => modelPath);
  }

  /**
   * Every replica loads its own folder, `pathOf(replica)`: on several nodes, its node's copy
   * of the weights.
   */
  updateWeightsFromDiskOf(pathOf: (replica: number) => string): Promise<void> {
    return this.everyReplica("load weights from disk", (engine, replica) =>
      engine.updateWeightsFromDisk?.(pathOf(replica)),
    );
  }

  /**
   * Every replica loads its own copy of an adapter, `pathOf(replica)` (each node's), under
   * `name`, all at once.
   */
  loadLoraAdapterOf(name: string, pathOf: (replica: number) => string): Promise<void> {
    return this.everyReplica("load LoRA adapters", (engine, replica) =>
      engine.loadLoraAdapter?.(name, pathOf(replica)),
    );
  }

  loadLoraAdapter(name: string, path: string): Promise<void> {
    return this.loadLoraAdapterOf(name, () => path);
  }

  /** Every replica drops the adapter `name`, all at once. */
  unloadLoraAdapter(name: string): Promise<void> {
    return this.everyReplica("unload LoRA adapters", (engine) => engine.unloadLoraAdapter?.(name));
  }

  /** Every replica gives its KV cache's memory back, all at once. */
  releaseMemoryOccupation(): Promise<void> {
    return this.everyReplica("release its memory", (engine) => engine.releaseMemoryOccupation?.());
  }

  /** Every replica takes its KV cache's memory again, all at once. */
  resumeMemoryOccupation(): Promise<void> {
    return this.everyReplica("resume its memory", (engine) => engine.resumeMemoryOccupation?.());
  }

  /**
   * `call` on every replica at once; rejects, once all have answered, naming the first
   * (lowest index) that failed, or one that has no such call (`call` returned undefined).
   */
  private async everyReplica(
    what: string,
    call: (engine: EngineClient, replica: number) => Promise<void> | undefined,
  ): Promise<void> {
    const settled = await Promise.allSettled(
      this.replicas.map((_, i) =>
        this.on(i, async (engine) => {
          const done = call(engine, i);
          if (!done) throw new ServiceError(`engine ${engine.url} cannot ${what}`);
          await done;
        }),
      ),
    );
    const failed = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
    if (failed) throw failed.reason;
  }

  private leastLoaded(): number {
    let best = 0;
    for (let i = 1; i < this.inFlight.length; i++) {
      if ((this.inFlight[i] as number) < (this.inFlight[best] as number)) best = i;
    }
    return best;
  }

  /** Runs `work` on replica `i`; a ServiceError it throws names the replica. */
  private async on<T>(i: number, work: (engine: EngineClient) => Promise<T>): Promise<T> {
    try {
      return await work(this.replicas[i] as EngineClient);
    } catch (err) {
      if (err instanceof ServiceError)
        throw new ServiceError(`engine replica ${i}: ${err.message}`);
      throw err;
    }
  }
}
