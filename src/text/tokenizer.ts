/**
 * A model's tokenizer, from its own `tokenizer.json`, through Hugging Face's `tokenizers`
 * (the Rust library behind transformers' fast tokenizers, so byte-level BPE and
 * SentencePiece-style vocabularies encode and decode exactly as in Python). The one place
 * that loads a model's tokenizer: the engine's detokenizer and the agent both come here.
 *
 * Special tokens are added as transformers 5 adds them: exactly what the tokenizer.json's
 * post-processor adds (Qwen2: none; Llama 2 and 3: BOS). transformers 5 ignores
 * `add_bos_token`/`add_eos_token` in tokenizer_config.json when a tokenizer.json exists, and
 * so does this (transformers 4's Llama tokenizers rebuilt the post-processor from them).
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer, type TruncationStrategy } from "tokenizers";
import { InputError } from "../runtime/errors.js";

export interface EncodeOptions {
  /**
   * Whether the tokenizer.json's post-processor adds its special tokens (transformers'
   * `add_special_tokens`, default true there). A chat prompt is encoded without them: the
   * template already wrote them as text (apply_chat_template does the same).
   */
  addSpecialTokens: boolean;
}

export interface LoadOptions {
  /** What a missing tokenizer.json means for the caller, after "<path>: no such file; ". */
  missing?: string;
  /**
   * Cut every encoding to this many tokens, special tokens included (transformers'
   * `truncation=True, max_length=N`: the text's tokens are cut on the right, then the
   * post-processor's special tokens are added). Default: no truncation.
   */
  maxLength?: number;
}

const MISSING =
  "expected the model's tokenizer.json beside its config.json (transformers' " +
  "save_pretrained writes it)";

export class TextTokenizer {
  private constructor(
    private readonly backend: Tokenizer,
    /** The tokenizer.json file (or the vocab.txt a tokenizer was built from). */
    readonly path: string,
  ) {}

  /**
   * Loads `<dir>/tokenizer.json`; an InputError naming the file when it is missing or not
   * one the library can read. Padding and truncation stored in the file are switched off,
   * as transformers does for a call without `padding`/`truncation`; `maxLength` sets
   * transformers' truncation instead.
   */
  static load(dir: string, options: LoadOptions = {}): TextTokenizer {
    const path = join(dir, "tokenizer.json");
    if (!existsSync(path)) {
      throw new InputError(`${path}: no such file; ${options.missing ?? MISSING}`);
    }
    let backend: Tokenizer;
    try {
      backend = Tokenizer.fromFile(path);
    } catch (err) {
      throw new InputError(
        `${path}: not a tokenizer.json the tokenizers library can read (${err})`,
      );
    }
    return TextTokenizer.configured(backend, path, options);
  }

  /**
   * A tokenizer composed in memory in tokenizer.json's format (src/text/encoder-tokenizer.ts
   * builds BERT's from a vocabulary and tokenizer_config.json); `path` is the file it was
   * built from, named in errors. Truncation and padding as in `load`.
   */
  static fromJson(json: object, path: string, options: LoadOptions = {}): TextTokenizer {
    let backend: Tokenizer;
    try {
      backend = Tokenizer.fromString(JSON.stringify(json));
    } catch (err) {
      throw new InputError(
        `${path}: the tokenizers library refused the tokenizer built from it (${err})`,
      );
    }
    return TextTokenizer.configured(backend, path, options);
  }

  private static configured(backend: Tokenizer, path: string, options: LoadOptions): TextTokenizer {
    if (options.maxLength === undefined) backend.disableTruncation();
    else {
      // LongestFirst (the library's default, transformers' truncation=True) said outright, as
      // a pair (encodePairBatch) is cut by it. The binding's TruncationStrategy is a const
      // enum, absent at run time: its value.
      const strategy = "LongestFirst" as TruncationStrategy;
      backend.setTruncation(options.maxLength, { strategy });
    }
    backend.disablePadding();
    return new TextTokenizer(backend, path);
  }

  /** Tokens the tokenizer knows (added tokens included): `len(tokenizer)` in transformers. */
  get vocabSize(): number {
    return this.backend.getVocabSize(true);
  }

  /** `tokenizer.encode(text, add_special_tokens=...)`. */
  async encode(text: string, options: EncodeOptions): Promise<number[]> {
    const encoding = await this.backend.encode(text, null, {
      addSpecialTokens: options.addSpecialTokens,
    });
    return encoding.getIds();
  }

  /** `encode` of each text, in one call to the library (it spreads them over its threads). */
  async encodeBatch(texts: readonly string[], options: EncodeOptions): Promise<number[][]> {
    if (texts.length === 0) return [];
    const encodings = await this.backend.encodeBatch(texts as string[], {
      addSpecialTokens: options.addSpecialTokens,
    });
    return encodings.map((e) => e.getIds());
  }

  /**
   * Each (first, second) pair as `tokenizer(first, second)` encodes it, special tokens added
   * by the post-processor's pair template (BERT: `[CLS] first [SEP] second [SEP]`, types 0
   * then 1); with `maxLength`, cut as transformers' `truncation="longest_first"` cuts a pair
   * (the library's LongestFirst: the longer text loses tokens first).
   */
  async encodePairBatch(
    pairs: readonly (readonly [string, string])[],
  ): Promise<{ ids: number[]; typeIds: number[] }[]> {
    // The binding's encodeBatch takes single texts only: one asynchronous call per pair.
    const encodings = await Promise.all(
      pairs.map(([a, b]) => this.backend.encode(a, b, { addSpecialTokens: true })),
    );
    return encodings.map((e) => ({ ids: e.getIds(), typeIds: e.getTypeIds() }));
  }

  /**
   * The library's `decode(ids, skip_special_tokens)`. (transformers 5 skips
   * `clean_up_tokenization_spaces` for BPE models such as Qwen's and Llama's, so they agree;
   * for WordPiece ones it would also clean up spaces, which this never does.)
   */
  decode(ids: readonly number[], skipSpecialTokens: boolean): Promise<string> {
    return this.backend.decode(ids as number[], skipSpecialTokens);
  }

  /** `decode` of each id list, in one call to the library. */
  decodeBatch(ids: readonly (readonly number[])[], skipSpecialTokens: boolean): Promise<string[]> {
    return this.backend.decodeBatch(ids as number[][], skipSpecialTokens);
  }

  /** The id of a token (added tokens included), or null when the vocabulary lacks it. */
  tokenToId(token: string): number | null {
    return this.backend.tokenToId(token) ?? null;
  }

  /** The token string of an id, or null when out of range. */
  idToToken(id: number): string | null {
    return this.backend.idToToken(id) ?? null;
  }
}
