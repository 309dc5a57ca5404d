import type { Command } from "commander";
import { defineCommand } from "../src/command/define.js";
import { preprocessSpec } from "../src/config/schemas/preprocess.js";
import { formatSummary, runPreprocess } from "../src/data/preprocess.js";
import { withInterrupt } from "../src/runtime/interrupt.js";
import { createProgress } from "../src/runtime/progress.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: preprocessSpec,
    description: "turn FlashRAG-layout QA datasets into Search-R1/verl train and test parquet",
    positional: { name: "dataset", key: "datasets" },
    flags: [
      { flags: "--input <dir>", key: "input" },
      { flags: "--out <dir>", key: "out" },
      { flags: "--splits <list>", key: "splits" },
      { flags: "--format <search-r1|verl>", key: "format" },
      { flags: "--template <name|file>", key: "template" },
      { flags: "--strict", key: "strict" },
      { flags: "--overwrite", key: "overwrite" },
      { flags: "--quiet", key: "quiet" },
    ],
    examples: [
      "searchr1 preprocess nq hotpotqa --input data/FlashRAG_datasets --out data/nq_hotpotqa",
      "searchr1 preprocess nq triviaqa popqa hotpotqa 2wikimultihopqa musique bamboogle --input data/FlashRAG_datasets --out data/all --splits test",
      "searchr1 preprocess nq --input data/FlashRAG_datasets --out data/nq_r1 --template r1-no-search",
      "searchr1 preprocess nq hotpotqa --input data/FlashRAG_datasets --out data/searchR1_processed_direct --format verl",
    ],
    run: async (config) => {
      const progress = createProgress({ quiet: config.quiet });
      const summary = await withInterrupt((signal) => runPreprocess(config, progress, signal));
      process.stdout.write(`${formatSummary(summary)}\n`);
    },
  });
}
