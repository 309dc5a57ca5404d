import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import { denseFields, retrieverKind } from "./dense.js";

/** The index_factory strings the native builder makes (native/src/index/faiss_write.h). */
const FAISS_TYPE =
  /^(Flat|SQ8|SQfp16|HNSW([2-9]|[1-9]\d{1,3})(,(Flat|SQ8|SQfp16))?|IVF[1-9]\d{0,9}[kM]?,PQ[1-9]\d{0,4}(x[1-8])?)$/;
/** Chosen by measurement: docs/commands/build-index.md, "Choosing --ef-construction". */
export const DEFAULT_EF_CONSTRUCTION = 80;

export const buildIndexSchema = z.strictObject({
  retriever: retrieverKind,
  corpus: z.string().min(1).describe("corpus jsonl(.gz) with id and contents"),
  out: z
    .string()
    .min(1)
    .describe("index to write: a folder (bm25) or a faiss file such as e5_Flat.index (dense)"),
  ...denseFields,
  faiss_type: z
    .string()
    .regex(FAISS_TYPE, {
      message:
        "not an index_factory string searchr1 builds: Flat, HNSW{M}, HNSW{M},Flat, SQ8, SQfp16, HNSW{M},SQ8, HNSW{M},SQfp16 or IVF{nlist},PQ{M}[x{nbits}] with nbits 1 to 8 (e.g. HNSW64, IVF4096,PQ64)",
    })
    .default("Flat")
    .describe(
      "dense index (Search-R1's --faiss_type, a faiss index_factory string): Flat, HNSW{M}, SQ8, SQfp16, HNSW{M},SQ8, HNSW{M},SQfp16, IVF{nlist},PQ{M}[x{nbits}] (M divides the encoder's size; nlist at most the passages)",
    ),
  ef_construction: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe(
      `HNSW build beam (efConstruction); higher: better recall, slower build; null: ${DEFAULT_EF_CONSTRUCTION} for the HNSW types (refused with the others)`,
    ),
  batch_size: z
    .number()
    .int()
    .positive()
    .default(256)
    .describe("passages per encoder call of a dense build (and per checkpoint)"),
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

export type BuildIndexConfig = z.infer<typeof buildIndexSchema>;

export const buildIndexSpec: CommandConfigSpec<typeof buildIndexSchema> = {
  command: "build-index",
  schema: buildIndexSchema,
  env: {},
};
