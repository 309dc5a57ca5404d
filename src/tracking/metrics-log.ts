import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { writeFileAtomic } from "../runtime/write-atomic.js";

/** One line of metrics.jsonl: `step` and flat metric names (`reward/mean`, `val/em/nq`, ...). */
export type MetricsRow = { step: number } & Record<string, number | null>;

/**
 * `metrics.jsonl`, one line per step (a validation adds its keys to its step's line, the one
 * before training to step 0). A resumed run first drops the lines after its checkpoint, so
 * the file reads as if the run had never stopped. Without a path (trainer.logger without
 * jsonl) the rows are kept in memory only, for the plots of this process's steps. Other
 * per-step logs (profile.jsonl) use it with their own rows.
 */
export class MetricsLog<Row extends { step: number } = MetricsRow> {
  private readonly memory: Row[] = [];

  constructor(readonly path: string | null) {}

  rows(): Row[] {
    if (this.path === null) return [...this.memory];
    if (!existsSync(this.path)) return [];
    return readFileSync(this.path, "utf8")
      .split("\n")
      .filter((l) => l.trim() !== "")
      .flatMap((l) => {
        try {
          return [JSON.parse(l) as Row];
        } catch {
          return []; // a line torn by an interruption
        }
      });
  }

  /** Keeps the rows up to `step` (all when null: a fresh run starts an empty file). */
  truncateAfter(step: number | null): void {
    if (this.path === null) return;
    const kept = step === null ? [] : this.rows().filter((r) => r.step <= step);
    writeFileAtomic(this.path, kept.map((r) => `${JSON.stringify(r)}\n`).join(""));
  }

  append(row: Row): void {
    if (this.path === null) this.memory.push(row);
    else appendFileSync(this.path, `${JSON.stringify(row)}\n`);
  }
}
