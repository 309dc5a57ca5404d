import type { Command } from "commander";
import { defineCommand } from "../src/cli/define.js";
import { serveRetrieverSpec } from "../src/config/schemas/serve-retriever.js";
import { serveRetriever } from "../src/retrieval/server-main.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: serveRetrieverSpec,
    description: "serve POST /retrieve exactly as Search-R1's retrieval server does",
    flags: [
      { flags: "--retriever <kind>", key: "retriever" },
      { flags: "--index <path>", key: "index" },
      { flags: "--corpus <file>", key: "corpus" },
      { flags: "--topk <n>", key: "topk" },
      { flags: "--host <host>", key: "host" },
      { flags: "--port <port>", key: "port" },
      { flags: "--threads <n>", key: "threads" },
      { flags: "--max-queries <n>", key: "max_queries" },
      { flags: "--max-topk <n>", key: "max_topk" },
      { flags: "--max-body-mb <n>", key: "max_body_mb" },
      // Search-R1's retrieval_server.py spellings, so its launch lines work unchanged.
      {
        flags: "--retriever_name <kind>",
        key: "retriever",
        description: "Search-R1's spelling of --retriever",
      },
      {
        flags: "--index_path <path>",
        key: "index",
        description: "Search-R1's spelling of --index",
      },
      {
        flags: "--corpus_path <file>",
        key: "corpus",
        description: "Search-R1's spelling of --corpus",
      },
    ],
    examples: [
      "searchr1 serve-retriever --retriever bm25 --index /data/bm25 --corpus /data/wiki-18.jsonl --port 8000",
      "searchr1 serve-retriever --index_path /data/bm25 --corpus_path /data/wiki-18.jsonl --topk 3 --retriever_name bm25",
      "searchr1 serve-retriever --index idx --corpus corpus.jsonl --host 0.0.0.0 --threads 8 max_queries=8192",
    ],
    run: (config) => serveRetriever(config),
  });
}
