import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import { dtypeEnum } from "./dtype.js";

export const convertCkptSchema = z.strictObject({
  kind: z
    .enum(["megatron-to-hf", "fsdp-to-hf", "native-to-hf", "peft-to-hf"])
    .describe(
      "what to convert: a Megatron-LM, a verl FSDP or a searchr1 native checkpoint, or a PEFT LoRA adapter to merge into --hf-base",
    ),
  input: z
    .string()
    .min(1)
    .describe("checkpoint folder (its root, one iteration/step, or the rank files' folder)"),
  out: z.string().min(1).describe("Hugging Face model folder to write"),
  hf_base: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "HF folder whose config.json and tokenizer files go with the weights " +
        "(required for megatron-to-hf; default <input>/huggingface for fsdp-to-hf, the input for native-to-hf; for peft-to-hf the model the adapter is merged into, default the adapter's base_model_name_or_path when it is a local folder)",
    ),
  dtype: dtypeEnum(["keep", "bf16", "fp16", "fp32"])
    .default("keep")
    .describe("dtype of the written floating-point tensors (keep = as in the checkpoint)"),
  lora: z
    .enum(["merge", "separate"])
    .default("merge")
    .describe(
      "fsdp-to-hf of a LoRA run: merge = the adapters merged into the base weights; separate = as verl's model_merger, the base weights unmerged and the adapter as a PEFT folder in <out>/lora_adapter",
    ),
  max_shard_size: z
    .string()
    .min(1)
    .default("5GB")
    .describe(
      "largest safetensors shard, as transformers reads it (5GB = 5·10⁹ bytes, 5GiB = 5·2³⁰)",
    ),
  keep_config: z
    .boolean()
    .default(false)
    .describe(
      "copy config.json unchanged; by default its torch_dtype/dtype is set to the dtype the tensors are written in",
    ),
  verify: z
    .boolean()
    .default(false)
    .describe("print every tensor against what config.json implies (name, shape, dtype written)"),
  overwrite: z.boolean().default(false).describe("replace an existing --out folder"),
  quiet: z.boolean().default(false).describe("no progress output"),
});

export const convertCkptSpec: CommandConfigSpec<typeof convertCkptSchema> = {
  command: "convert-ckpt",
  schema: convertCkptSchema,
  env: {},
};
