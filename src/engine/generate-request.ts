/**
 * The `POST /generate` request of SGLang's protocol (the subset RL code uses), checked field
 * by field: every problem is an HttpError 400 naming the field (`sampling_params[2].top_p`,
 * `input_ids[1][7]`). Unlike SGLang's pydantic model, unknown keys are refused, so that a
 * misspelt `max_tokens` does not silently generate 128 tokens. SGLang keys this engine does
 * not implement (structural tags, stop regexes, prompt log-probs) are accepted at their neutral
 * values, which is what RL clients send, and refused otherwise.
 *
 * The request becomes a list of sequences, input-major: input 0's n samples, then input 1's.
 * With a `seed`, sample i of an input uses seed + i.
 */
import { editDistance } from "../config/suggest.js";
import { HttpError, typeOf } from "../runtime/http-server.js";
import type { Grammar } from "./grammar/builder.js";
import { requestedGrammar } from "./grammar/requested.js";

/** SGLang's defaults (python/sglang/srt/sampling/sampling_params.py). */
export const DEFAULT_MAX_NEW_TOKENS = 128;

/** Most sequences one request may ask for (inputs × n). */
export const MAX_SEQUENCES = 65_536;

/** Most top log-probs per token (`top_logprobs_num`): the native engine's bound. */
export const MAX_TOP_LOGPROBS_NUM = 1024;

/** What the request is checked against. */
export interface ModelLimits {
  /** Token ids must be below this (the model's embedding rows). */
  vocabSize: number;
  /** Prompt + output tokens of one sequence. */
  contextLength: number;
  /** false with --skip-tokenizer-init: no text, and stop strings are refused. */
  tokenizer: boolean;
  /** The LoRA adapters loaded (names); `lora_path` must name one. Absent: none. */
  loras?: readonly string[];
  /**
   * Why this server cannot constrain outputs with a grammar (a tokenizer whose token bytes
   * cannot be read), or null when it can. Absent: it cannot (no tokenizer).
   */
  grammar?: () => string | null;
}

export interface SamplingParams {
  /** Already clamped to the room left in the context after the prompt. */
  maxNewTokens: number;
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  stop: string[];
  stopTokenIds: number[];
  ignoreEos: boolean;
  seed: number | null;
  skipSpecialTokens: boolean;
  noStopTrim: boolean;
  /** The grammar the output must follow (SGLang's `json_schema`, OpenAI's formats). */
  grammar?: Grammar;
  /** SGLang's penalties (native/src/engine/PROTOCOL.md): 1, 0, 0 and 0 are off. */
  repetitionPenalty: number;
  frequencyPenalty: number;
  presencePenalty: number;
  minNewTokens: number;
  /** OpenAI's logit_bias: [token id, bias added to its logit]. */
  logitBias: [number, number][];
}

/** One sequence to generate. */
export interface SequenceSpec {
  /** Which input (0 for a single one) and which of its n samples. */
  input: number;
  sample: number;
  inputIds: number[];
  params: SamplingParams;
  returnLogprob: boolean;
  /** How many of the most likely tokens to report beside each sampled one (0: none). */
  topLogprobs: number;
  /** The loaded LoRA adapter it runs with (its name); absent: the base model. */
  lora?: string;
}

export interface GenerateRequest {
  /** input_ids was a list of lists. */
  batch: boolean;
  /** One input and n = 1: the answer is one object, not a list. */
  single: boolean;
  sequences: SequenceSpec[];
}

/** SGLang request keys accepted only at these values (null is always accepted). */
const NEUTRAL_REQUEST_KEYS: Record<string, unknown> = {
  stream: false,
  logprob_start_len: -1,
  return_text_in_logprobs: false,
  token_ids_logprob: null,
  return_hidden_states: false,
  custom_logit_processor: null,
};

/** SGLang sampling keys accepted only at these values (null is always accepted). */
const NEUTRAL_SAMPLING_KEYS: Record<string, unknown> = {
  spaces_between_special_tokens: true,
  structural_tag: null,
  custom_params: null,
  stop_regex: null,
};

const REQUEST_KEYS = [
  "input_ids",
  "sampling_params",
  "return_logprob",
  "top_logprobs_num",
  "lora_path",
];
const SAMPLING_KEYS = [
  "max_new_tokens",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "stop",
  "stop_token_ids",
  "ignore_eos",
  "n",
  "seed",
  "sampling_seed",
  "skip_special_tokens",
  "no_stop_trim",
  "json_schema",
  "regex",
  "ebnf",
  "repetition_penalty",
  "frequency_penalty",
  "presence_penalty",
  "min_new_tokens",
  "logit_bias",
];

/** Other servers' names for the same settings. */
const ALIASES: Record<string, string> = {
  max_tokens: "max_new_tokens",
  include_stop_str_in_output: "no_stop_trim",
  prompt_token_ids: "input_ids",
  token_ids: "input_ids",
};

const bad = (message: string) => new HttpError(400, message);

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** Reads the parsed JSON body of /generate; throws HttpError 400 naming the field at fault. */
export function parseGenerateRequest(body: unknown, limits: ModelLimits): GenerateRequest {
  if (!isObject(body)) {
    throw bad(
      `request body must be a JSON object like {"input_ids": [1, 2, 3], "sampling_params": ` +
        `{"max_new_tokens": 16}}, got ${typeOf(body)}`,
    );
  }
  checkKeys(body, REQUEST_KEYS, NEUTRAL_REQUEST_KEYS, "", {
    text: `"text" input is not supported: send "input_ids" (tokenize on the client)`,
    input_embeds: `"input_embeds" is not supported: send "input_ids"`,
    stream: `"stream": true is not supported: this server answers when generation is complete`,
  });
  const inputs = readInputs(body.input_ids, limits);
  const batch = inputs.batch;
  const count = inputs.ids.length;
  const params = readSamplingList(body.sampling_params, batch, count);
  const logprob = perInput(body.return_logprob, "return_logprob", batch, count, false, readFlag);
  const top = perInput(body.top_logprobs_num, "top_logprobs_num", batch, count, 0, readTopNum);
  const lora = perInput<string | null>(body.lora_path, "lora_path", batch, count, null, (v, f) =>
    readLoraName(v, f, limits.loras ?? []),
  );
  top.forEach((k, i) => {
    if (k > 0 && !logprob[i]) {
      const field = Array.isArray(body.top_logprobs_num)
        ? `top_logprobs_num[${i}]`
        : "top_logprobs_num";
      throw bad(`${quote(field)} = ${k} needs "return_logprob": true (the log-probs come with it)`);
    }
  });

  const sequences: SequenceSpec[] = [];
  for (let i = 0; i < count; i++) {
    const ids = inputs.ids[i] as number[];
    const raw = params[i] as { value: Record<string, unknown>; name: string };
    const { n, params: p } = readSampling(raw.value, raw.name, ids.length, limits);
    addSamples(
      sequences,
      {
        input: i,
        ids,
        n,
        params: p,
        returnLogprob: logprob[i] as boolean,
        topLogprobs: top[i] as number,
      },
      (key) => quote(`${raw.name}.${key}`),
    );
    const adapter = lora[i];
    if (adapter) for (const s of sequences) if (s.input === i) s.lora = adapter;
  }
  return { batch, single: !batch && sequences.length === 1, sequences };
}

/**
 * Appends the n samples of one input to `sequences`: sample s uses seed + s. `field` names
 * `n` and `seed` in errors (quoted).
 */
export function addSamples(
  sequences: SequenceSpec[],
  input: {
    input: number;
    ids: number[];
    n: number;
    params: SamplingParams;
    returnLogprob: boolean;
    topLogprobs: number;
  },
  field: (key: "n" | "seed") => string,
): void {
  const { n, params: p } = input;
  if (sequences.length + n > MAX_SEQUENCES) {
    throw bad(
      `${field("n")}: the request asks for more than ${MAX_SEQUENCES} sequences ` +
        "(inputs × n); send several requests",
    );
  }
  if (p.seed !== null && !Number.isSafeInteger(p.seed + n - 1)) {
    throw bad(`${field("seed")} + n - 1 must stay below 2^53`);
  }
  for (let s = 0; s < n; s++) {
    sequences.push({
      input: input.input,
      sample: s,
      inputIds: input.ids,
      params: { ...p, seed: p.seed === null ? null : p.seed + s },
      returnLogprob: input.returnLogprob,
      topLogprobs: input.topLogprobs,
    });
  }
}

function quote(field: string): string {
  return `"${field}"`;
}

/** Refuses keys that are neither known nor at their neutral value. */
function checkKeys(
  object: Record<string, unknown>,
  known: readonly string[],
  neutral: Record<string, unknown>,
  prefix: string,
  advice: Record<string, string> = {},
): void {
  for (const [key, value] of Object.entries(object)) {
    if (known.includes(key)) continue;
    const field = quote(`${prefix}${key}`);
    if (key in neutral) {
      if (value === null || value === neutral[key]) continue;
      throw bad(
        advice[key] ??
          `${field} = ${JSON.stringify(value)} is not supported by this engine (only ` +
            `${JSON.stringify(neutral[key])} or null)`,
      );
    }
    if (advice[key]) throw bad(advice[key]);
    const all = [...known, ...Object.keys(neutral)];
    const meant = ALIASES[key] ?? all.find((k) => editDistance(key, k) <= 2);
    throw bad(
      `${field} is not a known key${meant ? ` (did you mean "${prefix}${meant}"?)` : ""}; ` +
        `known keys: ${all.join(", ")}`,
    );
  }
}

function isTokenId(value: unknown, vocabSize: number): value is number {
  return Number.isInteger(value) && (value as number) >= 0 && (value as number) < vocabSize;
}

function tokenError(field: string, value: unknown, vocabSize: number): HttpError {
  return bad(
    `${quote(field)} must be a token id, an integer in [0, ${vocabSize}), got ${typeOf(value)}`,
  );
}

/** A prompt of token ids, checked against the vocabulary and the room in the context. */
export function readIds(value: unknown, field: string, limits: ModelLimits): number[] {
  if (!Array.isArray(value)) {
    throw bad(`${quote(field)} must be a list of token ids, got ${typeOf(value)}`);
  }
  if (value.length === 0) throw bad(`${quote(field)} is empty: a prompt needs at least one token`);
  for (let i = 0; i < value.length; i++) {
    if (!isTokenId(value[i], limits.vocabSize)) {
      throw tokenError(`${field}[${i}]`, value[i], limits.vocabSize);
    }
  }
  if (value.length >= limits.contextLength) {
    throw bad(
      `${quote(field)} has ${value.length} tokens: no room left to generate in the context ` +
        `length of ${limits.contextLength} tokens (restart with a larger --context-length, or ` +
        "send a shorter prompt)",
    );
  }
  return value as number[];
}

function readInputs(value: unknown, limits: ModelLimits): { batch: boolean; ids: number[][] } {
  if (value === undefined) {
    throw bad(`"input_ids" is required: a list of token ids, or a list of such lists (a batch)`);
  }
  if (!Array.isArray(value)) {
    throw bad(`"input_ids" must be a list of token ids or a list of lists, got ${typeOf(value)}`);
  }
  if (value.length > 0 && Array.isArray(value[0])) {
    if (value.length > MAX_SEQUENCES) {
      throw bad(`"input_ids" has ${value.length} prompts, more than ${MAX_SEQUENCES}`);
    }
    return {
      batch: true,
      ids: value.map((ids, i) => readIds(ids, `input_ids[${i}]`, limits)),
    };
  }
  return { batch: false, ids: [readIds(value, "input_ids", limits)] };
}

function readSamplingList(
  value: unknown,
  batch: boolean,
  count: number,
): { value: Record<string, unknown>; name: string }[] {
  if (value === undefined || value === null) {
    return Array.from({ length: count }, () => ({ value: {}, name: "sampling_params" }));
  }
  if (isObject(value)) {
    return Array.from({ length: count }, () => ({ value, name: "sampling_params" }));
  }
  if (Array.isArray(value)) {
    if (!batch) {
      throw bad(
        `"sampling_params" must be one object for a single input (a list is for a batch of ` +
          "input_ids lists)",
      );
    }
    if (value.length !== count) {
      throw bad(
        `"sampling_params" has ${value.length} entries for ${count} inputs: give one object, ` +
          "or one per input",
      );
    }
    return value.map((v, i) => {
      const name = `sampling_params[${i}]`;
      if (!isObject(v)) throw bad(`${quote(name)} must be an object, got ${typeOf(v)}`);
      return { value: v, name };
    });
  }
  throw bad(`"sampling_params" must be an object or a list of objects, got ${typeOf(value)}`);
}

/**
 * A request key SGLang takes as one value for every input or, for a batch, a list with one
 * per input (`return_logprob`, `top_logprobs_num`); `read` checks one value, naming `field`.
 */
function perInput<T>(
  value: unknown,
  key: string,
  batch: boolean,
  count: number,
  fallback: T,
  read: (value: unknown, field: string) => T,
): T[] {
  if (value === undefined || value === null) return new Array(count).fill(fallback);
  if (!Array.isArray(value)) return new Array(count).fill(read(value, key));
  if (!batch)
    throw bad(`${quote(key)} must be one value for a single input (a list is for a batch)`);
  if (value.length !== count) {
    throw bad(`${quote(key)} has ${value.length} entries for ${count} inputs`);
  }
  return value.map((v, i) => read(v, `${key}[${i}]`));
}

/**
 * SGLang's `lora_path` (managers/io_struct.py, GenerateReqInput): the name of a loaded LoRA
 * adapter, as SGLang's LoRA registry looks it up; null: the base model.
 */
export function readLoraName(
  value: unknown,
  field: string,
  loaded: readonly string[],
): string | null {
  if (value === null) return null;
  if (typeof value !== "string" || value === "") {
    throw bad(
      `${quote(field)} must be the name of a loaded LoRA adapter or null, got ${typeOf(value)}`,
    );
  }
  if (!loaded.includes(value)) {
    throw bad(
      `${quote(field)}: no LoRA adapter named "${value}" is loaded (loaded: ` +
        `${loaded.length ? loaded.join(", ") : "none"}; POST /load_lora_adapter loads one)`,
    );
  }
  return value;
}

function readFlag(value: unknown, field: string): boolean {
  if (typeof value !== "boolean")
    throw bad(`${quote(field)} must be true or false, got ${typeOf(value)}`);
  return value;
}

function readTopNum(value: unknown, field: string): number {
  if (
    !Number.isInteger(value) ||
    (value as number) < 0 ||
    (value as number) > MAX_TOP_LOGPROBS_NUM
  ) {
    throw bad(
      `${quote(field)} must be an integer in [0, ${MAX_TOP_LOGPROBS_NUM}] (how many of the most ` +
        `likely tokens to report beside each output token), got ${typeOf(value)}`,
    );
  }
  return value as number;
}

/**
 * SGLang's sampling keys (`p`, as /generate's `sampling_params` spells them), checked and
 * filled with SGLang's defaults. `fieldOf` names a key in error messages: by default
 * `<name>.<key>`; the OpenAI routes (./openai/) pass their own names for the same settings.
 */
export function readSampling(
  p: Record<string, unknown>,
  name: string,
  promptTokens: number,
  limits: ModelLimits,
  fieldOf: (key: string) => string = (key) => `${name}.${key}`,
): { n: number; params: SamplingParams } {
  checkKeys(p, SAMPLING_KEYS, NEUTRAL_SAMPLING_KEYS, `${name}.`);
  const field = (key: string) => quote(fieldOf(key));

  const number = (key: string, fallback: number, ok: (x: number) => boolean, want: string) => {
    const v = p[key];
    if (v === undefined) return fallback;
    if (typeof v !== "number" || !Number.isFinite(v) || !ok(v)) {
      throw bad(`${field(key)} must be ${want}, got ${typeOf(v)}`);
    }
    return v;
  };
  const boolean = (key: string, fallback: boolean) => {
    const v = p[key];
    if (v === undefined) return fallback;
    if (typeof v !== "boolean") throw bad(`${field(key)} must be true or false, got ${typeOf(v)}`);
    return v;
  };

  const room = limits.contextLength - promptTokens;
  let maxNewTokens = room;
  if (p.max_new_tokens !== null) {
    maxNewTokens = number(
      "max_new_tokens",
      DEFAULT_MAX_NEW_TOKENS,
      (x) => Number.isInteger(x) && x >= 0,
      "a non-negative integer (or null: up to the context length)",
    );
  }
  const temperature = number("temperature", 1, (x) => x >= 0, "a number ≥ 0 (0 = greedy)");
  const topP = number("top_p", 1, (x) => x > 0 && x <= 1, "a number in (0, 1]");
  const topK = number(
    "top_k",
    -1,
    (x) => Number.isInteger(x) && (x === -1 || x >= 1),
    "-1 (off) or an integer ≥ 1",
  );
  const minP = number("min_p", 0, (x) => x >= 0 && x <= 1, "a number in [0, 1]");
  const n = number("n", 1, (x) => Number.isInteger(x) && x >= 1, "an integer ≥ 1");

  if (p.seed !== undefined && p.seed !== null && p.sampling_seed !== undefined) {
    throw bad(`${field("seed")} and ${field("sampling_seed")} are the same setting: give one`);
  }
  const seedKey = p.seed !== undefined ? "seed" : "sampling_seed";
  let seed: number | null = null;
  if (p[seedKey] !== undefined && p[seedKey] !== null) {
    seed = number(
      seedKey,
      0,
      (x) => Number.isSafeInteger(x) && x >= 0,
      "a non-negative integer below 2^53 (or null)",
    );
  }

  let stop: string[] = [];
  if (p.stop !== undefined && p.stop !== null) {
    const list = typeof p.stop === "string" ? [p.stop] : p.stop;
    if (!Array.isArray(list)) {
      throw bad(`${field("stop")} must be a string or a list of strings, got ${typeOf(p.stop)}`);
    }
    stop = list.map((s, i) => {
      const f = typeof p.stop === "string" ? field("stop") : quote(`${fieldOf("stop")}[${i}]`);
      if (typeof s !== "string") throw bad(`${f} must be a string, got ${typeOf(s)}`);
      if (s === "") throw bad(`${f} is empty: a stop string needs at least one character`);
      return s;
    });
    if (stop.length > 0 && !limits.tokenizer) {
      throw bad(
        `${field("stop")}: stop strings need the tokenizer, and this server runs with ` +
          "--skip-tokenizer-init (use stop_token_ids)",
      );
    }
  }

  let stopTokenIds: number[] = [];
  if (p.stop_token_ids !== undefined && p.stop_token_ids !== null) {
    const list = p.stop_token_ids;
    if (!Array.isArray(list)) {
      throw bad(`${field("stop_token_ids")} must be a list of token ids, got ${typeOf(list)}`);
    }
    stopTokenIds = list.map((id, i) => {
      if (!isTokenId(id, limits.vocabSize)) {
        throw tokenError(`${fieldOf("stop_token_ids")}[${i}]`, id, limits.vocabSize);
      }
      return id;
    });
  }

  const grammar = readGrammar(p, fieldOf, limits);
  // SGLang's ranges (python/sglang/srt/sampling/sampling_params.py, verify).
  const repetitionPenalty = number(
    "repetition_penalty",
    1,
    (x) => x > 0 && x <= 2,
    "a number in (0, 2]",
  );
  const frequencyPenalty = number(
    "frequency_penalty",
    0,
    (x) => x >= -2 && x <= 2,
    "a number in [-2, 2]",
  );
  const presencePenalty = number(
    "presence_penalty",
    0,
    (x) => x >= -2 && x <= 2,
    "a number in [-2, 2]",
  );
  const minNewTokens = number(
    "min_new_tokens",
    0,
    (x) => Number.isInteger(x) && x >= 0 && x <= maxNewTokens,
    `an integer in [0, max_new_tokens = ${maxNewTokens}]`,
  );
  if (minNewTokens > 0 && grammar) {
    throw bad(
      `${field("min_new_tokens")} cannot be set with ${quote(grammar.field)}: the grammar says where to end`,
    );
  }
  const logitBias = readLogitBias(p.logit_bias, fieldOf("logit_bias"), limits.vocabSize);
  return {
    n,
    params: {
      ...(grammar ? { grammar: grammar.grammar } : {}),
      maxNewTokens: Math.min(maxNewTokens, room),
      temperature,
      topP,
      topK,
      minP,
      stop,
      stopTokenIds,
      ignoreEos: boolean("ignore_eos", false),
      seed,
      skipSpecialTokens: boolean("skip_special_tokens", true),
      noStopTrim: boolean("no_stop_trim", false),
      repetitionPenalty,
      frequencyPenalty,
      presencePenalty,
      minNewTokens,
      logitBias,
    },
  };
}

/**
 * SGLang's constrained-decoding sampling keys: `json_schema` (a JSON Schema as a JSON string;
 * an object is taken as well), `regex` (the whole output matches it) or `ebnf` (the output is
 * a sentence of its rule root), compiled into the grammar the output must follow, and the
 * key it came from. One of them at most.
 */
function readGrammar(
  p: Record<string, unknown>,
  fieldOf: (key: string) => string,
  limits: ModelLimits,
): { grammar: Grammar; field: string } | null {
  const given = (["json_schema", "regex", "ebnf"] as const).filter(
    (k) => p[k] !== undefined && p[k] !== null,
  );
  const key = given[0];
  if (key === undefined) return null;
  if (given.length > 1) {
    throw bad(conflicting(given.map(fieldOf)));
  }
  const field = fieldOf(key);
  requireGrammar(limits, field);
  const kind = ({ json_schema: "json", regex: "regex", ebnf: "grammar" } as const)[key];
  return { grammar: requestedGrammar(kind, p[key], field), field };
}

/**
 * Refuses `field`, a constraint, where this server cannot constrain outputs (no tokenizer, or
 * one whose token bytes cannot be read), saying why.
 */
export function requireGrammar(limits: ModelLimits, field: string): void {
  const problem = limits.grammar ? limits.grammar() : "this server runs with --skip-tokenizer-init";
  if (problem !== null) {
    throw bad(
      `${quote(field)} needs constrained decoding, which this server cannot do: ${problem}`,
    );
  }
}

/** ModelLimits' `grammar` for a server with this tokenizer (none: no grammar). */
export function grammarLimit(
  tokens: { grammarProblem(): string | null } | null,
): Pick<ModelLimits, "grammar"> {
  return tokens ? { grammar: () => tokens.grammarProblem() } : {};
}

/**
 * `logit_bias` (OpenAI's, and SGLang's sampling key): an object of token id (as a string, as
 * JSON keys are) → a bias in [-100, 100] added to that token's logit.
 */
function readLogitBias(value: unknown, field: string, vocabSize: number): [number, number][] {
  if (value === undefined || value === null) return [];
  if (!isObject(value)) {
    throw bad(`${quote(field)} must be an object of token id → bias, got ${typeOf(value)}`);
  }
  return Object.entries(value).map(([key, bias]): [number, number] => {
    const id = Number(key);
    if (!/^\d+$/.test(key) || id >= vocabSize) {
      throw bad(`${quote(`${field}.${key}`)}: the key must be a token id below ${vocabSize}`);
    }
    if (typeof bias !== "number" || !(bias >= -100 && bias <= 100)) {
      throw bad(`${quote(`${field}.${key}`)} must be a number in [-100, 100], got ${typeOf(bias)}`);
    }
    return [id, bias];
  });
}

/** The error of a request whose keys each constrain the output: only one may. */
export function conflicting(fields: string[]): string {
  const named = fields.map(quote).join(" and ");
  return `${named} ${fields.length === 2 ? "both" : "all"} constrain the output: give one`;
}
