import type { Command } from "commander";
import { defineCommand } from "../src/command/define.js";
import { serveEngineSpec } from "../src/config/schemas/serve-engine.js";
import { serveEngine } from "../src/engine/server-main.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: serveEngineSpec,
    description:
      "serve SGLang's POST /generate (token ids in, tokens, log-probs and text out) and OpenAI's /v1/completions and /v1/chat/completions with the native engine",
    flags: [
      { flags: "--model <dir>", key: "model" },
      { flags: "--host <host>", key: "host" },
      { flags: "--port <port>", key: "port" },
      { flags: "--device <device>", key: "device" },
      { flags: "--threads <n>", key: "threads" },
      { flags: "--context-length <n>", key: "context_length" },
      { flags: "--kv-cache-mb <n>", key: "kv_cache_mb" },
      { flags: "--gpu-memory-utilization <f>", key: "gpu_memory_utilization" },
      { flags: "--max-running <n>", key: "max_running" },
      { flags: "--chunk-tokens <n>", key: "chunk_tokens" },
      { flags: "--enforce-eager", key: "enforce_eager" },
      { flags: "--skip-tokenizer-init", key: "skip_tokenizer_init" },
      { flags: "--max-body-mb <n>", key: "max_body_mb" },
      { flags: "--served-model-name <name>", key: "served_model_name" },
      { flags: "--lora <name=path>", key: "lora", repeatable: true },
      {
        flags: "--lora-paths <specs...>",
        key: "lora",
        description: "SGLang's spelling of --lora: several NAME=PATH after one flag",
      },
      { flags: "--api-key <key>", key: "api_key" },
    ],
    examples: [
      "searchr1 serve-engine --model /models/Qwen2.5-3B-Instruct --port 30000",
      "searchr1 serve-engine --model ./qwen --device cpu --threads 8 --kv-cache-mb 4096 --context-length 8192",
      "searchr1 serve-engine --model ./qwen --skip-tokenizer-init --host 0.0.0.0 max_running=64",
      "searchr1 serve-engine --model ./qwen --host 0.0.0.0 --api-key sk-my-secret --served-model-name qwen",
      "searchr1 serve-engine --model models/Qwen2.5-0.5B-Instruct --skip-tokenizer-init --lora search=runs/nq/global_step_100/adapter",
    ],
    run: (config) => serveEngine(config),
  });
}
