import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { InputError } from "../runtime/errors.js";
import { writeFileAtomic } from "../runtime/write-atomic.js";

/**
 * A run's checkpoints: `<run>/global_step_<N>/` holds what the trainer saves (policy,
 * optimizer states, generators; written under a temporary name and renamed) and then the
 * controller's `controller.json` (step, KL coefficient, generation batches drawn). A folder without controller.json is
 * an interrupted save and is ignored; `latest_checkpointed_iteration.txt` (verl's name) is
 * rewritten last.
 */

export const LATEST = "latest_checkpointed_iteration.txt";
const CONTROLLER = "controller.json";

/** What the controller needs, besides the trainer's state, to go on as if never stopped. */
export interface ControllerState {
  step: number;
  klCoef: number;
  /**
   * Generation batches of prompts drawn so far (more than `step` with dynamic sampling,
   * algorithm.filter_groups); absent in checkpoints written before it: `step`.
   */
  genBatches?: number;
}

export const checkpointDir = (run: string, step: number): string =>
  join(run, `global_step_${step}`);

/** Marks a checkpoint whose trainer part is written as complete. */
export function completeCheckpoint(run: string, state: ControllerState): void {
  writeFileAtomic(join(checkpointDir(run, state.step), CONTROLLER), `${JSON.stringify(state)}\n`);
  writeFileAtomic(join(run, LATEST), `${state.step}\n`);
}

/** The newest complete checkpoint of a run, or null. */
export function latestCheckpoint(run: string): { dir: string; state: ControllerState } | null {
  if (!existsSync(run)) return null;
  const steps = readdirSync(run)
    .map((name) => /^global_step_(\d+)$/.exec(name)?.[1])
    .filter((s): s is string => s !== undefined)
    .map(Number)
    .sort((a, b) => b - a);
  for (const step of steps) {
    const found = readCheckpoint(checkpointDir(run, step), false);
    if (found) return found;
  }
  return null;
}

/** A checkpoint folder named by trainer.resume; `strict` makes a bad one an error. */
export function readCheckpoint(
  dir: string,
  strict: boolean,
): { dir: string; state: ControllerState } | null {
  const file = join(dir, CONTROLLER);
  if (!existsSync(file)) {
    if (strict)
      throw new InputError(
        `${dir}: not a complete searchr1 checkpoint (no ${CONTROLLER}) (trainer.resume)`,
      );
    return null;
  }
  const state = JSON.parse(readFileSync(file, "utf8")) as ControllerState;
  return { dir, state };
}
