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
  format: z
    .enum(["search-r1", "verl"])
    .default("search-r1")
    .describe(
      "rows as Search-R1's nq_search.py writes them (search-r1: tag prompt for rollout.multi_turn.format search_r1) or as verl's preprocess_search_r1_dataset.py does (verl: system message, <tool_call> prompt, searchR1_ sources, tools_kwargs, for format hermes)",
    ),
  template: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "built-in prompt template name (search-r1, r1-no-search, verl-tool-call) or a file with {question} (null: search-r1 for format search-r1, verl-tool-call for format verl)",
    ),
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
