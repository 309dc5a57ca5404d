import type { Command } from "commander";
import { defineCommand } from "../src/command/define.js";
import type { BuildIndexConfig } from "../src/config/schemas/build-index.js";
import { buildIndexSpec, DEFAULT_EF_CONSTRUCTION } from "../src/config/schemas/build-index.js";
import { buildBm25Index } from "../src/retrieval/bm25/build.js";
import { buildDenseIndex } from "../src/retrieval/dense/build.js";
import { denseRecipe } from "../src/retrieval/dense/recipe.js";
import { UsageError } from "../src/runtime/errors.js";
import { withInterrupt } from "../src/runtime/interrupt.js";
import { createProgress, formatBytes } from "../src/runtime/progress.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: buildIndexSpec,
    description:
      "build a BM25 index folder, or a dense (e5/bge) faiss index file, over a jsonl(.gz) corpus",
    flags: [
      { flags: "--retriever <kind>", key: "retriever" },
      { flags: "--corpus <file>", key: "corpus" },
      { flags: "--out <path>", key: "out" },
      { flags: "--k1 <x>", key: "bm25.k1" },
      { flags: "--b <x>", key: "bm25.b" },
      { flags: "--threads <n>", key: "threads" },
      { flags: "--memory-mb <n>", key: "memory_mb" },
      { flags: "--retriever-model <dir>", key: "retriever_model" },
      { flags: "--pooling <mean|cls>", key: "pooling" },
      { flags: "--max-length <n>", key: "max_length" },
      { flags: "--device <device>", key: "device" },
      { flags: "--faiss-type <type>", key: "faiss_type" },
      { flags: "--ef-construction <n>", key: "ef_construction" },
      { flags: "--batch-size <n>", key: "batch_size" },
      { flags: "--overwrite", key: "overwrite" },
      { flags: "--quiet", key: "quiet" },
    ],
    examples: [
      "searchr1 build-index --retriever bm25 --corpus /data/wiki-18.jsonl --out /data/bm25",
      "searchr1 build-index --corpus corpus.jsonl.gz --out idx --k1 1.2 --b 0.75 --threads 8",
      "searchr1 build-index --retriever e5 --retriever-model /models/e5-base-v2 --corpus /data/wiki-18.jsonl --out /data/e5_Flat.index",
      "searchr1 build-index --retriever e5 --retriever-model /models/e5-base-v2 --corpus /data/wiki-18.jsonl --faiss-type HNSW64 --out /data/e5_HNSW64.index",
    ],
    run: async (config) => {
      if (config.retriever !== "bm25") return buildDense(config);
      if (config.faiss_type !== "Flat" || config.ef_construction !== null) {
        throw new UsageError(
          "--faiss-type and --ef-construction build a dense index: --retriever bm25 has none",
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

async function buildDense(config: BuildIndexConfig): Promise<void> {
  const flag = `--retriever ${config.retriever}`;
  if (config.retriever_model === null) {
    throw new UsageError(
      `${flag} needs the encoder: set --retriever-model (e.g. a download of intfloat/e5-base-v2)`,
    );
  }
  const hnsw = config.faiss_type.startsWith("HNSW");
  if (config.ef_construction !== null && !hnsw) {
    throw new UsageError(
      `--ef-construction builds an HNSW graph: --faiss-type ${config.faiss_type} has none`,
    );
  }
  const out = config.out;
  const progress = createProgress({ quiet: config.quiet });
  const result = await withInterrupt(
    (signal) =>
      buildDenseIndex({
        corpus: config.corpus,
        out,
        faissType: config.faiss_type,
        efConstruction: hnsw ? (config.ef_construction ?? DEFAULT_EF_CONSTRUCTION) : null,
        model: config.retriever_model as string,
        recipe: denseRecipe(config.retriever, {
          pooling: config.pooling,
          maxLength: config.max_length,
        }),
        batchSize: config.batch_size,
        device: config.device,
        threads: config.threads,
        overwrite: config.overwrite,
        progress,
        signal,
      }),
    `interrupted; the passages encoded so far are kept in ${out}.partial: run the same ` +
      "command again to resume",
  );
  const rate = Math.round((result.rows - result.resumedAt) / Math.max(result.seconds, 1e-3));
  process.stdout.write(
    `${out}: ${result.rows.toLocaleString("en-US")} passages (${result.type}, ` +
      `${formatBytes(result.bytes)}) in ${result.seconds.toFixed(1)} s ` +
      `(${rate.toLocaleString("en-US")} passages/s` +
      `${result.resumedAt > 0 ? `; resumed at ${result.resumedAt.toLocaleString("en-US")}` : ""})\n`,
  );
}
