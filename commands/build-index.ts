import type { Command } from "commander";
import { defineCommand } from "../src/cli/define.js";
import { buildIndexSpec } from "../src/config/schemas/build-index.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: buildIndexSpec,
    description: "build a BM25 index or a dense (e5) flat index over a corpus",
    flags: [
      { flags: "--retriever <kind>", key: "retriever" },
      { flags: "--corpus <file>", key: "corpus" },
      { flags: "--out <path>", key: "out" },
      { flags: "--threads <n>", key: "threads" },
      { flags: "--quiet", key: "quiet" },
    ],
    examples: [
      "searchr1 build-index --retriever bm25 --corpus /data/wiki-18.jsonl --out /data/bm25",
    ],
  });
}
