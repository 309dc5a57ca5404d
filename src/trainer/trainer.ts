import type { ServiceError } from "../runtime/errors.js";
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
  ProfileReply,
  SaveCheckpointFields,
  StepReply,
  UpdateActorFields,
  UpdateCriticFields,
  ValuesFields,
} from "./protocol.js";
import type { ScratchDir } from "./scratch.js";

/**
 * What `train` drives: one `searchr1-trainer serve` process (TrainerProcess), or the ranks of
 * a data-parallel group behind the same calls (TrainerGroup). Each implements `send`; the
 * protocol's ops (native/src/train/SERVE.md) are typed calls over it, here once.
 */
export abstract class Trainer {
  /** Where batch and output files go; removed on shutdown, kill and death. */
  abstract readonly scratch: ScratchDir;
  /** Settles once every process has exited. */
  abstract readonly exited: Promise<void>;
  /** Why calls fail (a death, a shutdown, an interrupt); else null. */
  abstract get ended(): ServiceError | null;
  /** The last lines written on stderr. */
  abstract stderrTail(): string[];
  /** Told once, with the error calls reject with, if the trainer ends without being asked. */
  abstract onDeath(listener: (err: ServiceError) => void): void;
  /** Sends one command and resolves with its reply (without `id` and `ok`). */
  abstract send<O extends Op>(op: O, fields: Ops[O]["fields"]): Promise<Ops[O]["reply"]>;
  /** Asks the trainer to exit, waits for it and removes its folders. */
  abstract shutdown(): Promise<void>;
  /** SIGKILL, for emergencies: pending calls reject; waits for the exit. */
  abstract kill(): Promise<void>;

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

  /** Each rank's device time per operation since the last call (started with `profile`). */
  async profile(): Promise<ProfileReply[]> {
    return [await this.send("profile", {})];
  }
}
