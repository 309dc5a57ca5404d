import { join, resolve } from "node:path";
import { type ConfigValues, commandLine, serverLine } from "../config/command-line.js";
import { buildIndexSpec } from "../config/schemas/build-index.js";
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
    train: (retrieverUrl) =>
      commandLine(
        trainSpec,
        {
          ...agent,
          model: { path: at("models", "warm") },
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
            experiment_name: config.algorithm,
            resume: "disable",
            threads,
            total_training_steps: config.train_steps ?? undefined,
            save_freq: config.train_steps ?? undefined,
          },
        },
        { configFile: join(packageRoot(), "templates", "configs", "quickstart.yaml") },
      ),
  };
}
