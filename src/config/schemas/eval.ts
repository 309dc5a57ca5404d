import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import {
  agentEnv,
  decodingFields,
  generationFields,
  lengthFields,
  modelCompat,
  modelSection,
  positiveInt,
  retrieverSection,
  servedAdapterField,
} from "./shared.js";
import { trainSchema } from "./train.js";

export const evalSchema = z.strictObject({
  model: modelSection
    .extend({
      // Required to evaluate; not to compare two finished runs (--compare).
      path: z
        .string()
        .min(1)
        .nullable()
        .default(null)
        .describe(
          "Hugging Face model folder: config.json, safetensors, tokenizer (required to evaluate)",
        ),
      ...servedAdapterField,
    })
    .prefault({}),
  data: z
    .strictObject({
      val_files: z
        .array(z.string().min(1))
        .min(1)
        .default(["data/nq_hotpotqa/test.parquet"])
        .describe("test parquet files (searchr1 preprocess output)"),
      val_batch_size: positiveInt().default(256).describe("questions in flight at once"),
      max_samples: positiveInt()
        .nullable()
        .default(null)
        .describe("first questions of each data source; null = all"),
      limit: positiveInt().nullable().default(null).describe("first questions overall; null = all"),
      sources: z
        .array(z.string().min(1))
        .nullable()
        .default(null)
        .describe("data sources to evaluate (e.g. nq,hotpotqa); null = all in the files"),
      ...lengthFields,
    })
    .prefault({}),
  rollout: z
    .strictObject({
      ...generationFields,
      ...decodingFields,
    })
    .prefault({}),
  reward: z
    .strictObject({
      search_r1_extract: z
        .boolean()
        .default(false)
        .describe("extract the answer from prompt + response as the original (≥ 2 matches)"),
    })
    .prefault({}),
  retriever: retrieverSection.prefault({}),
  gpus: positiveInt()
    .default(1)
    .describe("GPUs for the native engine: 1 in this build (more is refused)"),
  output_dir: z
    .string()
    .min(1)
    .default("eval")
    .describe("report.json, report.md and trajectories.jsonl; a re-run resumes there"),
  compare: z
    .array(z.string().min(1))
    .nullable()
    .default(null)
    .describe("two finished eval output folders to compare instead of evaluating"),
});

export type EvalConfig = z.infer<typeof evalSchema>;

export const evalSpec: CommandConfigSpec<typeof evalSchema> = {
  command: "eval",
  schema: evalSchema,
  compat: modelCompat,
  // A Search-R1 evaluation script is its training script with +trainer.val_only=true.
  verl: { trainingSchema: trainSchema },
  env: agentEnv,
};
