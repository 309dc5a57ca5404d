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
import type { TopLogprob } from "../protocol.js";
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

/**
 * Output tokens with their log-probs and, per token, its most likely tokens as the engine
 * ranked them (`[token_id, logprob]`, most likely first; empty lists when none were asked).
 */
export interface TokenLogprobs {
  ids: readonly number[];
  logprobs: readonly number[];
  tops: readonly (readonly TopLogprob[])[];
}

/** The texts of the tokens and of each token's most likely tokens, in one pass. */
async function textsOf(t: TokenLogprobs, texts: TokenTexts) {
  const all = await texts([...t.ids, ...t.tops.flatMap((top) => top.map(([id]) => id))]);
  let at = t.ids.length;
  const tops = t.ids.map((_, i) =>
    (t.tops[i] ?? []).map(([, logprob]) => ({
      token: all[at++] as string,
      logprob: clamp(logprob),
    })),
  );
  return { tokens: all.slice(0, t.ids.length), tops };
}

const bytesOf = (token: string) => [...Buffer.from(token, "utf8")];

/**
 * Chat's `logprobs.content` entries for these tokens: `top_logprobs` lists the most likely
 * tokens, most likely first (OpenAI's definition; vLLM's chat route puts the sampled token
 * first instead, which differs only when it is not the most likely).
 */
export async function chatLogprobs(t: TokenLogprobs, texts: TokenTexts) {
  const { tokens, tops } = await textsOf(t, texts);
  return tokens.map((token, i) => ({
    token,
    logprob: clamp(t.logprobs[i] as number),
    bytes: bytesOf(token),
    top_logprobs: (tops[i] ?? []).map((top) => ({ ...top, bytes: bytesOf(top.token) })),
  }));
}

/**
 * The completions route's `logprobs` for these tokens; `offset` is where their text starts.
 * Each `top_logprobs` dict holds the sampled token, then the `logprobs` N most likely tokens
 * (N + 1 entries when the sampled one is not among them), as vLLM's completion route fills
 * it; a text two tokens share keeps its first entry.
 */
export async function completionLogprobs(t: TokenLogprobs, texts: TokenTexts, offset: number) {
  const { tokens, tops } = await textsOf(t, texts);
  const text_offset: number[] = [];
  let at = offset;
  for (const token of tokens) {
    text_offset.push(at);
    at += token.length;
  }
  const values = tokens.map((_, i) => clamp(t.logprobs[i] as number));
  return {
    text_offset,
    token_logprobs: values,
    tokens,
    top_logprobs: tokens.map((token, i) => {
      const dict: Record<string, number> = { [token]: values[i] as number };
      for (const top of tops[i] ?? []) if (!(top.token in dict)) dict[top.token] = top.logprob;
      return dict;
    }),
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
