import { z } from "zod";

/** Retriever kinds: BM25, or a dense encoder recipe named as Search-R1 names it. */
export const retrieverKind = z
  .enum(["bm25", "e5", "bge"])
  .default("bm25")
  .describe(
    'bm25, or a dense retriever: e5 ("query: "/"passage: " prefixes, mean pooling) or bge (query instruction, CLS pooling)',
  );

/** The dense encoder's keys, shared by build-index and serve-retriever. */
export const denseFields = {
  retriever_model: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe("dense encoder folder (e.g. intfloat/e5-base-v2, downloaded); required for e5/bge"),
  pooling: z
    .enum(["mean", "cls"])
    .nullable()
    .default(null)
    .describe("embedding pooling; null = the retriever's (e5 mean, bge cls)"),
  max_length: z
    .number()
    .int()
    .positive()
    .default(256)
    .describe("tokens per text the encoder sees (Search-R1: 256)"),
  device: z
    .enum(["auto", "cpu", "cuda"])
    .default("auto")
    .describe("where the encoder runs; auto = a GPU when there is one"),
};
