import { z } from "zod";
import { dtypeEnum } from "./dtype.js";

/**
 * Config sections shared by `train` and `eval`. Key names follow Search-R1's scripts
 * (data.max_obs_length, actor.kl_loss_coef, ...) so their overrides read the same here.
 * Defaults are Search-R1's published values: its paper scripts (Search-R1
 * scripts/nq_hotpotqa/v0.2/train_ppo.sh, train_grpo.sh) over the defaults in its
 * verl/trainer/config/ppo_trainer.yaml.
 */

const positiveInt = () => z.number().int().positive();

/** A CPU thread count: `what` it counts, null for all cores. */
export const threadsField = (what: string) =>
  positiveInt().nullable().default(null).describe(`${what}; null = all cores`);

const NATIVE_DTYPES = "the native trainer and engine compute in bf16 on a GPU and fp32 on the CPU";

export const modelSection = z.strictObject({
  path: z
    .string()
    .min(1)
    .describe("Hugging Face model folder: config.json, safetensors, tokenizer"),
  tokenizer_path: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe("tokenizer folder when it is not the model folder"),
  dtype: dtypeEnum(["bf16", "fp16", "fp32"])
    .default("bf16")
    .describe(`no effect: ${NATIVE_DTYPES} (verl's model dtype)`),
});

/** A LoRA rank (`model.lora_rank`, `critic.lora_rank`, quickstart's): 0 = no adapters. */
export const loraRankField = (description: string) =>
  z.number().int().min(0).default(0).describe(description);

/** `model.lora_adapter_path` (verl's key): a PEFT adapter folder, or null. */
export const adapterPathField = (description: string) =>
  z.string().min(1).nullable().default(null).describe(description);

/**
 * eval's and ask's `model.lora_adapter_path` (train's key, verl's name): the adapter the agent
 * runs with, served over model.path by the engine (src/agent/session.ts, useAdapter).
 */
export const servedAdapterField = {
  lora_adapter_path: adapterPathField(
    "a PEFT adapter folder (adapter_config.json, adapter_model.safetensors: what train saves, or PEFT's save_pretrained) served unmerged over model.path: the native engine started here loads it, or the SGLang-protocol server at rollout.engine_url (/load_lora_adapter; the path as that server sees it); null = the model alone",
  ),
};

/** The compatibility-only keys of the commands with a model section (CommandConfigSpec.compat). */
export const modelCompat = { "model.dtype": NATIVE_DTYPES };

/** Prompt and turn budgets, in tokens (Search-R1's data.* keys and meanings). */
export const lengthFields = {
  max_start_length: positiveInt()
    .default(2048)
    .describe("initial prompt budget; longer prompts are left-truncated"),
  max_prompt_length: positiveInt()
    .default(4096)
    .describe("total context budget of a trajectory (prompt + all turns)"),
  max_response_length: positiveInt()
    .default(500)
    .describe(
      "tokens generated per turn (format search_r1); with rollout.multi_turn.format hermes the whole response's, tool turns included (verl's meaning)",
    ),
  max_obs_length: positiveInt().default(500).describe("tokens of one retrieval observation"),
};

export const retrieverSection = z.strictObject({
  url: z
    .string()
    .url()
    .default("http://127.0.0.1:8000/retrieve")
    .describe("Search-R1-compatible POST /retrieve endpoint"),
  topk: positiveInt().default(3).describe("documents per search"),
  timeout_s: z.number().positive().default(30).describe("per-request timeout"),
  max_retries: z.number().int().min(0).default(10).describe("retries on 5xx, timeouts, resets"),
});

/**
 * How the agent calls search (verl's actor_rollout_ref.rollout.multi_turn.* keys): Search-R1's
 * tags, or tool calls in the Hermes format of Qwen2.5's chat template, as verl's ToolAgentLoop
 * runs them (verl verl/experimental/agent_loop/tool_agent_loop.py; defaults from verl
 * verl/trainer/config/rollout/rollout.yaml).
 */
export const multiTurnSection = z
  .strictObject({
    format: z
      .enum(["search_r1", "hermes"])
      .default("search_r1")
      .describe(
        "search_r1: <search>/<information> tags (Search-R1); hermes: <tool_call> JSON and <tool_response> turns through the chat template (verl's tool agent)",
      ),
    tool_config_path: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        "hermes: verl tool_config YAML whose search tool's schema the chat template shows the model; null = the built-in search tool",
      ),
    max_assistant_turns: positiveInt()
      .nullable()
      .default(null)
      .describe(
        "hermes: model turns per trajectory at most; null = until the response budget runs out",
      ),
    max_parallel_calls: positiveInt()
      .default(1)
      .describe("hermes: tool calls of one turn that are run (the first ones)"),
    max_tool_response_length: positiveInt()
      .default(256)
      .describe("hermes: characters of one tool response kept"),
    tool_response_truncate_side: z
      .enum(["left", "middle", "right"])
      .default("middle")
      .describe(
        "hermes: which part of a long tool response is kept (left: its start, right: its end, middle: both ends)",
      ),
  })
  .prefault({});

/** How trajectories are generated; `train` adds its sampling-group size on top. */
export const generationFields = {
  engine: z
    .enum(["native", "sglang", "vllm"])
    .default("native")
    .describe("inference engine: the native one, or an SGLang / vLLM server"),
  engine_url: z
    .string()
    .url()
    .nullable()
    .default(null)
    .describe("use an already running engine at this URL instead of launching one"),
  engine_device: z
    .enum(["auto", "cpu", "cuda"])
    .default("auto")
    .describe(
      "device of the native engine started for the run (not used with engine_url); train --gpus N starts N replicas, replica r on device r",
    ),
  engine_threads: threadsField(
    "CPU threads of the native engine started for the run (train --gpus N splits them among its replicas)",
  ),
  max_turns: positiveInt()
    .default(4)
    .describe("search/answer actions per trajectory (format search_r1)"),
  temperature: z.number().min(0).default(1).describe("sampling temperature (0 = greedy)"),
  top_p: z.number().gt(0).max(1).default(1).describe("nucleus sampling mass"),
  top_k: z.number().int().min(-1).default(-1).describe("-1 = no top-k cut"),
  compat: z
    .enum(["none", "search-r1-retokenize"])
    .default("none")
    .describe(
      "search-r1-retokenize: decode, cut and re-encode each turn as the original did (drops EOS and log-probs)",
    ),
  gpu_memory_utilization: z
    .number()
    .gt(0)
    .max(1)
    .default(0.6)
    .describe(
      "the native engine's share of its GPU's memory, weights and KV cache together (vLLM's meaning; the trainer shares the GPU); no effect on the CPU or with engine_url",
    ),
  enforce_eager: z
    .boolean()
    .default(false)
    .describe(
      "verl's enforce_eager: the native engine started for the run runs every decode step op by op instead of replaying CUDA graphs; no effect on the CPU or with engine_url",
    ),
  tensor_parallel_size: positiveInt()
    .default(1)
    .describe("GPUs per engine replica: 1 (the native engine has no tensor parallelism)"),
  multi_turn: multiTurnSection,
};

/** Decoding of eval and ask: greedy unless asked to sample (then seeded). */
export const decodingFields = {
  // Search-R1 meant validation to be greedy; that it samples is a bug: RayPPOTrainer._validate
  // (verl/trainer/ppo/ray_trainer.py) asks for do_sample=False in meta_info, but
  // LLMGenerationManager.run_llm_loop (search_r1/llm_agent/generation.py) rebuilds the batch
  // with DataProto.from_dict each turn, dropping it, so the worker samples.
  do_sample: z
    .boolean()
    .default(false)
    .describe("sample with temperature/top_p/top_k as Search-R1's validation does; false = greedy"),
  seed: z.number().int().default(1).describe("sampling seed (question i uses seed + i)"),
};

export const loggingFields = {
  logger: z
    .array(z.enum(["console", "jsonl", "plot", "wandb", "tensorboard"]))
    .default(["console", "jsonl", "plot"])
    .describe(
      "where metrics go: console (a line per step), jsonl (metrics.jsonl, which a resumed run's plots continue), plot (plots/*.svg and *.png), wandb (a W&B run: WANDB_API_KEY, WANDB_BASE_URL), tensorboard (event files in tensorboard/)",
    ),
  log_every: positiveInt()
    .default(1)
    .describe("steps between console lines (the last step and validations always print)"),
};

/** Env vars that `train` and `eval` both read: where the model, retriever and engine are. */
export const agentEnv = {
  SEARCHR1_MODEL: "model.path",
  SEARCHR1_RETRIEVER_URL: "retriever.url",
  SEARCHR1_ENGINE_URL: "rollout.engine_url",
};

export { positiveInt };
