/**
 * What a model folder's `tokenizer_config.json` says about text, as transformers 5 reads it:
 * the named special tokens a chat template sees (`bos_token`, `eos_token`, ...) and the chat
 * template(s) stored in it. A folder without the file has neither (transformers then
 * tokenizes from tokenizer.json alone).
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { InputError } from "../runtime/errors.js";

/** transformers' SPECIAL_TOKENS_ATTRIBUTES: the named special tokens every tokenizer has. */
const NAMED_SPECIAL_TOKENS = [
  "bos_token",
  "eos_token",
  "unk_token",
  "sep_token",
  "pad_token",
  "cls_token",
  "mask_token",
] as const;

export interface TokenizerConfig {
  /** The tokenizer_config.json file, or null when the folder has none. */
  path: string | null;
  /**
   * `tokenizer.special_tokens_map`: the named special tokens that are set (bos_token,
   * eos_token, unk_token, sep_token, pad_token, cls_token, mask_token) plus model-specific
   * `*_token` strings (e.g. `image_token`) and `extra_special_tokens` given by name. A chat
   * template sees each as a variable.
   */
  specialTokens: Record<string, string>;
  /**
   * The "chat_template" entry: one template, or named ones (`[{"name", "template"}]`);
   * null when there is none.
   */
  chatTemplate: string | Record<string, string> | null;
  /**
   * The file's object as read (with special_tokens_map.json's tokens merged in as above): the
   * tokenizer class's own options (`tokenizer_class`, `do_lower_case`, ...); {} without a file.
   */
  settings: Record<string, unknown>;
}

/**
 * Reads `<dir>/tokenizer_config.json` (and, for a folder whose config has no
 * `added_tokens_decoder`, the legacy `special_tokens_map.json`, whose tokens win, as in
 * transformers); an InputError naming the file and field when one is bad.
 */
export function readTokenizerConfig(dir: string): TokenizerConfig {
  const path = join(dir, "tokenizer_config.json");
  const config = existsSync(path) ? readJsonObject(path) : {};
  const legacy = join(dir, "special_tokens_map.json");
  if (!("added_tokens_decoder" in config) && existsSync(legacy)) {
    const map = readJsonObject(legacy);
    for (const key of NAMED_SPECIAL_TOKENS) if (key in map) config[key] = map[key];
  }
  const where = existsSync(path) ? path : legacy;
  return {
    path: existsSync(path) ? path : null,
    specialTokens: specialTokensOf(config, where),
    chatTemplate: chatTemplateOf(config.chat_template, path),
    settings: config,
  };
}

/** A JSON file holding an object; an InputError naming the file otherwise. */
export function readJsonObject(path: string): Record<string, unknown> {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf8"));
  } catch (err) {
    throw new InputError(`${path}: not valid JSON (${(err as Error).message})`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw new InputError(`${path}: expected a JSON object`);
  }
  return raw as Record<string, unknown>;
}

/** A token given as a string or as a serialised AddedToken (`{"content": ...}`). */
function tokenText(value: unknown): string | null | undefined {
  if (typeof value === "string") return value;
  if (value === null || value === undefined) return null;
  if (typeof value === "object" && typeof (value as { content?: unknown }).content === "string") {
    return (value as { content: string }).content;
  }
  return undefined;
}

function specialTokensOf(config: Record<string, unknown>, path: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const key of NAMED_SPECIAL_TOKENS) {
    const text = tokenText(config[key]);
    if (text === undefined) {
      throw new InputError(
        `${path}: ${key}: expected a token string, null or {"content": "..."}, got ` +
          JSON.stringify(config[key]),
      );
    }
    if (text !== null) out[key] = text;
  }
  // Model-specific tokens: the other "*_token" keys holding a string (transformers 5 adds
  // them to the special tokens map), then extra_special_tokens given as {name: token}.
  const extra = config.extra_special_tokens;
  const named = [
    ...Object.entries(config).filter(
      ([key]) =>
        key.endsWith("_token") && !(NAMED_SPECIAL_TOKENS as readonly string[]).includes(key),
    ),
    ...(typeof extra === "object" && extra !== null && !Array.isArray(extra)
      ? Object.entries(extra)
      : []),
  ];
  for (const [key, value] of named) if (typeof value === "string") out[key] = value;
  return out;
}

function chatTemplateOf(value: unknown, path: string): string | Record<string, string> | null {
  if (value === undefined || value === null) return null;
  if (typeof value === "string") return value;
  if (Array.isArray(value)) {
    const named: Record<string, string> = {};
    for (const [i, entry] of value.entries()) {
      const { name, template } = (entry ?? {}) as { name?: unknown; template?: unknown };
      if (typeof name !== "string" || typeof template !== "string") {
        throw new InputError(
          `${path}: chat_template[${i}]: expected {"name": string, "template": string}`,
        );
      }
      named[name] = template;
    }
    return named;
  }
  throw new InputError(
    `${path}: chat_template: expected a template string or a list of {"name", "template"}`,
  );
}
