import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import { loraRankField, threadsField } from "./shared.js";

export const quickstartSchema = z.strictObject({
  dir: z
    .string()
    .min(1)
    .default("quickstart")
    .describe("where the world, data, models, runs and reports go"),
  algorithm: z.enum(["grpo", "ppo"]).default("grpo").describe("the RL algorithm of the train step"),
  seed: z.number().int().default(1).describe("the world's seed (and the run's)"),
  lora_rank: loraRankField(
    "train LoRA adapters of this rank on every linear layer instead of all weights (0 = full fine-tuning), at 10x the recipe's learning rate (with ppo the critic is fully trained)",
  ),
  threads: threadsField("CPU threads for the trainer and the engine"),
  overwrite: z.boolean().default(false).describe("replace an existing --dir"),
  train_steps: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe(
      "RL steps; null = templates/configs/quickstart.yaml's (fewer only to try the pipeline)",
    ),
});

export type QuickstartConfig = z.infer<typeof quickstartSchema>;

export const quickstartSpec: CommandConfigSpec<typeof quickstartSchema> = {
  command: "quickstart",
  schema: quickstartSchema,
  env: {},
};
