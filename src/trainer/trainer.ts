import type { ServiceError } from "../runtime/errors.js";
import type {
  ActorMetrics,
  CriticMetrics,
  ExportFields,
  LoadCheckpointFields,
  LoadFields,
  LoadReply,
  LogProbsFields,
  SaveCheckpointFields,
  StepReply,
  UpdateActorFields,
  UpdateCriticFields,
  ValuesFields,
} from "./protocol.js";
import type { ScratchDir } from "./scratch.js";

/**
 * What `train` drives: one `searchr1-trainer serve` process (TrainerProcess), or the ranks of
 * a data-parallel group behind the same calls (TrainerGroup).
 */
export interface Trainer {
  /** Where batch and output files go; removed on shutdown, kill and death. */
  readonly scratch: ScratchDir;
  /** Settles once every process has exited. */
  readonly exited: Promise<void>;
  /** Why calls fail (a death, a shutdown, an interrupt); else null. */
  readonly ended: ServiceError | null;
  stderrTail(): string[];
  onDeath(listener: (err: ServiceError) => void): void;
  load(fields: LoadFields): Promise<LoadReply>;
  logProbs(fields: LogProbsFields): Promise<void>;
  values(fields: ValuesFields): Promise<void>;
  updateActor(fields: UpdateActorFields): Promise<ActorMetrics>;
  updateCritic(fields: UpdateCriticFields): Promise<CriticMetrics>;
  exportPolicy(fields: ExportFields): Promise<void>;
  saveCheckpoint(fields: SaveCheckpointFields): Promise<StepReply>;
  loadCheckpoint(fields: LoadCheckpointFields): Promise<StepReply>;
  shutdown(): Promise<void>;
  kill(): Promise<void>;
}
