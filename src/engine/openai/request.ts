/**
 * The bodies of `POST /v1/completions` and `POST /v1/chat/completions`, checked field by
 * field and turned into the same sequences `/generate` runs (../generate-request.ts): the
 * sampling keys are translated to SGLang's and checked by the same code, so both protocols
 * sample alike (`seed` s gives sample i the seed s + i, as /generate does).
 *
 * Field names and defaults are OpenAI's, with vLLM's extensions where they are
 * SGLang settings this engine has (`top_k`, `min_p`, `ignore_eos`, `stop_token_ids`,
 * `skip_special_tokens`, `include_stop_str_in_output`, `return_token_ids`, chat's
 * `chat_template_kwargs` and `add_generation_prompt`): vLLM's CompletionRequest and
 * ChatCompletionRequest (vllm/entrypoints/openai/completion/protocol.py,
 * chat_completion/protocol.py). Completions default to 16 tokens (`max_tokens` 16, as
 * OpenAI and vLLM), chat to the room left in the context. Keys OpenAI defines that this
 * engine does not implement (echo, suffix; completions' response formats) are accepted at
 * their neutral values and refused otherwise; unknown keys are
 * refused, naming the nearest known one, so that a misspelt key does not pass silently.
 *
 * Chat's `response_format` (`json_object`, `json_schema`) and `tool_choice` "required" or a
 * named function constrain the output with a grammar (./grammar/): the engine masks, at
 * every token, the tokens that would leave it.
 */
import { editDistance } from "../../config/suggest.js";
import { HttpError, typeOf } from "../../runtime/http-server.js";
import type { ChatMessage, ChatTemplate } from "../../text/chat-template.js";
import type { TextTokenizer } from "../../text/tokenizer.js";
import {
  addSamples,
  conflicting,
  type ModelLimits,
  readIds,
  readSampling,
  requireGrammar,
  type SequenceSpec,
} from "../generate-request.js";
import type { Grammar } from "../grammar/builder.js";
import type { Whitespace } from "../grammar/json-schema.js";
import { type ConstraintKind, requestedGrammar } from "../grammar/requested.js";
import { type FunctionTool, toolCallGrammar } from "../grammar/tool-calls.js";

/** The chat side of the model folder: its template, or why there is none. */
export interface ChatSide {
  template: ChatTemplate | null;
  /** Named special tokens (`bos_token`, ...) the template sees. */
  specialTokens: Record<string, string>;
  /** Why chat cannot be served (no template, a template that does not load). */
  problem: string | null;
}

export interface ParseContext {
  limits: ModelLimits;
  /** null with --skip-tokenizer-init. */
  tokenizer: TextTokenizer | null;
  chat: ChatSide | null;
}

/** The function tools of a chat request and how their calls are read back. */
export interface ToolSetting {
  /** The request's `tools`, as the template renders them. */
  tools: Record<string, unknown>[];
  /** `tool_choice` "auto" (the default with tools): calls are parsed into `tool_calls`. */
  parseCalls: boolean;
  /** `parallel_tool_calls` false: at most one call. */
  maxCalls: number;
  /** `tool_choice` "required" or a named function: the calls' grammar (else null). */
  grammar: Grammar | null;
}

export interface OpenAIRequest {
  /** `model` as sent (null when absent). */
  model: string | null;
  stream: boolean;
  /** `stream_options.include_usage`: a last chunk carries the usage. */
  includeUsage: boolean;
  /** One id list per prompt (chat: one). */
  prompts: number[][];
  /** Input-major: prompt 0's n samples, then prompt 1's; choice i is sequence i. */
  sequences: SequenceSpec[];
  /** Log-probs of the sampled tokens are returned (completions: `logprobs` 0 or more). */
  logprobs: boolean;
  /** How many of the most likely tokens are listed beside each (completions: `logprobs`). */
  topLogprobs: number;
  /** vLLM's `return_token_ids`: each choice carries its `token_ids`. */
  returnTokenIds: boolean;
  /** Chat with `tools` (null otherwise). */
  tools: ToolSetting | null;
}

const bad = (message: string) => new HttpError(400, message);
const quote = (field: string) => `"${field}"`;

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** OpenAI's name for each SGLang sampling key this translation fills. */
const SAMPLING_NAMES: Record<string, string> = {
  temperature: "temperature",
  top_p: "top_p",
  top_k: "top_k",
  min_p: "min_p",
  stop: "stop",
  stop_token_ids: "stop_token_ids",
  ignore_eos: "ignore_eos",
  n: "n",
  seed: "seed",
  skip_special_tokens: "skip_special_tokens",
  no_stop_trim: "include_stop_str_in_output",
  frequency_penalty: "frequency_penalty",
  presence_penalty: "presence_penalty",
  repetition_penalty: "repetition_penalty",
  min_new_tokens: "min_tokens",
  logit_bias: "logit_bias",
};

/** vLLM's structured outputs (both routes): its current object and its earlier keys. */
const GUIDED_KEYS: Record<string, ConstraintKind> = {
  guided_json: "json",
  guided_regex: "regex",
  guided_choice: "choice",
  guided_grammar: "grammar",
};
const STRUCTURED_KINDS: readonly ConstraintKind[] = [
  "json",
  "regex",
  "choice",
  "grammar",
  "json_object",
];

/** Keys both routes read. */
const COMMON_KEYS = [
  "structured_outputs",
  ...Object.keys(GUIDED_KEYS),
  "guided_whitespace_pattern",
  "model",
  "max_tokens",
  "stream",
  "stream_options",
  "return_token_ids",
  "user",
  ...Object.values(SAMPLING_NAMES),
];
const COMPLETION_KEYS = [...COMMON_KEYS, "prompt", "logprobs", "add_special_tokens"];
const CHAT_KEYS = [
  ...COMMON_KEYS,
  "messages",
  "max_completion_tokens",
  "logprobs",
  "top_logprobs",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "chat_template_kwargs",
  "add_generation_prompt",
  "response_format",
];

/** Accepted only at these values (null always): what this engine does without them. */
const NEUTRAL: Record<string, unknown> = {
  spaces_between_special_tokens: true,
  echo: false,
  suffix: null,
  response_format: { type: "text" },
};

/** Refuses unknown keys (naming the nearest known one) and non-neutral neutral keys. */
function checkKeys(body: Record<string, unknown>, known: readonly string[], route: string) {
  for (const [key, value] of Object.entries(body)) {
    if (known.includes(key) || value === null) continue;
    if (key in NEUTRAL) {
      if (JSON.stringify(value) === JSON.stringify(NEUTRAL[key])) continue;
      throw bad(
        `${quote(key)} = ${JSON.stringify(value)} is not supported by this engine (only ` +
          `${JSON.stringify(NEUTRAL[key])} or null)`,
      );
    }
    if (key === "best_of") {
      if (value === 1 || value === body.n) continue;
      throw bad(`"best_of" = ${JSON.stringify(value)} is not supported (only null or n)`);
    }
    const all = [...known, ...Object.keys(NEUTRAL)];
    const meant = all.find((k) => editDistance(key, k) <= 2);
    throw bad(
      `${quote(key)} is not a known key of ${route}${meant ? ` (did you mean "${meant}"?)` : ""}; ` +
        `known keys: ${all.join(", ")}`,
    );
  }
}

function boolean(body: Record<string, unknown>, key: string, fallback: boolean): boolean {
  const v = body[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== "boolean") throw bad(`${quote(key)} must be true or false, got ${typeOf(v)}`);
  return v;
}

function integer(
  body: Record<string, unknown>,
  key: string,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number | null {
  const v = body[key];
  if (v === undefined || v === null) return null;
  if (!Number.isSafeInteger(v) || (v as number) < min || (v as number) > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `≥ ${min}` : `in [${min}, ${max}]`;
    throw bad(`${quote(key)} must be an integer ${range}, got ${typeOf(v)}`);
  }
  return v as number;
}

/** Most top log-probs per token on these routes: vLLM's --max-logprobs default, OpenAI's 20. */
export const MAX_LOGPROBS = 20;

/** `stream` and `stream_options` (only with a stream, as vLLM checks). */
function readStream(body: Record<string, unknown>): { stream: boolean; includeUsage: boolean } {
  const stream = boolean(body, "stream", false);
  const options = body.stream_options;
  if (options === undefined || options === null) return { stream, includeUsage: false };
  if (!stream) throw bad(`"stream_options" is only for "stream": true`);
  if (!isObject(options)) {
    throw bad(
      `"stream_options" must be an object like {"include_usage": true}, got ${typeOf(options)}`,
    );
  }
  for (const [key, value] of Object.entries(options)) {
    if (key === "include_usage" || value === null) continue;
    if (key === "continuous_usage_stats" && value === false) continue;
    throw bad(`"stream_options.${key}" is not supported (known: include_usage)`);
  }
  const usage = options.include_usage;
  if (usage !== undefined && usage !== null && typeof usage !== "boolean") {
    throw bad(`"stream_options.include_usage" must be true or false, got ${typeOf(usage)}`);
  }
  return { stream, includeUsage: usage === true };
}

/**
 * The SGLang sampling keys of an OpenAI body, checked by /generate's own reader for a
 * prompt of `promptTokens`; `maxTokens` is the key the output budget came from (its
 * absence is `fallback`: null = up to the context length).
 */
function sampling(
  body: Record<string, unknown>,
  maxTokensKey: string,
  fallback: number | null,
  promptTokens: number,
  limits: ModelLimits,
) {
  const raw: Record<string, unknown> = {};
  for (const [sglang, openai] of Object.entries(SAMPLING_NAMES)) {
    const v = body[openai];
    if (v !== undefined && v !== null) raw[sglang] = v;
  }
  // vLLM: top_k 0 or -1 both switch it off; SGLang spells off -1.
  if (raw.top_k === 0) raw.top_k = -1;
  raw.max_new_tokens = body[maxTokensKey] === undefined ? fallback : body[maxTokensKey];
  const names: Record<string, string> = { ...SAMPLING_NAMES, max_new_tokens: maxTokensKey };
  return readSampling(raw, "", promptTokens, limits, (key) => names[key] ?? key);
}

/** Checks `model` and the request-wide settings shared by both routes. */
function common(body: unknown, known: readonly string[], route: string) {
  if (!isObject(body)) {
    throw bad(`request body must be a JSON object, got ${typeOf(body)}`);
  }
  checkKeys(body, known, route);
  const model = body.model;
  if (model !== undefined && model !== null && typeof model !== "string") {
    throw bad(`"model" must be a string, got ${typeOf(model)}`);
  }
  const user = body.user;
  if (user !== undefined && user !== null && typeof user !== "string") {
    throw bad(`"user" must be a string, got ${typeOf(user)}`);
  }
  return {
    body,
    model: (model as string | undefined) ?? null,
    ...readStream(body),
    returnTokenIds: boolean(body, "return_token_ids", false),
  };
}

/** Builds the sequences of `prompts` (each checked against the context), n samples each. */
function sequencesOf(
  body: Record<string, unknown>,
  prompts: number[][],
  maxTokensKey: string,
  fallback: number | null,
  limits: ModelLimits,
  logprobs: boolean,
  topLogprobs: number,
): SequenceSpec[] {
  const sequences: SequenceSpec[] = [];
  prompts.forEach((ids, input) => {
    const { n, params } = sampling(body, maxTokensKey, fallback, ids.length, limits);
    addSamples(sequences, { input, ids, n, params, returnLogprob: logprobs, topLogprobs }, (key) =>
      quote(key),
    );
  });
  return sequences;
}

/** `POST /v1/completions`: prompts as text, a list of texts, token ids, or lists of ids. */
export async function parseCompletionRequest(
  raw: unknown,
  ctx: ParseContext,
): Promise<OpenAIRequest> {
  const c = common(raw, COMPLETION_KEYS, "/v1/completions");
  const body = c.body;
  const prompt = body.prompt;
  const texts: string[] = [];
  let prompts: number[][];
  const fail = () =>
    bad(
      `"prompt" must be a string, a list of strings, a list of token ids or a list of such ` +
        `lists, got ${typeOf(prompt)}`,
    );
  if (prompt === undefined || prompt === null) {
    throw bad(`"prompt" is required: a string, a list of strings, or token ids`);
  }
  if (typeof prompt === "string") texts.push(prompt);
  else if (!Array.isArray(prompt) || prompt.length === 0) throw fail();
  else if (prompt.every((p) => typeof p === "string")) texts.push(...(prompt as string[]));
  else if (!prompt.every((p) => Array.isArray(p) || typeof p === "number")) throw fail();
  if (texts.length > 0) {
    if (!ctx.tokenizer) {
      throw bad(
        `"prompt": text prompts need the tokenizer, and this server runs with ` +
          "--skip-tokenizer-init (send token ids)",
      );
    }
    const addSpecialTokens = boolean(body, "add_special_tokens", true);
    const ids = await ctx.tokenizer.encodeBatch(texts, { addSpecialTokens });
    const single = typeof prompt === "string";
    prompts = ids.map((p, i) => readIds(p, single ? "prompt" : `prompt[${i}]`, ctx.limits));
  } else {
    const list = prompt as unknown[];
    prompts = Array.isArray(list[0])
      ? list.map((p, i) => readIds(p, `prompt[${i}]`, ctx.limits))
      : [readIds(list, "prompt", ctx.limits)];
  }
  // OpenAI's `logprobs` here is how many of the most likely tokens to list beside the
  // sampled one (0: the sampled token alone).
  const top = integer(body, "logprobs", 0, MAX_LOGPROBS);
  const sequences = sequencesOf(
    body,
    prompts,
    "max_tokens",
    16,
    ctx.limits,
    top !== null,
    top ?? 0,
  );
  const ws = readWhitespace(body);
  constrain(sequences, ctx, structuredOutputs(body, ws), ws);
  return {
    model: c.model,
    stream: c.stream,
    includeUsage: c.includeUsage,
    prompts,
    sequences,
    logprobs: top !== null,
    topLogprobs: top ?? 0,
    returnTokenIds: c.returnTokenIds,
    tools: null,
  };
}

/** `POST /v1/chat/completions`: messages through the model's chat template. */
export async function parseChatRequest(raw: unknown, ctx: ParseContext): Promise<OpenAIRequest> {
  const c = common(raw, CHAT_KEYS, "/v1/chat/completions");
  const body = c.body;
  const messages = readMessages(body.messages);
  if (body.max_tokens !== undefined && body.max_completion_tokens !== undefined) {
    throw bad(`"max_tokens" and "max_completion_tokens" are the same setting: give one`);
  }
  const tools = readTools(body);
  const variables = body.chat_template_kwargs ?? {};
  if (!isObject(variables)) {
    throw bad(`"chat_template_kwargs" must be an object, got ${typeOf(variables)}`);
  }
  const chat = ctx.chat;
  if (!ctx.tokenizer || !chat) {
    throw bad(
      `"messages": chat needs the tokenizer and its chat template, and this server runs ` +
        "with --skip-tokenizer-init (use /v1/completions with token ids)",
    );
  }
  if (!chat.template) throw bad(`"messages": ${chat.problem ?? "the model has no chat template"}`);
  let text: string;
  try {
    text = chat.template.render(messages, {
      addGenerationPrompt: boolean(body, "add_generation_prompt", true),
      specialTokens: chat.specialTokens,
      variables,
      ...(tools ? { tools: tools.tools } : {}),
    });
  } catch (err) {
    throw bad(`"messages": ${(err as Error).message}`);
  }
  const ids = await ctx.tokenizer.encode(text, { addSpecialTokens: false });
  const prompt = readIds(ids, "messages", ctx.limits);

  const logprobs = boolean(body, "logprobs", false);
  const top = integer(body, "top_logprobs", 0, MAX_LOGPROBS) ?? 0;
  if (top > 0 && !logprobs) {
    throw bad(`"top_logprobs" = ${top} needs "logprobs": true (as OpenAI and vLLM require)`);
  }
  const maxKey = body.max_completion_tokens !== undefined ? "max_completion_tokens" : "max_tokens";
  const sequences = sequencesOf(body, [prompt], maxKey, null, ctx.limits, logprobs, top);
  const ws = readWhitespace(body);
  const format = readResponseFormat(body, ws);
  constrain(
    sequences,
    ctx,
    [
      ...(format ? [{ key: "response_format", grammar: format, json: true }] : []),
      ...(tools?.grammar ? [{ key: "tool_choice", grammar: tools.grammar, json: false }] : []),
      ...structuredOutputs(body, ws),
    ],
    ws,
  );
  return {
    model: c.model,
    stream: c.stream,
    includeUsage: c.includeUsage,
    prompts: [prompt],
    sequences,
    logprobs,
    topLogprobs: top,
    returnTokenIds: c.returnTokenIds,
    tools,
  };
}

const PART_TYPES = "text";

/**
 * `messages`: objects with a `role` and a `content` (a string, null, or a list of
 * `{"type": "text", "text": ...}` parts, joined with "\n" as vLLM joins them). Other fields
 * (`name`, `tool_calls`, `tool_call_id`) reach the template; a tool call's `arguments`,
 * a JSON string in OpenAI's API, reaches it decoded, as vLLM passes it (templates write
 * `arguments | tojson`).
 */
function readMessages(value: unknown): ChatMessage[] {
  if (value === undefined || value === null) {
    throw bad(`"messages" is required: a list like [{"role": "user", "content": "Hi"}]`);
  }
  if (!Array.isArray(value) || value.length === 0) {
    throw bad(`"messages" must be a non-empty list of messages, got ${typeOf(value)}`);
  }
  return value.map((m, i) => {
    const field = `messages[${i}]`;
    if (!isObject(m)) throw bad(`${quote(field)} must be an object, got ${typeOf(m)}`);
    if (typeof m.role !== "string" || m.role === "") {
      throw bad(`${quote(`${field}.role`)} must be a role such as "user", got ${typeOf(m.role)}`);
    }
    const message: ChatMessage = { ...m, role: m.role, content: contentOf(m.content, field) };
    if (m.tool_calls !== undefined && m.tool_calls !== null) {
      message.tool_calls = toolCallsOf(m.tool_calls, `${field}.tool_calls`);
    }
    return message;
  });
}

function contentOf(content: unknown, field: string): string {
  if (content === undefined || content === null) return "";
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) {
    throw bad(
      `${quote(`${field}.content`)} must be a string or a list of text parts, got ${typeOf(content)}`,
    );
  }
  return content
    .map((part, j) => {
      const f = `${field}.content[${j}]`;
      if (!isObject(part) || part.type !== "text" || typeof part.text !== "string") {
        throw bad(
          `${quote(f)} must be {"type": "text", "text": "..."}: this engine reads ` +
            `${PART_TYPES} parts only, got ${isObject(part) ? `type ${JSON.stringify(part.type)}` : typeOf(part)}`,
        );
      }
      return part.text;
    })
    .join("\n");
}

function toolCallsOf(value: unknown, field: string): Record<string, unknown>[] {
  if (!Array.isArray(value)) throw bad(`${quote(field)} must be a list, got ${typeOf(value)}`);
  return value.map((call, j) => {
    const f = `${field}[${j}]`;
    if (!isObject(call) || !isObject(call.function) || typeof call.function.name !== "string") {
      throw bad(`${quote(f)} must be {"type": "function", "function": {"name", "arguments"}}`);
    }
    let args: unknown = call.function.arguments ?? {};
    if (typeof args === "string") {
      try {
        args = JSON.parse(args);
      } catch (err) {
        throw bad(`${quote(`${f}.function.arguments`)} is not JSON (${(err as Error).message})`);
      }
    }
    return { ...call, function: { ...call.function, arguments: args } };
  });
}

/** A grammar asked for by one of a request's keys; `json`: a JSON document's. */
interface Constraint {
  key: string;
  grammar: Grammar;
  json: boolean;
}

/**
 * Puts the request's grammar on its sequences: at most one of `constraints`, and a server
 * that can run it (a 400 naming the keys otherwise).
 */
function constrain(
  sequences: SequenceSpec[],
  ctx: ParseContext,
  constraints: Constraint[],
  ws: Whitespace | undefined,
): void {
  const [first, second] = constraints;
  if (ws && !first?.json) {
    throw bad(
      `${quote(ws.field)} is the whitespace of a JSON constraint (structured_outputs.json or json_object, guided_json, response_format), and this request has none`,
    );
  }
  if (first === undefined) return;
  if (second !== undefined) {
    throw bad(conflicting(constraints.map((c) => c.key)));
  }
  requireGrammar(ctx.limits, first.key);
  for (const s of sequences) s.params.grammar = first.grammar;
}

/**
 * vLLM's structured outputs (vllm/entrypoints/openai/protocol.py): `structured_outputs` with
 * one of `json` (a JSON Schema, an object or its JSON text), `regex`, `choice` (the output is
 * one of the strings), `grammar` (EBNF) or `json_object` (true: any JSON object), and the
 * keys vLLM had before 0.12, `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.
 */
function structuredOutputs(body: Record<string, unknown>, ws?: Whitespace): Constraint[] {
  const out: Constraint[] = [];
  const add = (key: string, kind: ConstraintKind, value: unknown) => {
    if (value === undefined || value === null) return;
    const json = kind === "json" || kind === "json_object";
    out.push({ key, grammar: requestedGrammar(kind, value, key, ws), json });
  };
  const kinds: readonly string[] = STRUCTURED_KINDS;
  const so = body.structured_outputs;
  if (so !== undefined && so !== null) {
    if (!isObject(so)) {
      throw bad(`"structured_outputs" must be an object like {"regex": "..."}, got ${typeOf(so)}`);
    }
    for (const [kind, value] of Object.entries(so)) {
      if (!kinds.includes(kind)) {
        if (value === null || kind === "whitespace_pattern") continue; // readWhitespace's
        if (kind === "disable_fallback" && typeof value === "boolean") continue;
        throw bad(
          `"structured_outputs.${kind}" is not supported (json, regex, choice, grammar, json_object)`,
        );
      }
      add(`structured_outputs.${kind}`, kind as ConstraintKind, value);
    }
  }
  for (const [key, kind] of Object.entries(GUIDED_KEYS)) add(key, kind, body[key]);
  return out;
}

/**
 * vLLM's whitespace_pattern (`structured_outputs.whitespace_pattern`, or
 * `guided_whitespace_pattern` before 0.12): a regular expression for the whitespace a JSON
 * constraint allows between its tokens (`""`: none, compact JSON).
 */
function readWhitespace(body: Record<string, unknown>): Whitespace | undefined {
  const so = isObject(body.structured_outputs) ? body.structured_outputs : {};
  const given = [
    ["structured_outputs.whitespace_pattern", so.whitespace_pattern],
    ["guided_whitespace_pattern", body.guided_whitespace_pattern],
  ].filter(([, v]) => v !== undefined && v !== null) as [string, unknown][];
  const [first, second] = given;
  if (first === undefined) return undefined;
  if (second !== undefined)
    throw bad(`"${first[0]}" and "${second[0]}" are the same setting: give one`);
  const [field, pattern] = first;
  if (typeof pattern !== "string")
    throw bad(`${quote(field)} must be a regular expression, got ${typeOf(pattern)}`);
  return { pattern, field };
}

/**
 * `response_format`: `{"type": "text"}` (the default), `{"type": "json_object"}` (any JSON
 * object) or `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` (a
 * document the schema accepts; ./grammar/json-schema.ts says which keywords). Null: free text.
 */
function readResponseFormat(body: Record<string, unknown>, ws?: Whitespace): Grammar | null {
  const format = body.response_format;
  if (format === undefined || format === null) return null;
  const shape =
    '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": ' +
    '{"name": ..., "schema": {...}}}';
  if (!isObject(format)) throw bad(`"response_format" must be ${shape}, got ${typeOf(format)}`);
  if (format.type === "text") return null;
  if (format.type === "json_object")
    return requestedGrammar("json_object", true, "response_format", ws);
  if (format.type !== "json_schema") {
    throw bad(
      `"response_format.type" must be "text", "json_object" or "json_schema", got ${JSON.stringify(format.type)}`,
    );
  }
  const spec = format.json_schema;
  if (!isObject(spec) || spec.schema === undefined) {
    throw bad(
      `"response_format.json_schema" must be {"name": ..., "schema": {...}}, got ${typeOf(spec)}`,
    );
  }
  return requestedGrammar("json", spec.schema, "response_format.json_schema.schema", ws);
}

/**
 * `tools`, `tool_choice` and `parallel_tool_calls`. Function tools only; `tool_choice`
 * "auto" (the default with tools) reads calls back, "none" renders the tools but reads no
 * calls (vLLM's default); "required" (one or more calls of any tool, one without
 * `parallel_tool_calls`) and a named function (`{"type": "function", "function": {"name"}}`:
 * one call of it) force the calls with a grammar (./grammar/tool-calls.ts) and read them
 * back.
 */
function readTools(body: Record<string, unknown>): ToolSetting | null {
  const tools = body.tools;
  const choice = body.tool_choice ?? (tools ? "auto" : "none");
  const parallel = boolean(body, "parallel_tool_calls", true);
  if (tools === undefined || tools === null) {
    if (choice !== "none") {
      throw bad(`"tool_choice" = ${JSON.stringify(choice)} needs "tools"`);
    }
    return null;
  }
  if (!Array.isArray(tools)) throw bad(`"tools" must be a list, got ${typeOf(tools)}`);
  tools.forEach((tool, i) => {
    const f = `tools[${i}]`;
    if (!isObject(tool) || tool.type !== "function" || !isObject(tool.function)) {
      throw bad(
        `${quote(f)} must be {"type": "function", "function": {"name", "description", "parameters"}}`,
      );
    }
    if (typeof tool.function.name !== "string" || tool.function.name === "") {
      throw bad(`${quote(`${f}.function.name`)} must be a non-empty string`);
    }
  });
  const functions = tools.map((t) => t.function as FunctionTool);
  let grammar: Grammar | null = null;
  if (choice === "required") {
    grammar = toolCallGrammar(functions, parallel, (i) => `tools[${i}]`);
  } else if (isObject(choice) && choice.type === "function" && isObject(choice.function)) {
    const name = choice.function.name;
    const i = functions.findIndex((f) => f.name === name);
    const named = functions[i];
    if (named === undefined) {
      throw bad(
        `"tool_choice.function.name" = ${JSON.stringify(name)} is not among "tools" ` +
          `(${functions.map((f) => JSON.stringify(f.name)).join(", ")})`,
      );
    }
    grammar = toolCallGrammar([named], false, () => `tools[${i}]`);
  } else if (choice !== "auto" && choice !== "none") {
    throw bad(
      `"tool_choice" must be "auto", "none", "required" or {"type": "function", "function": ` +
        `{"name": ...}}, got ${JSON.stringify(choice)}`,
    );
  }
  return {
    tools: tools as Record<string, unknown>[],
    parseCalls: choice !== "none",
    maxCalls: parallel && !isObject(choice) ? Number.POSITIVE_INFINITY : 1,
    grammar,
  };
}
