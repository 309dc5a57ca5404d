import { join } from "node:path";
import { createInterface } from "node:readline";
import { execa } from "execa";
import type { QuickstartConfig } from "../config/schemas/quickstart.js";
import { ChildServer, type CommandLine, searchr1Argv } from "../runtime/child-server.js";
import { ServiceError } from "../runtime/errors.js";
import { nativeExecutable } from "../runtime/native-executable.js";
import { writeFileAtomic } from "../runtime/write-atomic.js";
import { latestCheckpoint } from "../train/checkpoints.js";
import { QUESTION_ONLY_TEMPLATE, writeDemonstrations } from "../world/demonstrations.js";
import { WORLD_FILES, writeWorld } from "../world/world.js";
import { type QuickstartResult, scores } from "./report.js";
import { COPY_SCHOOL, quickstartSteps, runName, SFT, type SftRecipe } from "./steps.js";

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
  const steps = quickstartSteps(config);
  const { dir, at } = steps;
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
  const searchr1 = (name: string, line: CommandLine) =>
    run(name, process.execPath, searchr1Argv(line));

  log(`== world (seed ${config.seed}) into ${dir}`);
  await writeWorld(at("world"), { seed: config.seed, overwrite: config.overwrite });
  await searchr1("preprocess", steps.preprocess);
  await searchr1("build-index", steps.buildIndex);
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
  const sft = (name: string, from: string, data: string, out: string, recipe: SftRecipe) =>
    run(name, nativeExecutable("searchr1-trainer"), steps.sft(from, data, out, recipe));
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
  const retriever = await ChildServer.start("retriever", steps.retriever, { signal });
  try {
    const evaluate = (name: string, model: string, out: string) =>
      searchr1(name, steps.evaluate(model, out, retriever.url));
    await evaluate("eval of the warm-started model", at("models", "warm"), at("eval-before"));
    const lora = config.lora_rank > 0 ? ` with LoRA rank ${config.lora_rank}` : "";
    await searchr1(`train (${config.algorithm}${lora})`, steps.train(retriever.url));
    const runDir = at("runs", "quickstart", runName(config));
    const last = latestCheckpoint(runDir);
    if (!last) throw new ServiceError(`quickstart: train wrote no checkpoint in ${runDir}`);
    let trained = join(last.dir, "policy");
    if (lora) {
      // A LoRA checkpoint holds the adapter; eval gets the warm model with it merged.
      trained = at("models", `trained-${runName(config)}`);
      await searchr1(
        "merge the adapter (convert peft-to-hf)",
        steps.merge(join(last.dir, "adapter"), trained),
      );
    }
    await evaluate("eval of the trained model", trained, at("eval-after"));

    const result: QuickstartResult = {
      before: scores(at("eval-before")),
      after: scores(at("eval-after")),
      seconds: (performance.now() - started) / 1000,
      algorithm: config.algorithm,
      lora_rank: config.lora_rank,
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
