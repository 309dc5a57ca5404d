/**
 * The experiment trackers of trainer.logger beside console, jsonl and plot: `tensorboard`
 * (event files under `<run folder>/tensorboard/`) and `wandb` (a W&B run over its HTTP API).
 * Each gets every step's row once the step is done; W&B also gets the plots as images at
 * the steps that checkpoint (and the last).
 */
import { existsSync, readFileSync } from "node:fs";
import { basename, join } from "node:path";
import { rawConfig } from "../config/key-reads.js";
import type { TrainConfig } from "../config/schemas/train.js";
import { writeFileAtomic } from "../runtime/write-atomic.js";
import type { MetricsRow } from "./metrics-log.js";
import { TensorBoardWriter } from "./tensorboard.js";
import { WandbRun, type WandbSettings, wandbSettings } from "./wandb.js";

export interface Trackers {
  /** What they write in the run folder, as `train`'s closing line names it ("tensorboard/"). */
  readonly wrote: readonly string[];
  /** A step's row; `plots`: the plot files to attach as images (none on most steps). */
  log(row: MetricsRow, plots: readonly string[]): void;
  /** Flushes and closes; `exitCode` 0 for a finished run. */
  close(exitCode: number): Promise<void>;
}

/**
 * What trainer.logger asks of the environment, checked before anything starts: W&B's
 * settings when the list has wandb (a UsageError naming the variable when they are missing
 * or refused; null when WANDB_MODE=disabled or wandb is not asked for).
 */
export function trackerSettings(
  config: TrainConfig,
  env: Readonly<Record<string, string | undefined>> = process.env,
): { wandb: WandbSettings | null; wandbDisabled: boolean } {
  if (!config.trainer.logger.includes("wandb")) return { wandb: null, wandbDisabled: false };
  const wandb = wandbSettings(env);
  return { wandb, wandbDisabled: wandb === null };
}

/** Where a run folder keeps the id of its W&B run, so that a resumed run continues it. */
const WANDB_RUN_FILE = "wandb-run.json";

/**
 * The run's W&B run: WANDB_RUN_ID's when set; else, when resuming (firstStep > 0), the one
 * this run folder started before; else a new one, whose id the folder then keeps.
 */
async function startWandb(
  settings: WandbSettings,
  config: TrainConfig,
  runDir: string,
  firstStep: number,
  log: (line: string) => void,
): Promise<WandbRun> {
  const file = join(runDir, WANDB_RUN_FILE);
  let runId = settings.runId;
  if (runId === null && firstStep > 0 && existsSync(file)) {
    runId = (JSON.parse(readFileSync(file, "utf8")) as { id?: string }).id ?? null;
  }
  const run = await WandbRun.start(
    { ...settings, runId },
    {
      project: config.trainer.project_name,
      name: config.trainer.experiment_name,
      config: rawConfig(config) as Record<string, unknown>,
      log,
    },
  );
  writeFileAtomic(file, `${JSON.stringify({ id: run.runId })}\n`);
  return run;
}

/**
 * Opens the trackers trainer.logger lists; `firstStep` is the first step this process logs
 * (0 for a fresh run, N + 1 when resuming from step N).
 */
export async function openTrackers(
  config: TrainConfig,
  runDir: string,
  firstStep: number,
  settings: ReturnType<typeof trackerSettings>,
  log: (line: string) => void,
): Promise<Trackers> {
  const { logger } = config.trainer;
  const tensorboard = logger.includes("tensorboard")
    ? new TensorBoardWriter(join(runDir, "tensorboard"), firstStep)
    : null;
  if (settings.wandbDisabled) log("W&B: off (WANDB_MODE=disabled)");
  const wandb = settings.wandb
    ? await startWandb(settings.wandb, config, runDir, firstStep, log)
    : null;
  return {
    wrote: tensorboard ? ["tensorboard/"] : [],
    log(row, plots) {
      tensorboard?.log(row);
      if (wandb) {
        const images = plots
          .filter((p) => p.endsWith(".png"))
          .map((p) => ({ key: `plots/${basename(p, ".png")}`, png: readFileSync(p) }));
        wandb.log(row, images);
      }
    },
    async close(exitCode) {
      await wandb?.finish(exitCode);
    },
  };
}
