/**
 * The stdio protocol of the native `searchr1-engine` (native/src/engine/PROTOCOL.md): one
 * JSON object per line, commands on its stdin, events on its stdout. These types are that
 * document's, field for field; the engine knows nothing of HTTP, text or stop strings.
 */
import type { Grammar } from "./grammar/builder.js";

/** First line on stdout, once the model is loaded. */
export interface ReadyEvent {
  ev: "ready";
  model_path: string;
  vocab_size: number;
  context_length: number;
  block_size: number;
  kv_blocks: number;
  eos_token_ids: number[];
  device: string;
  threads: number;
  max_running: number;
  chunk_tokens: number;
  /** Decode steps replay CUDA graphs (a GPU, without --enforce-eager or --profile). */
  graphs: boolean;
  weight_version: string;
}

/** `[token_id, logprob]`: one of the most likely tokens beside a sampled one. */
export type TopLogprob = [number, number];

/**
 * One `[rid, token_id, logprob]` per sequence that sampled a token in a step; a sequence
 * generated with `top_logprobs` N > 0 adds its N most likely tokens, most likely first.
 */
export interface TokensEvent {
  ev: "tokens";
  out: ([string, number, number] | [string, number, number, TopLogprob[]])[];
}

export type FinishReason = "stop" | "length" | "abort";

/** A sequence ended (after its last `tokens` event). */
export interface DoneEvent {
  ev: "done";
  rid: string;
  reason: FinishReason;
  /** The EOS / stop_token_ids token that ended it (reason `stop`), else null. */
  matched: number | null;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  weight_version: string;
}

/** A command that could not be carried out for one request (`rid` null: a bad line). */
export interface ErrorEvent {
  ev: "error";
  rid: string | null;
  message: string;
}

/** The answer to a control command, carrying its `id`. */
export interface ReplyEvent {
  ev: "reply";
  id: number;
  ok: boolean;
  message?: string;
  [key: string]: unknown;
}

export type EngineEvent = ReadyEvent | TokensEvent | DoneEvent | ErrorEvent | ReplyEvent;

/** `generate`: every sampling key is required (the TypeScript side fills the defaults). */
export interface GenerateCommand {
  op: "generate";
  rid: string;
  input_ids: number[];
  max_new_tokens: number;
  /** 0 = greedy. */
  temperature: number;
  top_p: number;
  /** -1 = off. */
  top_k: number;
  min_p: number;
  /** null: the engine draws one. */
  seed: number | null;
  stop_token_ids: number[];
  ignore_eos: boolean;
  /** The most likely tokens to report beside each sampled one (0, the default: none). */
  top_logprobs?: number;
  /** A loaded LoRA adapter's name (`load_lora`); absent or null: the base model. */
  lora?: string | null;
  /** The grammar the output must follow (src/engine/grammar/); absent: none. */
  grammar?: Grammar;
  /** Penalties (PROTOCOL.md); absent: off (1, 0, 0, 0, none). */
  repetition_penalty?: number;
  frequency_penalty?: number;
  presence_penalty?: number;
  min_new_tokens?: number;
  /** [token_id, bias] pairs. */
  logit_bias?: [number, number][];
}

/** The `stats` reply's figures. */
export interface EngineStats {
  running: number;
  queued: number;
  kv_blocks_total: number;
  kv_blocks_used: number;
  kv_blocks_cached: number;
  prefix_hit_tokens: number;
  prompt_tokens: number;
  generated_tokens: number;
  decode_steps: number;
  kv_full_steps: number;
  preemptions: number;
  /** The KV cache's memory is given back (between release_memory and resume_memory). */
  kv_released: boolean;
  weight_version: string;
}

/** Control commands: answered by a `reply` with the same id (shutdown: by exiting). */
export type ControlCommand =
  | { op: "token_bytes"; tokens: string[] }
  | { op: "update_weights"; model_path: string; abort_all: boolean }
  | { op: "flush_cache" }
  | { op: "release_memory" }
  | { op: "resume_memory" }
  | { op: "stats" }
  | { op: "load_lora"; name: string; path: string }
  | { op: "unload_lora"; name: string };

/** The reply to `load_lora` and `unload_lora`: every adapter loaded after it, name → folder. */
export interface LoraReply extends ReplyEvent {
  adapters: Record<string, string>;
}

/** Parses one stdout line into an event; throws with the reason when it is not one. */
export function parseEvent(line: string): EngineEvent {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch (err) {
    throw new Error(`not JSON (${(err as Error).message})`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new Error("not a JSON object");
  }
  const ev = (value as { ev?: unknown }).ev;
  if (ev !== "ready" && ev !== "tokens" && ev !== "done" && ev !== "error" && ev !== "reply") {
    throw new Error(`unknown event ${JSON.stringify(ev)}`);
  }
  return value as EngineEvent;
}
