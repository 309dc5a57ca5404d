import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";

export const convertCkptSchema = z.strictObject({
  from: z.enum(["megatron", "fsdp", "searchr1"]).describe("checkpoint kind to convert"),
  input: z.string().min(1).describe("checkpoint folder"),
  out: z.string().min(1).describe("Hugging Face model folder to write"),
  base_model: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe("HF folder for config and tokenizer"),
  dtype: z
    .enum(["bf16", "fp16", "fp32"])
    .default("bf16")
    .describe("dtype of the written safetensors"),
});

export const convertCkptSpec: CommandConfigSpec<typeof convertCkptSchema> = {
  command: "convert-ckpt",
  schema: convertCkptSchema,
  env: {},
};
