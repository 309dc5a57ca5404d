import { join } from "node:path";
import type { OpTime } from "../trainer/protocol.js";
import type { Trainer } from "../trainer/trainer.js";
import { MetricsLog } from "./metrics-log.js";

/** One line of profile.jsonl: what one trainer rank's device did during one step. */
export interface ProfileRow {
  step: number;
  rank: number;
  /** The device time of every operation together. */
  device_ms: number;
  /** Per operation, largest first (the trainer's `profile` reply). */
  ops: OpTime[];
}

/**
 * trainer.profile: `<run>/profile.jsonl`, one line per step and trainer rank with the device
 * time of each backend operation the rank ran since the step before (the trainer's `profile`
 * op, native/src/train/SERVE.md): the step's log-probs, updates and weight export, and the
 * checkpoint written after the step before. A resumed run drops the lines after its
 * checkpoint, as metrics.jsonl.
 */
export class ProfileLog {
  private readonly log: MetricsLog<ProfileRow>;

  constructor(runDir: string, resumedStep: number | null) {
    this.log = new MetricsLog<ProfileRow>(join(runDir, "profile.jsonl"));
    this.log.truncateAfter(resumedStep);
  }

  get path(): string {
    return this.log.path as string;
  }

  /** Starts the count afresh (after loading, which is no step's work). */
  async start(trainer: Trainer): Promise<void> {
    await trainer.profile();
  }

  /** Writes the step's lines; returns them, rank 0's first. */
  async record(trainer: Trainer, step: number): Promise<ProfileRow[]> {
    const rows = (await trainer.profile()).map((p, rank) => ({
      step,
      rank,
      device_ms: p.device_ms,
      ops: p.ops,
    }));
    for (const row of rows) this.log.append(row);
    return rows;
  }
}

/** "412.0 ms on the device: attention_backward 31 %, ..." for the `top` largest operations. */
export function profileSummary(row: ProfileRow, top = 3): string {
  const share = (ms: number) => (row.device_ms > 0 ? Math.round((100 * ms) / row.device_ms) : 0);
  const largest = row.ops
    .slice(0, top)
    .map((o) => `${o.op} ${share(o.ms)} %`)
    .join(", ");
  return `${row.device_ms.toFixed(1)} ms on the device: ${largest}`;
}
