import type { Command } from "commander";
import { defineCommand } from "../src/command/define.js";
import { quickstartSpec } from "../src/config/schemas/quickstart.js";
import { runQuickstart } from "../src/quickstart/pipeline.js";
import { quickstartTable } from "../src/quickstart/report.js";
import { withInterrupt } from "../src/runtime/interrupt.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: quickstartSpec,
    description:
      "watch a tiny model learn to search on a CPU: an invented world, warm start, eval, RL, eval again",
    flags: [
      { flags: "--dir <dir>", key: "dir" },
      { flags: "--algorithm <name>", key: "algorithm" },
      { flags: "--seed <n>", key: "seed" },
      { flags: "--lora-rank <r>", key: "lora_rank" },
      { flags: "--threads <n>", key: "threads" },
      { flags: "--overwrite", key: "overwrite" },
    ],
    examples: [
      "searchr1 quickstart",
      "searchr1 quickstart --dir qs-ppo --algorithm ppo --seed 2",
      "searchr1 quickstart --dir qs-lora --lora-rank 8",
    ],
    run: async (config) => {
      const result = await withInterrupt(
        (signal) => runQuickstart(config, (line) => process.stderr.write(`${line}\n`), signal),
        "interrupted",
      );
      process.stdout.write(`${quickstartTable(result)}\n`);
    },
  });
}
