import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parse as parseYaml } from "yaml";
import { type ConfigValues, commandLine, serverLine } from "../config/command-line.js";
import { buildIndexSpec } from "../config/schemas/build-index.js";
import { convertCkptSpec } from "../config/schemas/convert-ckpt.js";
import { evalSpec } from "../config/schemas/eval.js";
import { preprocessSpec } from "../config/schemas/preprocess.js";
import type { QuickstartConfig } from "../config/schemas/quickstart.js";
import { serveRetrieverSpec } from "../config/schemas/serve-retriever.js";
import { trainSpec } from "../config/schemas/train.js";
import type { CommandLine } from "../runtime/child-server.js";
import { packageRoot } from "../runtime/package-root.js";
import { DATA_SOURCES } from "../world/questions.js";
import { WORLD_FILES } from "../world/world.js";

/** A `searchr1-trainer sft` run of the warm start. */
export interface SftRecipe {
  steps: number;
  batchSize: number;
  lr: number;
  warmupSteps: number;
  minLrRatio: number;
}

/**
 * The warm start, in two stages. First a copy school: searchers only, behind a prompt of the
 * question alone (short rows, cheap steps); the tiny model needs a few hundred steps before
 * it copies names from the question and the passages at all (its loss sits near 0.5 until
 * about step 200, then falls to ~0.02). Then the demonstrations of mixed quality behind
 * Search-R1's prompt: mostly guessers, so the warm model guesses when greedy and searches in
 * about a quarter of its samples.
 */
export const COPY_SCHOOL: SftRecipe = {
  steps: 800,
  batchSize: 8,
  lr: 5e-3,
  warmupSteps: 10,
  minLrRatio: 0.1,
};
export const SFT: SftRecipe = {
  steps: 100,
  batchSize: 8,
  lr: 2e-3,
  warmupSteps: 10,
  minLrRatio: 0.1,
};

/**
 * LoRA's learning rate over full fine-tuning's: Thinking Machines' "LoRA Without Regret"
 * (2025) finds the best LoRA rate about 10x full fine-tuning's, for RL too; on the quickstart
 * world rank 8 at 10x follows full fine-tuning's reward curve, at 1x it lags by ~10 steps
 * (docs/commands/quickstart.md).
 */
export const LORA_LR_FACTOR = 10;

const RECIPE = () => join(packageRoot(), "templates", "configs", "quickstart.yaml");

/** The run's name under runs/quickstart/: the algorithm, and the LoRA rank when there is one. */
export const runName = (config: QuickstartConfig): string =>
  config.lora_rank > 0 ? `${config.algorithm}-lora${config.lora_rank}` : config.algorithm;

/** Where the quickstart's files go, and the command lines of its steps. */
export interface QuickstartSteps {
  /** The quickstart's folder, absolute. */
  dir: string;
  /** A path inside it. */
  at(...parts: string[]): string;
  preprocess: CommandLine;
  buildIndex: CommandLine;
  /** serve-retriever over the BM25 index, for both evals and train. */
  retriever: CommandLine;
  /** The arguments of `searchr1-trainer sft` from the model `from` into `out`. */
  sft(from: string, data: string, out: string, recipe: SftRecipe): string[];
  evaluate(model: string, out: string, retrieverUrl: string): CommandLine;
  /** With LoRA: `convert peft-to-hf` of a checkpoint's adapter into the warm model. */
  merge(adapter: string, out: string): CommandLine;
  train(retrieverUrl: string): CommandLine;
}

/**
 * The quickstart's steps as the commands they run, each command line typed by the callee's
 * schema and checked against it here (config/command-line.ts).
 */
export function quickstartSteps(config: QuickstartConfig): QuickstartSteps {
  const dir = resolve(config.dir);
  const at = (...parts: string[]) => join(dir, ...parts);
  const threads = config.threads ?? undefined;
  // Budgets shared by eval and train (the tiny model's context is 1024), and the engine's threads.
  const agent = {
    data: { max_prompt_length: 900, max_response_length: 64, max_obs_length: 256 },
    rollout: { max_turns: 2, engine_threads: threads },
    retriever: { topk: 1 },
  } satisfies ConfigValues<typeof evalSpec> & ConfigValues<typeof trainSpec>;
  const testFiles = [at("data", "test.parquet")];
  return {
    dir,
    at,
    preprocess: commandLine(preprocessSpec, {
      datasets: [...DATA_SOURCES],
      input: at("world", WORLD_FILES.datasets),
      out: at("data"),
      splits: ["train", "test"],
      overwrite: true,
    }),
    buildIndex: commandLine(buildIndexSpec, {
      corpus: at("world", WORLD_FILES.corpus),
      out: at("bm25"),
      overwrite: true,
    }),
    retriever: serverLine(serveRetrieverSpec, {
      index: at("bm25"),
      corpus: at("world", WORLD_FILES.corpus),
    }),
    sft: (from, data, out, recipe) => [
      "sft",
      "--model",
      from,
      "--data",
      data,
      "--out",
      out,
      "--steps",
      String(recipe.steps),
      "--batch-size",
      String(recipe.batchSize),
      "--lr",
      String(recipe.lr),
      "--lr-schedule",
      "cosine",
      "--warmup-steps",
      String(recipe.warmupSteps),
      "--min-lr-ratio",
      String(recipe.minLrRatio),
      "--metrics",
      `${out}.sft-metrics.jsonl`,
      "--overwrite",
      ...(threads ? ["--threads", String(threads)] : []),
    ],
    evaluate: (model, out, retrieverUrl) =>
      commandLine(evalSpec, {
        ...agent,
        model: { path: model },
        data: { ...agent.data, val_files: testFiles },
        retriever: { ...agent.retriever, url: retrieverUrl },
        output_dir: out,
      }),
    merge: (adapter, out) =>
      commandLine(convertCkptSpec, {
        kind: "peft-to-hf",
        input: adapter,
        hf_base: at("models", "warm"),
        out,
        overwrite: true,
        quiet: true,
      }),
    train: (retrieverUrl) =>
      commandLine(
        trainSpec,
        {
          ...agent,
          model: { path: at("models", "warm"), lora_rank: config.lora_rank },
          ...(config.lora_rank > 0 ? { actor: { lr: loraLr() } } : {}),
          algorithm: { name: config.algorithm },
          retriever: { ...agent.retriever, url: retrieverUrl },
          data: {
            ...agent.data,
            train_files: [at("data", "train.parquet")],
            val_files: testFiles,
            seed: config.seed,
          },
          trainer: {
            output_dir: at("runs"),
            experiment_name: runName(config),
            resume: "disable",
            threads,
            total_training_steps: config.train_steps ?? undefined,
            save_freq: config.train_steps ?? undefined,
          },
        },
        { configFile: RECIPE() },
      ),
  };
}

/** LORA_LR_FACTOR times quickstart.yaml's actor.lr (full fine-tuning's), as written: 3e-3. */
function loraLr(): number {
  const lr = (parseYaml(readFileSync(RECIPE(), "utf8")) as { actor?: { lr?: unknown } }).actor?.lr;
  if (typeof lr !== "number") throw new Error(`${RECIPE()}: actor.lr is not a number`);
  // 10 * 3e-4 is 0.0029999999999999996 in binary floating point.
  return Number((LORA_LR_FACTOR * lr).toPrecision(12));
}
