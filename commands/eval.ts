import { join, resolve } from "node:path";
import type { Command } from "commander";
import { defineCommand } from "../src/command/define.js";
import { evalSpec } from "../src/config/schemas/eval.js";
import { compareRuns, comparisonTable } from "../src/eval/compare.js";
import { reportTable } from "../src/eval/report.js";
import { runEval, TRAJECTORIES } from "../src/eval/run.js";
import { withInterrupt } from "../src/runtime/interrupt.js";
import { createProgress } from "../src/runtime/progress.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: evalSpec,
    description:
      "run the search agent on test sets: EM, sub-EM and F1 per data source, searches and turns (report.json, report.md, trajectories.jsonl)",
    flags: [
      { flags: "--model <dir>", key: "model.path" },
      { flags: "--lora <dir>", key: "model.lora_adapter_path" },
      { flags: "--data <files>", key: "data.val_files" },
      { flags: "--retriever-url <url>", key: "retriever.url" },
      { flags: "--engine <kind>", key: "rollout.engine" },
      { flags: "--engine-url <url>", key: "rollout.engine_url" },
      { flags: "--out <dir>", key: "output_dir" },
      { flags: "--limit <n>", key: "data.limit" },
      { flags: "--sources <list>", key: "data.sources" },
      { flags: "--sample", key: "rollout.do_sample" },
      { flags: "--compat <mode>", key: "rollout.compat" },
      { flags: "--compare <runs...>", key: "compare" },
      { flags: "--gpus <n>", key: "gpus" },
    ],
    examples: [
      "searchr1 eval --model checkpoints/searchr1/nq_hotpotqa-grpo/global_step_1000/hf --data data/nq_hotpotqa/test.parquet --out eval/step1000",
      "searchr1 eval --model models/Qwen2.5-3B --engine-url http://127.0.0.1:30000 --sources nq,hotpotqa --limit 500 rollout.max_turns=4 retriever.topk=3",
      "searchr1 eval --compare eval/base eval/step1000",
    ],
    run: async (config) => {
      if (config.compare) {
        const rows = compareRuns(config.compare);
        process.stdout.write(`${comparisonTable(rows, config.compare)}\n`);
        return;
      }
      const out = resolve(config.output_dir);
      const report = await withInterrupt(
        (signal) => runEval(config, createProgress(), signal),
        `interrupted; the finished questions are in ${join(out, TRAJECTORIES)}: run the same command again to resume`,
      );
      process.stdout.write(`${reportTable(report)}\n`);
      process.stdout.write(`report: ${join(out, "report.json")}, ${join(out, "report.md")}\n`);
    },
  });
}
