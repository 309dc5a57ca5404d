import type { Command } from "commander";
import { defineCommand } from "../src/cli/define.js";
import { serveRetrieverSpec } from "../src/config/schemas/serve-retriever.js";

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
    ],
    examples: [
      "searchr1 serve-retriever --retriever bm25 --index /data/bm25 --corpus /data/wiki-18.jsonl --port 8000",
    ],
  });
}
