import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InputError } from "../../src/runtime/errors.js";
import { ModelTokenizer } from "../../src/text/model-tokenizer.js";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import { readTokenizerConfig } from "../../src/text/tokenizer-config.js";
import {
  copyTokenizer,
  reference,
  type TokenizerName,
  tempRoot,
  tokenizerDir,
} from "./reference.js";

/**
 * Encoding against transformers 5 (reference.json): `tokenizer.encode(text,
 * add_special_tokens=True/False)` for a Qwen2-style byte-level BPE (adds nothing), a
 * Llama-3-style byte-level BPE (adds <|begin_of_text|>) and a SentencePiece-style Llama 2
 * tokenizer (adds <s>).
 */

const NAMES = Object.keys(reference.tokenizers) as TokenizerName[];
let root: string;

beforeAll(() => {
  root = tempRoot();
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe.each(NAMES)("%s: ids equal transformers'", (name) => {
  const ref = reference.tokenizers[name];
  let tok: TextTokenizer;
  beforeAll(() => {
    tok = TextTokenizer.load(tokenizerDir(name));
  });

  it.each(ref.encode.map((c) => [JSON.stringify(c.text).slice(0, 60), c] as const))(
    "encode %s",
    async (_, c) => {
      expect(await tok.encode(c.text, { addSpecialTokens: true })).toEqual(c.with_special);
      expect(await tok.encode(c.text, { addSpecialTokens: false })).toEqual(c.without_special);
    },
  );

  it("encodeBatch gives each text's ids, in order", async () => {
    const texts = ref.encode.map((c) => c.text);
    expect(await tok.encodeBatch(texts, { addSpecialTokens: true })).toEqual(
      ref.encode.map((c) => c.with_special),
    );
    expect(await tok.encodeBatch(texts, { addSpecialTokens: false })).toEqual(
      ref.encode.map((c) => c.without_special),
    );
    expect(await tok.encodeBatch([], { addSpecialTokens: false })).toEqual([]);
  });

  it("special tokens: what tokenizer.json's post-processor adds, as transformers 5", async () => {
    const c = ref.encode[0];
    if (!c) throw new Error("no encode cases");
    const added = c.with_special.length - c.without_special.length;
    expect(added).toBe(name === "qwen-bpe" ? 0 : 1);
    if (added === 1) expect(tok.idToToken(c.with_special[0] as number)).toMatch(/^<(s|\|begin)/);
  });

  it("the template variables are transformers' special_tokens_map", () => {
    expect(readTokenizerConfig(tokenizerDir(name)).specialTokens).toEqual(ref.special_tokens_map);
  });

  it("decodes its own ids back to the text (special tokens kept)", async () => {
    const c = ref.encode.find((e) => e.text.startsWith("Zürich"));
    if (!c) throw new Error("no non-ASCII case");
    expect(await tok.decode(c.without_special, false)).toBe(c.text);
    expect(tok.vocabSize).toBeGreaterThan(Math.max(...c.with_special));
    expect(tok.tokenToId(tok.idToToken(c.with_special[0] as number) as string)).toBe(
      c.with_special[0],
    );
    expect(tok.tokenToId("\u0000no such token")).toBeNull();
  });
});

describe("tokenizer_config.json's add_bos_token / add_eos_token", () => {
  it("are ignored when tokenizer.json exists, as transformers 5 ignores them", async () => {
    const ref = reference.config_flags;
    const dir = copyTokenizer(root, ref.tokenizer, ["tokenizer.json", "tokenizer_config.json"]);
    const path = join(dir, "tokenizer_config.json");
    const config = JSON.parse(readFileSync(path, "utf8"));
    writeFileSync(path, JSON.stringify({ ...config, ...ref.changes }));
    const tok = ModelTokenizer.load(dir);
    expect(await tok.encode(ref.text, { addSpecialTokens: true })).toEqual(ref.with_special);
    expect(await tok.encode(ref.text, { addSpecialTokens: false })).toEqual(ref.without_special);
  });
});

describe("bad tokenizer files: an InputError naming the file", () => {
  it("a folder without tokenizer.json", () => {
    const dir = join(root, "empty");
    expect(() => TextTokenizer.load(dir)).toThrow(InputError);
    expect(() => ModelTokenizer.load(dir)).toThrow(
      `${join(dir, "tokenizer.json")}: no such file; expected the model's tokenizer.json`,
    );
    expect(() => TextTokenizer.load(dir, { missing: "serve with --flag" })).toThrow(
      /tokenizer\.json: no such file; serve with --flag$/,
    );
  });

  it.each([
    ["not JSON", "{ nope"],
    ["JSON, not a tokenizer", JSON.stringify({ model: { type: "Nonsense" } })],
  ])("a tokenizer.json that is %s", (_, text) => {
    const dir = copyTokenizer(root, "qwen-bpe", []);
    writeFileSync(join(dir, "tokenizer.json"), text);
    const path = join(dir, "tokenizer.json");
    expect(() => TextTokenizer.load(dir)).toThrow(InputError);
    expect(() => TextTokenizer.load(dir)).toThrow(
      `${path}: not a tokenizer.json the tokenizers library can read (`,
    );
  });

  it("a tokenizer_config.json that is not JSON, not an object, or has a bad token", () => {
    const dir = copyTokenizer(root, "qwen-bpe", ["tokenizer.json"]);
    const path = join(dir, "tokenizer_config.json");
    writeFileSync(path, "{ nope");
    expect(() => ModelTokenizer.load(dir)).toThrow(`${path}: not valid JSON (`);
    writeFileSync(path, "[1]");
    expect(() => ModelTokenizer.load(dir)).toThrow(`${path}: expected a JSON object`);
    writeFileSync(path, JSON.stringify({ eos_token: 7 }));
    expect(() => ModelTokenizer.load(dir)).toThrow(
      `${path}: eos_token: expected a token string, null or {"content": "..."}, got 7`,
    );
  });

  it("a folder without tokenizer_config.json loads (no special tokens, no template)", () => {
    const dir = copyTokenizer(root, "llama-sp", ["tokenizer.json"]);
    const tok = ModelTokenizer.load(dir);
    expect(tok.specialTokens).toEqual({});
    expect(tok.chatTemplate).toBeNull();
  });
});

describe("special tokens from tokenizer_config.json", () => {
  it("AddedToken objects, model-specific *_token strings and extra_special_tokens", () => {
    const dir = copyTokenizer(root, "qwen-bpe", []);
    writeFileSync(
      join(dir, "tokenizer_config.json"),
      JSON.stringify({
        bos_token: { __type: "AddedToken", content: "<s>", lstrip: false },
        eos_token: "</s>",
        unk_token: null,
        image_token: "<|image|>",
        add_bos_token: true,
        extra_special_tokens: { audio_token: "<|audio|>" },
      }),
    );
    expect(readTokenizerConfig(dir).specialTokens).toEqual({
      bos_token: "<s>",
      eos_token: "</s>",
      image_token: "<|image|>",
      audio_token: "<|audio|>",
    });
  });

  it("a legacy special_tokens_map.json wins when the config has no added_tokens_decoder", () => {
    const dir = copyTokenizer(root, "qwen-bpe", []);
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ eos_token: "</s>" }));
    writeFileSync(
      join(dir, "special_tokens_map.json"),
      JSON.stringify({ bos_token: { content: "<s>" }, eos_token: "<|eot|>" }),
    );
    expect(readTokenizerConfig(dir).specialTokens).toEqual({
      bos_token: "<s>",
      eos_token: "<|eot|>",
    });
    writeFileSync(
      join(dir, "tokenizer_config.json"),
      JSON.stringify({ eos_token: "</s>", added_tokens_decoder: {} }),
    );
    expect(readTokenizerConfig(dir).specialTokens).toEqual({ eos_token: "</s>" });
  });
});
