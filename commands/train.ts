import type { Command } from "commander";
import { defineCommand } from "../src/cli/define.js";
import { trainSpec } from "../src/config/schemas/train.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: trainSpec,
    description: "run GRPO or PPO with multi-turn search rollouts (not implemented yet)",
    flags: [
      { flags: "--model <dir>", key: "model.path" },
      { flags: "--algorithm <name>", key: "algorithm.name" },
      { flags: "--gpus <n>", key: "trainer.gpus" },
      { flags: "--retriever-url <url>", key: "retriever.url" },
      { flags: "--output-dir <dir>", key: "trainer.output_dir" },
      { flags: "--resume <mode>", key: "trainer.resume" },
    ],
    examples: [
      "searchr1 train --config run.yaml --gpus 8",
      "searchr1 train --model models/Qwen2.5-3B actor.lr=1e-6 data.train_batch_size=512 rollout.n=5",
    ],
  });
}
