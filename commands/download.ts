import type { Command } from "commander";
import { defineCommand } from "../src/command/define.js";
import { downloadSpec } from "../src/config/schemas/download.js";
import { formatReport, runDownload } from "../src/hub/download.js";
import { withInterrupt } from "../src/runtime/interrupt.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: downloadSpec,
    description: "fetch corpora, indexes, datasets and models from a Hugging Face-compatible hub",
    flags: [
      { flags: "--save-path <dir>", key: "save_path" },
      { flags: "--what <list>", key: "what" },
      { flags: "--repo <owner/name>", key: "repo" },
      { flags: "--repo-type <type>", key: "repo_type" },
      { flags: "--include <globs>", key: "include" },
      { flags: "--revision <rev>", key: "revision" },
      { flags: "--token <token>", key: "token" },
      { flags: "--connections <n>", key: "connections" },
      { flags: "--parallel-files <n>", key: "parallel_files" },
      { flags: "--keep-parts", key: "keep_parts" },
      { flags: "--keep-gz", key: "keep_gz" },
      { flags: "--dry-run", key: "dry_run" },
      { flags: "--quiet", key: "quiet" },
    ],
    examples: [
      "searchr1 download --save-path /data",
      "searchr1 download --save-path /data --what flashrag:nq,hotpotqa",
      "searchr1 download --save-path /models --what model:Qwen/Qwen2.5-3B",
      "searchr1 download --save-path data --repo PeterJinGo/nq_hotpotqa_train --include '*.parquet'",
      "searchr1 download --save-path /data --what e5-flat,corpus,bm25 --dry-run",
    ],
    run: async (config) => {
      const report = await withInterrupt(
        (signal) => runDownload(config, signal),
        "interrupted; partial downloads are kept as <file>.incomplete, run the same command to resume",
      );
      process.stdout.write(`${formatReport(report, config.dry_run)}\n`);
    },
  });
}
