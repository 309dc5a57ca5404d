import type { Command } from "commander";
import { defineCommand } from "../src/cli/define.js";
import { evalSpec } from "../src/config/schemas/eval.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: evalSpec,
    description:
      "run the search agent on test sets and report exact match per data source (not implemented yet)",
    flags: [
      { flags: "--model <dir>", key: "model.path" },
      { flags: "--data <files>", key: "data.val_files" },
      { flags: "--retriever-url <url>", key: "retriever.url" },
      { flags: "--gpus <n>", key: "gpus" },
      { flags: "--output-dir <dir>", key: "output_dir" },
    ],
    examples: [
      "searchr1 eval --model checkpoints/searchr1/nq_hotpotqa-grpo/global_step_1000/hf --data data/nq_hotpotqa/test.parquet",
      "searchr1 eval --model models/Qwen2.5-3B rollout.max_turns=4 retriever.topk=3",
    ],
  });
}
