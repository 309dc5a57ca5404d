import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import { listenFields, maxBodyField } from "./server-fields.js";
import { threadsField } from "./shared.js";

export const serveRetrieverSchema = z.strictObject({
  retriever: z
    .enum(["bm25", "e5"])
    .default("bm25")
    .describe("index kind (e5, a dense index: not implemented yet)"),
  index: z.string().min(1).describe("index folder written by build-index"),
  corpus: z.string().min(1).describe("corpus jsonl the index was built from"),
  topk: z
    .number()
    .int()
    .positive()
    .default(3)
    .describe("documents per query when a request omits topk"),
  ...listenFields(8000),
  threads: threadsField("search threads"),
  max_queries: z
    .number()
    .int()
    .positive()
    .default(4096)
    .describe("most queries in one request (more: 413)"),
  max_topk: z
    .number()
    .int()
    .positive()
    .default(1000)
    .describe("largest topk a request may ask for (more: 400)"),
  max_body_mb: maxBodyField(16),
});

export type ServeRetrieverConfig = z.infer<typeof serveRetrieverSchema>;

export const serveRetrieverSpec: CommandConfigSpec<typeof serveRetrieverSchema> = {
  command: "serve-retriever",
  schema: serveRetrieverSchema,
  env: { SEARCHR1_RETRIEVER_PORT: "port" },
};
