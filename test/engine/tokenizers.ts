/**
 * Hand-made tokenizer.json files of the two decoder families a model may have: byte-level
 * BPE (GPT-2, Qwen2, Llama 3: every byte is a printable character) and SentencePiece-style
 * (Llama 2: "▁" for spaces, `<0xNN>` byte fallback, the first space stripped). Small
 * vocabularies with the tokens the tests need, loadable by the tokenizers library.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** GPT-2's bytes_to_unicode: byte → the printable character that stands for it. */
export function byteToChar(): string[] {
  const printable: number[] = [];
  for (let b = 33; b <= 126; b++) printable.push(b);
  for (let b = 161; b <= 172; b++) printable.push(b);
  for (let b = 174; b <= 255; b++) printable.push(b);
  const chars: string[] = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    chars[b] = printable.includes(b)
      ? String.fromCodePoint(b)
      : String.fromCodePoint(256 + extra++);
  }
  return chars;
}

export interface MadeTokenizer {
  json: Record<string, unknown>;
  /** Token string (as in the vocabulary, or the added token's content) → id. */
  ids: Map<string, number>;
}

function added(id: number, content: string, special: boolean) {
  return {
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special,
  };
}

/**
 * Byte-level BPE: ids 0-255 are the bytes, then whole-text tokens given as UTF-8 byte
 * strings (so a token may end inside a multi-byte character), then added tokens.
 */
export function byteLevelTokenizer(): MadeTokenizer {
  const chars = byteToChar();
  const vocab: Record<string, number> = {};
  for (let b = 0; b < 256; b++) vocab[chars[b] as string] = b;
  const asToken = (bytes: Buffer) => [...bytes].map((b) => chars[b]).join("");
  const ids = new Map<string, number>();
  let next = 256;
  for (const text of [" hello", " world", "</", "answer", "</answer>", " é", "中"]) {
    const t = asToken(Buffer.from(text, "utf8"));
    vocab[t] = next;
    ids.set(text, next++);
  }
  // "er>" followed by the first byte of "é" (0xC3 0xA9): a token ending inside a character.
  const split = asToken(Buffer.concat([Buffer.from("er>"), Buffer.from([0xc3])]));
  vocab[split] = next;
  ids.set("er>\\xC3", next++);
  for (let b = 0; b < 256; b++) ids.set(`byte:${b}`, b);
  ids.set(">", 0x3e);
  const specials = ["<|endoftext|>", "<|im_end|>"];
  const addedTokens = specials.map((s, i) => added(next + i, s, true));
  for (const [i, s] of specials.entries()) ids.set(s, next + i);
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: {
      type: "ByteLevel",
      add_prefix_space: false,
      trim_offsets: true,
      use_regex: true,
    },
    post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: [],
    },
  };
  return { json, ids };
}

/** SentencePiece-style BPE with byte fallback, Llama 2's normalizer and decoder. */
export function sentencePieceTokenizer(): MadeTokenizer {
  const vocab: Record<string, number> = { "<unk>": 0, "<s>": 1, "</s>": 2 };
  const ids = new Map<string, number>([
    ["<unk>", 0],
    ["<s>", 1],
    ["</s>", 2],
  ]);
  for (let b = 0; b < 256; b++) {
    const t = `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`;
    vocab[t] = 3 + b;
    ids.set(`byte:${b}`, 3 + b);
  }
  let next = 259;
  for (const t of ["▁hello", "▁world", "▁</", "answer", ">", "▁", "▁é", "中"]) {
    vocab[t] = next;
    ids.set(t, next++);
  }
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [added(0, "<unk>", true), added(1, "<s>", true), added(2, "</s>", true)],
    normalizer: {
      type: "Sequence",
      normalizers: [
        { type: "Prepend", prepend: "▁" },
        { type: "Replace", pattern: { String: " " }, content: "▁" },
      ],
    },
    pre_tokenizer: null,
    post_processor: null,
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: "▁" }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        { type: "Strip", content: " ", start: 1, stop: 0 },
      ],
    },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: "<unk>",
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: true,
      ignore_merges: false,
      vocab,
      merges: [],
    },
  };
  return { json, ids };
}

/** Writes `<dir>/tokenizer.json` (creating dir) and returns dir. */
export function writeTokenizer(dir: string, made: MadeTokenizer): string {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(made.json));
  return dir;
}
