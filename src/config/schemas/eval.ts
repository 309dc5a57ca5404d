import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import {
  agentEnv,
  generationFields,
  lengthFields,
  modelSection,
  positiveInt,
  retrieverSection,
} from "./shared.js";

export const evalSchema = z.strictObject({
  model: modelSection,
  data: z
    .strictObject({
      val_files: z
        .array(z.string().min(1))
        .min(1)
        .default(["data/nq_hotpotqa/test.parquet"])
        .describe("test parquet files (searchr1 preprocess output)"),
      val_batch_size: positiveInt().default(256).describe("prompts per batch"),
      max_samples: positiveInt()
        .nullable()
        .default(null)
        .describe("cap per data source; null = all"),
      ...lengthFields,
    })
    .prefault({}),
  rollout: z
    .strictObject({
      ...generationFields,
      // Search-R1 meant validation to be greedy (its sampling there is a bug, §12.7).
      temperature: generationFields.temperature.default(0).describe("0 = greedy decoding"),
    })
    .prefault({}),
  retriever: retrieverSection.prefault({}),
  gpus: positiveInt().default(1).describe("GPUs to use"),
  output_dir: z.string().min(1).default("eval").describe("report.json and report.md go here"),
});

export type EvalConfig = z.infer<typeof evalSchema>;

export const evalSpec: CommandConfigSpec<typeof evalSchema> = {
  command: "eval",
  schema: evalSchema,
  env: agentEnv,
};
