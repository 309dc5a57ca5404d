import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { execa } from "execa";
import type { QuickstartConfig } from "../config/schemas/quickstart.js";
import type { Report } from "../eval/report.js";
import { ChildServer } from "../runtime/child-server.js";
import { ServiceError } from "../runtime/errors.js";
import { packageRoot } from "../runtime/package-root.js";
import { writeFileAtomic } from "../runtime/write-atomic.js";
import { latestCheckpoint } from "../train/checkpoints.js";
import { nativeExecutable } from "../trainer/native.js";
import { QUESTION_ONLY_TEMPLATE, writeDemonstrations } from "./demonstrations.js";
import { DATA_SOURCES } from "./questions.js";
import { WORLD_FILES, writeWorld } from "./world.js";

/** EM, searches per question and valid-action rate of one eval, pooled over all questions. */
export interface QuickstartScores {
  em: number;
  searches_per_question: number;
  valid_action_rate: number;
}

export interface QuickstartResult {
  before: QuickstartScores;
  after: QuickstartScores;
  seconds: number;
  algorithm: "grpo" | "ppo";
  seed: number;
  /** Where things are, for the closing table. */
  paths: { dir: string; run: string; plots: string; trained: string };
}

/**
 * The warm start, in two stages. First a copy school: searchers only, behind a prompt of the
 * question alone (short rows, cheap steps); the tiny model needs a few hundred steps before
 * it copies names from the question and the passages at all (its loss sits near 0.5 until
 * about step 200, then falls to ~0.02). Then the demonstrations of mixed quality behind
 * Search-R1's prompt: mostly guessers, so the warm model guesses when greedy and searches in
 * about a quarter of its samples.
 */
const COPY_SCHOOL = {
  steps: 800,
  batchSize: 8,
  lr: 5e-3,
  warmupSteps: 10,
  minLrRatio: 0.1,
};
const SFT = {
  steps: 100,
  batchSize: 8,
  lr: 2e-3,
  warmupSteps: 10,
  minLrRatio: 0.1,
};

/** Budgets shared by eval and train in the quickstart (the tiny model's context is 1024). */
const BUDGETS = [
  "data.max_prompt_length=900",
  "data.max_response_length=64",
  "data.max_obs_length=256",
  "rollout.max_turns=2",
  "retriever.topk=1",
];

/**
 * `searchr1 quickstart`: a tiny invented world from a seed, then the real commands one after
 * another — preprocess, build-index, serve-retriever, a warm start with `searchr1-trainer
 * sft` on demonstrations of mixed quality, eval, train, eval again — and the before/after
 * figures in `<dir>/quickstart.json`.
 */
export async function runQuickstart(
  config: QuickstartConfig,
  log: (line: string) => void,
  signal: AbortSignal,
): Promise<QuickstartResult> {
  const started = performance.now();
  const dir = resolve(config.dir);
  const at = (...parts: string[]) => join(dir, ...parts);
  const bin = join(packageRoot(), "bin", "searchr1");
  const threads = config.threads ? ["--threads", String(config.threads)] : [];
  const run = async (name: string, file: string, args: string[]) => {
    log(`== ${name}`);
    const t0 = performance.now();
    const child = execa(file, args, {
      stdin: "ignore",
      all: true,
      reject: false,
      cancelSignal: signal,
      forceKillAfterDelay: 10_000,
      env: { FORCE_COLOR: "0" },
    });
    let tail: string[] = [];
    createInterface({ input: child.all as NodeJS.ReadableStream }).on("line", (line) => {
      log(`   ${line}`);
      tail = [...tail.slice(-9), line];
    });
    const result = await child;
    signal.throwIfAborted();
    if (result.exitCode !== 0) {
      throw new ServiceError(
        `quickstart: ${name} failed (exit ${result.exitCode ?? result.signal}): ${tail.join(" | ")}`,
      );
    }
    log(`   (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
  };
  const searchr1 = (name: string, args: string[]) => run(name, process.execPath, [bin, ...args]);

  log(`== world (seed ${config.seed}) into ${dir}`);
  await writeWorld(at("world"), { seed: config.seed, overwrite: config.overwrite });
  await searchr1("preprocess", [
    "preprocess",
    ...DATA_SOURCES,
    "--input",
    at("world", WORLD_FILES.datasets),
    "--out",
    at("data"),
    "--splits",
    "train,test",
    "--overwrite",
  ]);
  await searchr1("build-index", [
    "build-index",
    "--corpus",
    at("world", WORLD_FILES.corpus),
    "--out",
    at("bm25"),
    "--overwrite",
  ]);
  log("== demonstrations: a copy school (searchers, the question alone as prompt)");
  const school = await writeDemonstrations(at("world"), at("bm25"), {
    outDir: at("sft", "copy-school"),
    guessFraction: 0,
    template: QUESTION_ONLY_TEMPLATE,
  });
  log(`   ${school.rows} demonstrations, ${school.maxTokens} tokens at most`);
  log("== demonstrations (searching and guessing) for the warm start");
  const demos = await writeDemonstrations(at("world"), at("bm25"), { outDir: at("sft") });
  log(`   ${demos.rows} demonstrations: ${demos.kinds.search} search, ${demos.kinds.guess} guess`);
  const sft = async (name: string, from: string, data: string, out: string, o: typeof SFT) =>
    run(name, nativeExecutable("searchr1-trainer"), [
      "sft",
      "--model",
      from,
      "--data",
      data,
      "--out",
      out,
      "--steps",
      String(o.steps),
      "--batch-size",
      String(o.batchSize),
      "--lr",
      String(o.lr),
      "--lr-schedule",
      "cosine",
      "--warmup-steps",
      String(o.warmupSteps),
      "--min-lr-ratio",
      String(o.minLrRatio),
      "--metrics",
      `${out}.sft-metrics.jsonl`,
      "--overwrite",
      ...threads,
    ]);
  await sft(
    "copy school (searchr1-trainer sft)",
    at("world", WORLD_FILES.model),
    school.safetensors,
    at("models", "copy-school"),
    COPY_SCHOOL,
  );
  await sft(
    "warm start (searchr1-trainer sft)",
    at("models", "copy-school"),
    demos.safetensors,
    at("models", "warm"),
    SFT,
  );

  log("== serve-retriever");
  const retriever = await ChildServer.start(
    "retriever",
    "serve-retriever",
    ["--index", at("bm25"), "--corpus", at("world", WORLD_FILES.corpus)],
    { signal },
  );
  try {
    const engine = config.threads ? [`rollout.engine_threads=${config.threads}`] : [];
    const evaluate = (name: string, model: string, out: string) =>
      searchr1(name, [
        "eval",
        "--model",
        model,
        "--data",
        at("data", "test.parquet"),
        "--retriever-url",
        retriever.url,
        "--out",
        out,
        ...BUDGETS,
        ...engine,
      ]);
    await evaluate("eval of the warm-started model", at("models", "warm"), at("eval-before"));
    await searchr1(`train (${config.algorithm})`, [
      "train",
      "--config",
      join(packageRoot(), "templates", "configs", "quickstart.yaml"),
      "--model",
      at("models", "warm"),
      "--algorithm",
      config.algorithm,
      "--retriever-url",
      retriever.url,
      "--output-dir",
      at("runs"),
      `data.train_files=${at("data", "train.parquet")}`,
      `data.val_files=${at("data", "test.parquet")}`,
      `data.seed=${config.seed}`,
      `trainer.experiment_name=${config.algorithm}`,
      "trainer.resume=disable",
      ...BUDGETS,
      ...engine,
      ...(config.threads ? [`trainer.threads=${config.threads}`] : []),
      ...(config.train_steps
        ? [
            `trainer.total_training_steps=${config.train_steps}`,
            `trainer.save_freq=${config.train_steps}`,
          ]
        : []),
    ]);
    const runDir = at("runs", "quickstart", config.algorithm);
    const last = latestCheckpoint(runDir);
    if (!last) throw new ServiceError(`quickstart: train wrote no checkpoint in ${runDir}`);
    const trained = join(last.dir, "policy");
    await evaluate("eval of the trained model", trained, at("eval-after"));

    const result: QuickstartResult = {
      before: scores(at("eval-before")),
      after: scores(at("eval-after")),
      seconds: (performance.now() - started) / 1000,
      algorithm: config.algorithm,
      seed: config.seed,
      paths: { dir, run: runDir, plots: join(runDir, "plots"), trained },
    };
    const { paths: _paths, ...json } = result;
    writeFileAtomic(at("quickstart.json"), `${JSON.stringify(json, null, 2)}\n`);
    return result;
  } finally {
    await retriever.stop();
  }
}

/** The pooled figures of an eval folder (its trajectories, all questions weighing the same). */
function scores(evalDir: string): QuickstartScores {
  const report = JSON.parse(readFileSync(join(evalDir, "report.json"), "utf8")) as Report;
  const sources = Object.values(report.sources);
  const n = sources.reduce((sum, s) => sum + s.n, 0);
  const pooled = (f: (s: Report["sources"][string]) => number) =>
    sources.reduce((sum, s) => sum + f(s) * s.n, 0) / n;
  return {
    em: pooled((s) => s.em),
    searches_per_question: pooled((s) => s.searches),
    // Valid actions over all actions: (turns − invalid) / turns, pooled.
    valid_action_rate:
      sources.reduce((sum, s) => sum + (s.turns - s.invalid_actions) * s.n, 0) /
      sources.reduce((sum, s) => sum + s.turns * s.n, 0),
  };
}

/** The before/after table printed at the end. */
export function quickstartTable(r: QuickstartResult): string {
  const row = (name: string, s: QuickstartScores) =>
    `${name.padEnd(20)} ${s.em.toFixed(3).padStart(6)}  ${s.searches_per_question.toFixed(2).padStart(8)}  ${s.valid_action_rate.toFixed(3).padStart(12)}`;
  return [
    `${"".padEnd(20)} ${"EM".padStart(6)}  ${"searches".padStart(8)}  ${"valid actions".padStart(12)}`,
    row("warm start (before)", r.before),
    row(`after ${r.algorithm.toUpperCase()}`, r.after),
    "",
    `${r.seconds.toFixed(0)} s in all; plots in ${r.paths.plots}; trained model ${r.paths.trained}`,
    "ask it about the world (questions in world/datasets/*/test.jsonl):",
    `  searchr1 serve-retriever --index ${join(r.paths.dir, "bm25")} --corpus ${join(r.paths.dir, "world", WORLD_FILES.corpus)} &`,
    `  searchr1 ask "<question>" --model ${r.paths.trained} retriever.topk=1 rollout.max_turns=2`,
  ].join("\n");
}
