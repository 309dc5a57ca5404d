import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";

export const buildIndexSchema = z.strictObject({
  retriever: z
    .enum(["bm25", "e5"])
    .default("bm25")
    .describe("index kind (e5, a dense index: not implemented yet)"),
  corpus: z.string().min(1).describe("corpus jsonl(.gz) with id and contents"),
  out: z.string().min(1).describe("index folder to write"),
  bm25: z
    .strictObject({
      k1: z.number().positive().default(0.9).describe("BM25 term-frequency saturation"),
      b: z.number().min(0).max(1).default(0.4).describe("BM25 length normalisation"),
    })
    .prefault({}),
  threads: z.number().int().positive().nullable().default(null).describe("null = all cores"),
  memory_mb: z
    .number()
    .positive()
    .default(2048)
    .describe("memory for buffered postings (all threads); more spills fewer runs to disk"),
  overwrite: z.boolean().default(false).describe("replace an existing index at --out"),
  quiet: z.boolean().default(false).describe("no progress output"),
});

export const buildIndexSpec: CommandConfigSpec<typeof buildIndexSchema> = {
  command: "build-index",
  schema: buildIndexSchema,
  env: {},
};
