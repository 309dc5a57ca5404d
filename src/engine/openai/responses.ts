/**
 * The answer objects of the OpenAI routes, field for field as openai-python's types and
 * vLLM's protocol define them (openai `types/completion.py`, `types/chat/chat_completion.py`,
 * `chat_completion_chunk.py`; vllm/entrypoints/openai/completion/protocol.py and
 * chat_completion/protocol.py): `finish_reason` "stop", "length", "tool_calls" or vLLM's
 * "abort"; vLLM's `stop_reason` (the stop string or stop token id, null for EOS);
 * `usage` with `prompt_tokens_details.cached_tokens` (prompt tokens served from the prefix
 * cache). Log-probs below -9999 are written as -9999, as vLLM writes them (JSON has no
 * -Infinity).
 */
import { randomUUID } from "node:crypto";
import type { HermesToolCall } from "../../text/hermes-tool-calls.js";
import type { GenerateOutput } from "../sequence.js";

/** The text of each token, for log-prob entries: decodes with special tokens kept. */
export type TokenTexts = (ids: readonly number[]) => Promise<string[]>;

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

/** `cmpl-<hex>` / `chatcmpl-<hex>` (vLLM's request ids), `call_<hex>` for tool calls. */
export function openAIId(prefix: string): string {
  return `${prefix}-${randomUUID().replaceAll("-", "")}`;
}

function clamp(logprob: number): number {
  return Math.max(logprob, -9999);
}

/**
 * Usage over a request: each prompt counted once, every sample's output tokens; the cached
 * tokens of each prompt's first sample.
 */
export function usageOf(prompts: number[][], outputs: GenerateOutput[], n: number): Usage {
  const completion = outputs.reduce((sum, o) => sum + o.meta_info.completion_tokens, 0);
  const prompt = prompts.reduce((sum, p) => sum + p.length, 0);
  let cached = 0;
  for (let i = 0; i < outputs.length; i += n) cached += outputs[i]?.meta_info.cached_tokens ?? 0;
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: cached },
  };
}

/**
 * OpenAI's finish_reason and vLLM's stop_reason: EOS is a plain "stop" (stop_reason null);
 * a stop string or a stop_token_ids token is named.
 */
export function finishOf(
  output: GenerateOutput,
  eosIds: readonly number[],
  stopTokenIds: readonly number[],
): { finish_reason: string; stop_reason: string | number | null } {
  const reason = output.meta_info.finish_reason;
  if (reason.type !== "stop") return { finish_reason: reason.type, stop_reason: null };
  const matched = reason.matched;
  const isEos =
    typeof matched === "number" && eosIds.includes(matched) && !stopTokenIds.includes(matched);
  return { finish_reason: "stop", stop_reason: isEos ? null : matched };
}

/** Chat's `logprobs.content` entries for these tokens (top_logprobs: none asked for). */
export async function chatLogprobs(
  ids: readonly number[],
  logprobs: readonly number[],
  texts: TokenTexts,
) {
  const tokens = await texts(ids);
  return tokens.map((token, i) => ({
    token,
    logprob: clamp(logprobs[i] as number),
    bytes: [...Buffer.from(token, "utf8")],
    top_logprobs: [],
  }));
}

/**
 * The completions route's `logprobs` for these tokens (`logprobs` 0: the sampled token is
 * its own top entry, as vLLM lists it); `offset` is where their text starts.
 */
export async function completionLogprobs(
  ids: readonly number[],
  logprobs: readonly number[],
  texts: TokenTexts,
  offset: number,
) {
  const tokens = await texts(ids);
  const text_offset: number[] = [];
  let at = offset;
  for (const token of tokens) {
    text_offset.push(at);
    at += token.length;
  }
  const values = tokens.map((_, i) => clamp(logprobs[i] as number));
  return {
    text_offset,
    token_logprobs: values,
    tokens,
    top_logprobs: tokens.map((token, i) => ({ [token]: values[i] as number })),
  };
}

/** Calls as OpenAI's `tool_calls` (arguments as JSON text, as vLLM's Hermes parser writes). */
export function toolCallsOf(calls: readonly HermesToolCall[]) {
  return calls.map((call) => ({
    id: openAIId("call").replace("call-", "call_"),
    type: "function" as const,
    function: { name: call.name, arguments: JSON.stringify(call.arguments) },
  }));
}
