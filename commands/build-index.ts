import type { Command } from "commander";
import { defineCommand } from "../src/cli/define.js";
import { buildIndexSpec } from "../src/config/schemas/build-index.js";
import { buildBm25Index } from "../src/retrieval/bm25/build.js";
import { UsageError } from "../src/runtime/errors.js";
import { withInterrupt } from "../src/runtime/interrupt.js";
import { createProgress, formatBytes } from "../src/runtime/progress.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: buildIndexSpec,
    description:
      "build a BM25 index over a jsonl(.gz) corpus (dense e5 indexes: not implemented yet)",
    flags: [
      { flags: "--retriever <kind>", key: "retriever" },
      { flags: "--corpus <file>", key: "corpus" },
      { flags: "--out <path>", key: "out" },
      { flags: "--k1 <x>", key: "bm25.k1" },
      { flags: "--b <x>", key: "bm25.b" },
      { flags: "--threads <n>", key: "threads" },
      { flags: "--memory-mb <n>", key: "memory_mb" },
      { flags: "--overwrite", key: "overwrite" },
      { flags: "--quiet", key: "quiet" },
    ],
    examples: [
      "searchr1 build-index --retriever bm25 --corpus /data/wiki-18.jsonl --out /data/bm25",
      "searchr1 build-index --corpus corpus.jsonl.gz --out idx --k1 1.2 --b 0.75 --threads 8",
    ],
    run: async (config) => {
      if (config.retriever !== "bm25") {
        throw new UsageError(
          "build-index --retriever e5: dense indexes are not implemented yet; use --retriever bm25",
        );
      }
      const progress = createProgress({ quiet: config.quiet });
      const meta = await withInterrupt((signal) =>
        buildBm25Index({
          corpus: config.corpus,
          out: config.out,
          k1: config.bm25.k1,
          b: config.bm25.b,
          threads: config.threads,
          memoryMb: config.memory_mb,
          overwrite: config.overwrite,
          progress,
          signal,
        }),
      );
      const { documents, terms, postings } = meta.counts;
      const rate = Math.round(documents / Math.max(meta.built.seconds, 1e-3));
      process.stdout.write(
        `${config.out}: ${documents.toLocaleString("en-US")} passages, ` +
          `${terms.toLocaleString("en-US")} terms, ${postings.toLocaleString("en-US")} postings ` +
          `in ${meta.built.seconds.toFixed(1)} s (${rate.toLocaleString("en-US")} passages/s); ` +
          `corpus ${formatBytes(meta.corpus.bytes)}\n`,
      );
    },
  });
}
