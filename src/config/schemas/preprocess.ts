import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";

export const preprocessSchema = z.strictObject({
  datasets: z
    .array(z.string().min(1))
    .min(1)
    .describe("FlashRAG dataset folders to convert, in output order (nq, hotpotqa, ...)"),
  input: z.string().min(1).describe("folder holding <dataset>/<split>.jsonl[.gz]|.parquet"),
  out: z.string().min(1).describe("folder for train.parquet and test.parquet"),
  splits: z
    .array(z.enum(["train", "test"]))
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "which output files to write (null: train and test, train skipped when no dataset has a train split)",
    ),
  template: z
    .string()
    .min(1)
    .default("search-r1")
    .describe("built-in prompt template name (search-r1, r1-no-search) or a file with {question}"),
  strict: z
    .boolean()
    .default(false)
    .describe("treat an invalid row as an error instead of skipping it"),
  overwrite: z
    .boolean()
    .default(false)
    .describe("replace existing output files (only once all new ones are complete)"),
  quiet: z.boolean().default(false).describe("no progress output"),
});

export type PreprocessConfig = z.infer<typeof preprocessSchema>;

export const preprocessSpec: CommandConfigSpec<typeof preprocessSchema> = {
  command: "preprocess",
  schema: preprocessSchema,
  env: {},
};
