/**
 * The reference results of test/text/make_fixtures.py (transformers 5): token ids and
 * rendered chat prompts, and where the tokenizer folders are.
 */
import { cpSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { ChatMessage } from "../../src/text/chat-template.js";

export const REPO = fileURLToPath(new URL("../../", import.meta.url));
export const FIXTURES = fileURLToPath(new URL("./fixtures/", import.meta.url));
export const templateFile = (name: string) => join(FIXTURES, "templates", `${name}.jinja`);

export type TokenizerName = "qwen-bpe" | "llama3" | "llama-sp";

export interface EncodeCase {
  text: string;
  with_special: number[];
  without_special: number[];
}

export interface ChatCase {
  tokenizer: TokenizerName;
  /** "own": the folder's template; else a file in fixtures/templates/. */
  template: string;
  conversation: string;
  add_generation_prompt: boolean;
  text?: string;
  ids?: number[];
  /** The TemplateError's message when the template refused the conversation. */
  error?: string;
}

export interface Reference {
  versions: Record<string, string>;
  /** [year, month (1-12), day, hour, minute, second]: what strftime_now saw. */
  now: [number, number, number, number, number, number];
  strftime: { format: string; text: string }[];
  conversations: Record<string, ChatMessage[]>;
  tokenizers: Record<
    TokenizerName,
    { dir: string; special_tokens_map: Record<string, string>; encode: EncodeCase[] }
  >;
  chat: ChatCase[];
  edge: {
    tokenizer: TokenizerName;
    conversation: string;
    add_generation_prompt: boolean;
    variables: Record<string, unknown>;
    cases: { name: string; template: string; text?: string; error?: string }[];
  };
  variables: {
    tokenizer: TokenizerName;
    conversation: string;
    variables: Record<string, unknown>;
    text: string;
  };
  config_flags: {
    tokenizer: TokenizerName;
    changes: Record<string, unknown>;
    text: string;
    with_special: number[];
    without_special: number[];
  };
  template_file_wins: { template: string; conversation: string; text: string };
}

export const reference = JSON.parse(
  readFileSync(join(FIXTURES, "reference.json"), "utf8"),
) as Reference;

/** The tokenizer folder of a reference tokenizer. */
export const tokenizerDir = (name: TokenizerName) => join(REPO, reference.tokenizers[name].dir);

/** The clock the reference rendered with. */
export const referenceNow = () => {
  const [y, mo, d, h, mi, s] = reference.now;
  return new Date(y, mo - 1, d, h, mi, s);
};

/** A temporary copy of a tokenizer folder's files (under `root`), to alter. */
export function copyTokenizer(root: string, name: TokenizerName, files: string[]): string {
  const dir = mkdtempSync(join(root, `${name}-`));
  for (const f of files) cpSync(join(tokenizerDir(name), f), join(dir, f));
  return dir;
}

export const tempRoot = () => mkdtempSync(join(tmpdir(), "sr1-text-"));
