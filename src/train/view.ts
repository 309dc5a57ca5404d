import type { Progress, ProgressTask } from "../runtime/progress.js";
import type { MetricsRow } from "../tracking/metrics-log.js";
import type { TrainView } from "./run.js";

const fmt = (v: number | null | undefined, digits = 3) =>
  v === null || v === undefined ? "-" : v.toFixed(digits);

/** The step's main numbers in one line. */
export function summaryLine(row: MetricsRow, total: number): string {
  const parts = [`step ${row.step}/${total}`];
  if (row["reward/mean"] !== undefined) {
    parts.push(
      `reward ${fmt(row["reward/mean"])}`,
      `searches ${fmt(row["searches/mean"], 2)}`,
      `valid ${fmt(row["valid_action/ratio"], 2)}`,
      `len ${fmt(row["response_length/mean"], 0)}`,
      `kl ${fmt(row["actor/kl_loss"], 4)}`,
      `entropy ${fmt(row["actor/entropy"], 2)}`,
      `${fmt(row["timing/step_s"], 1)} s`,
    );
  }
  if (row["val/em/mean"] !== undefined) parts.push(`val EM ${fmt(row["val/em/mean"])}`);
  return parts.join("  ");
}

/**
 * On a terminal: a bar over the steps with the phase, ETA and the last numbers; otherwise
 * one plain line per step (and a line per phase), which logs and CI read well.
 */
export function trainView(progress: Progress, tty: boolean): TrainView & { finish(): void } {
  let task: ProgressTask | null = null;
  let last = "";
  let done = 0;
  return {
    log: (line) => progress.log(line),
    phase(step, total, phase) {
      if (!tty) return;
      task ??= progress.task("train", total, "steps");
      task.update(done, `${phase} step ${step}${last ? ` | ${last}` : ""}`);
    },
    stepDone(row, total) {
      done = row.step;
      const line = summaryLine(row, total);
      if (tty) {
        last = line.replace(/^step \S+\s+/, "");
        task ??= progress.task("train", total, "steps");
        task.update(done, last);
      } else {
        progress.log(line);
      }
    },
    finish() {
      task?.finish();
    },
  };
}
