import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import { listenFields, maxBodyField } from "./server-fields.js";
import { threadsField } from "./shared.js";

export const serveEngineSchema = z.strictObject({
  model: z
    .string()
    .min(1)
    .describe("Hugging Face model folder: config.json, safetensors, tokenizer.json"),
  ...listenFields(30000),
  device: z
    .enum(["auto", "cpu", "cuda"])
    .default("auto")
    .describe("where the model runs; auto = a GPU when there is one"),
  threads: threadsField("CPU threads of the engine"),
  context_length: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe("longest prompt + output in tokens; null = the model's max_position_embeddings"),
  kv_cache_mb: z
    .number()
    .positive()
    .nullable()
    .default(null)
    .describe("KV cache memory in MiB; null = a quarter of RAM (CPU), 80% of free GPU memory"),
  gpu_memory_utilization: z
    .number()
    .gt(0)
    .max(1)
    .nullable()
    .default(null)
    .describe(
      "on a GPU: the fraction of its memory the engine may hold, weights and KV cache together (vLLM's meaning); null = the weights, then 80% of the free memory; ignored on the CPU and when kv_cache_mb is set",
    ),
  max_running: z
    .number()
    .int()
    .positive()
    .default(256)
    .describe("most sequences decoded in one step"),
  chunk_tokens: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe(
      "most prompt tokens prefilled in one step; null = 512 on the CPU, 8192 on a GPU (vLLM's max_num_batched_tokens, which Search-R1 set to 8192)",
    ),
  enforce_eager: z
    .boolean()
    .default(false)
    .describe(
      "on a GPU, run every decode step op by op instead of replaying CUDA graphs (vLLM's enforce_eager); no effect on the CPU",
    ),
  skip_tokenizer_init: z
    .boolean()
    .default(false)
    .describe("serve token ids only, without tokenizer.json: text is empty, stop strings refused"),
  max_body_mb: maxBodyField(64),
  served_model_name: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "the model's name in the OpenAI API (/v1/models, the requests' model); null = --model as given (vLLM's default)",
    ),
  lora: z
    .array(z.string().min(1))
    .default([])
    .describe(
      'LoRA adapters (PEFT folders) loaded at start, each NAME=PATH, PATH alone (named PATH), or SGLang\'s JSON {"lora_name", "lora_path"}; served unmerged, chosen by /generate\'s lora_path or the OpenAI model',
    ),
  api_key: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "require Authorization: Bearer <key> on every route but /health (vLLM's --api-key); null = no authentication",
    ),
});

export type ServeEngineConfig = z.infer<typeof serveEngineSchema>;

export const serveEngineSpec: CommandConfigSpec<typeof serveEngineSchema> = {
  command: "serve-engine",
  schema: serveEngineSchema,
  env: { SEARCHR1_ENGINE_PORT: "port", SEARCHR1_API_KEY: "api_key" },
};
