import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import { denseFields, retrieverKind } from "./dense.js";
import { listenFields, maxBodyField } from "./server-fields.js";
import { threadsField } from "./shared.js";

export const serveRetrieverSchema = z.strictObject({
  retriever: retrieverKind,
  index: z
    .string()
    .min(1)
    .describe(
      "index folder (bm25, from build-index) or faiss index file (e5_Flat.index, e5_HNSW64.index)",
    ),
  corpus: z.string().min(1).describe("corpus jsonl the index was built from"),
  ...denseFields,
  ef_search: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe("HNSW beam width; null = the efSearch stored in the index file"),
  fp16: z
    .boolean()
    .default(false)
    .describe("keep the flat vectors in memory as fp16: half the RAM, scores rounded to fp16"),
  faiss_gpu: z
    .boolean()
    .default(false)
    .describe(
      "Search-R1's flag: a flat index on the GPU(s) in fp16 (HNSW graphs stay on the CPU); without a usable GPU, the CPU after a note",
    ),
  gpus: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe("GPUs a --faiss_gpu index is sharded over (null = one)"),
  corpus_cache: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "folder for the row store of a dense index's corpus; null = ~/.cache/searchr1/corpus",
    ),
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
