/**
 * The tokenizer of a dense retriever's encoder folder (`--retriever-model`), as transformers
 * 5's AutoTokenizer builds it: what Search-R1's retrieval_server.py and index_builder.py
 * encode queries and passages with (`tokenizer(texts, truncation=True, max_length=N)`).
 *
 * The class comes from tokenizer_config.json's `tokenizer_class`, else config.json's, else
 * config.json's model_type ("bert": BertTokenizer), as AutoTokenizer picks it. For the
 * BERT-family classes (BERT_TOKENIZER_CLASSES: all are transformers' BertTokenizer), the
 * tokenizer is built as BertTokenizer.__init__ builds it, whatever tokenizer.json's
 * pipeline says: the vocabulary of tokenizer.json's model, or of vocab.txt when the folder
 * has no tokenizer.json (older BERT-family retrievers); a WordPiece model ("##",
 * max_input_chars_per_word 100) with the config's unk_token; BertNormalizer with the
 * config's do_lower_case (default true), strip_accents (default null: as do_lower_case) and
 * tokenize_chinese_chars (default true); BertPreTokenizer; the template `cls_token $A
 * sep_token` (type id 0); added tokens: tokenizer_config.json's added_tokens_decoder, else
 * tokenizer.json's added_tokens (or added_tokens.json), then the named special tokens. So a
 * tokenizer.json without post-processor (what `tokenizers`' BertWordPieceTokenizer.save()
 * writes after training) still gets [CLS] ... [SEP], and truncation to N leaves room for
 * them (transformers 4 added nothing there; every BERT was trained with them).
 *
 * Another class's tokenizer.json is used as it is when it has a post-processor; without one
 * it is refused rather than encoded without the special tokens the model expects.
 * test/retrieval/make_bert_tokenizer_fixtures.py records what transformers does with each
 * of these folders.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { InputError } from "../runtime/errors.js";
import { type LoadOptions, TextTokenizer } from "./tokenizer.js";
import { readJsonObject, readTokenizerConfig, type TokenizerConfig } from "./tokenizer-config.js";

/**
 * Class names (as tokenizer_config.json may spell them, with or without "Fast") that
 * transformers 5 resolves to BertTokenizer or a subclass with the same defaults.
 */
export const BERT_TOKENIZER_CLASSES: ReadonlySet<string> = new Set(
  ["Bert", "DistilBert", "ConvBert", "SqueezeBert", "MobileBert", "Electra"].flatMap((m) => [
    `${m}Tokenizer`,
    `${m}TokenizerFast`,
  ]),
);

/** config.json model types whose tokenizer AutoTokenizer picks as BertTokenizer. */
const BERT_MODEL_TYPES: ReadonlySet<string> = new Set([
  "bert",
  "distilbert",
  "convbert",
  "squeezebert",
  "electra",
]);

/** BertTokenizer's named special tokens and their defaults. */
const BERT_SPECIALS = {
  unk_token: "[UNK]",
  sep_token: "[SEP]",
  pad_token: "[PAD]",
  cls_token: "[CLS]",
  mask_token: "[MASK]",
} as const;

const MISSING =
  "expected the encoder's tokenizer.json, or vocab.txt for a BERT-family tokenizer, beside " +
  "its config.json";

/** tokenizer.json's serialisation of an added token. */
interface AddedToken {
  id: number;
  content: string;
  single_word: boolean;
  lstrip: boolean;
  rstrip: boolean;
  normalized: boolean;
  special: boolean;
}

interface TokenizerClass {
  name: string | null;
  /** Where it was read, for messages: "tokenizer_config.json names X". */
  where: string;
}

/**
 * Loads `<dir>`'s tokenizer as described above; an InputError naming the file when it is
 * missing, unreadable or refused. `maxLength` truncates as transformers' `truncation=True,
 * max_length=N` does (special tokens included).
 */
export function loadEncoderTokenizer(dir: string, options: LoadOptions = {}): TextTokenizer {
  const config = readTokenizerConfig(dir);
  const cls = tokenizerClass(dir, config);
  const bert = cls.name !== null && BERT_TOKENIZER_CLASSES.has(cls.name);
  const jsonPath = join(dir, "tokenizer.json");
  const vocabPath = join(dir, "vocab.txt");
  if (existsSync(jsonPath)) {
    const file = readJsonObject(jsonPath);
    if (bert) {
      const added =
        "added_tokens_decoder" in config.settings ? null : fileAddedTokens(file, jsonPath);
      return TextTokenizer.fromJson(
        bertTokenizer(jsonVocab(file, jsonPath), config, added, jsonPath),
        jsonPath,
        options,
      );
    }
    if (file.post_processor === null || file.post_processor === undefined) {
      throw new InputError(
        `${jsonPath}: has no post-processor, and the tokenizer class (${cls.where}) is not ` +
          "a BERT-family one, whose [CLS] and [SEP] searchr1 adds itself: encoded without " +
          "the special tokens the model was trained with, its vectors would be wrong. Add " +
          "the model's post-processor to tokenizer.json, or name BertTokenizer in " +
          "tokenizer_config.json if the model is a BERT",
      );
    }
    return TextTokenizer.load(dir, options);
  }
  if (existsSync(vocabPath)) {
    if (!bert) {
      throw new InputError(
        `${vocabPath}: a vocabulary without tokenizer.json is read only for BERT-family ` +
          `tokenizers (BertTokenizer), and the tokenizer class (${cls.where}) is not one; ` +
          "expected the model's tokenizer.json",
      );
    }
    const added = "added_tokens_decoder" in config.settings ? null : legacyAddedTokens(dir, config);
    return TextTokenizer.fromJson(
      bertTokenizer(readVocabTxt(vocabPath), config, added, vocabPath),
      vocabPath,
      options,
    );
  }
  throw new InputError(`${jsonPath}: no such file (nor vocab.txt); ${options.missing ?? MISSING}`);
}

/** The tokenizer class AutoTokenizer would instantiate for the folder, and where it says so. */
function tokenizerClass(dir: string, config: TokenizerConfig): TokenizerClass {
  const named = config.settings.tokenizer_class;
  if (typeof named === "string") {
    return { name: named, where: `${config.path} names ${named}` };
  }
  const modelPath = join(dir, "config.json");
  const model = existsSync(modelPath) ? readJsonObject(modelPath) : {};
  if (typeof model.tokenizer_class === "string") {
    return { name: model.tokenizer_class, where: `${modelPath} names ${model.tokenizer_class}` };
  }
  const type = model.model_type;
  if (typeof type === "string" && BERT_MODEL_TYPES.has(type)) {
    return { name: "BertTokenizer", where: `${modelPath} says model_type "${type}"` };
  }
  return {
    name: null,
    where: `named neither in tokenizer_config.json nor in ${modelPath}`,
  };
}

/** The WordPiece vocabulary of tokenizer.json's model (token → id). */
function jsonVocab(file: Record<string, unknown>, path: string): Map<string, number> {
  const model = file.model as { vocab?: unknown } | null | undefined;
  const vocab = model?.vocab;
  const out = new Map<string, number>();
  if (Array.isArray(vocab)) {
    // a Unigram's [token, score] list: ids are the positions (as transformers reads it)
    vocab.forEach((entry, i) => {
      out.set(Array.isArray(entry) ? String(entry[0]) : String(entry), i);
    });
    return out;
  }
  if (typeof vocab !== "object" || vocab === null) {
    throw new InputError(`${path}: model.vocab: expected the vocabulary (token → id)`);
  }
  for (const [token, id] of Object.entries(vocab)) {
    if (!Number.isInteger(id) || (id as number) < 0) {
      throw new InputError(
        `${path}: model.vocab[${JSON.stringify(token)}]: expected an id, got ${JSON.stringify(id)}`,
      );
    }
    out.set(token, id as number);
  }
  return out;
}

/**
 * transformers' load_vocab: one token a line (universal newlines, only the line break
 * removed), the id its line number; a repeated token keeps its last line.
 */
function readVocabTxt(path: string): Map<string, number> {
  const lines = readFileSync(path, "utf8").split(/\r\n|\r|\n/);
  if (lines.at(-1) === "") lines.pop();
  if (lines.length === 0) throw new InputError(`${path}: empty vocabulary`);
  const out = new Map<string, number>();
  lines.forEach((token, i) => {
    out.set(token, i);
  });
  return out;
}

/** tokenizer.json's added_tokens, by id. */
function fileAddedTokens(file: Record<string, unknown>, path: string): AddedToken[] {
  const list = file.added_tokens ?? [];
  if (!Array.isArray(list)) throw new InputError(`${path}: added_tokens: expected a list`);
  return list
    .map((entry, i) => addedToken(entry, `${path}: added_tokens[${i}]`, null))
    .sort((a, b) => a.id - b.id);
}

/** An old folder's added_tokens.json ({token: id}); special when a named special token. */
function legacyAddedTokens(dir: string, config: TokenizerConfig): AddedToken[] {
  const path = join(dir, "added_tokens.json");
  if (!existsSync(path)) return [];
  const specials = new Set(Object.values(specialTokens(config)));
  return Object.entries(readJsonObject(path))
    .map(([content, id]) => {
      if (!Number.isInteger(id)) {
        throw new InputError(`${path}: ${JSON.stringify(content)}: expected an id`);
      }
      const special = specials.has(content);
      return base(content, id as number, special, !special);
    })
    .sort((a, b) => a.id - b.id);
}

function base(content: string, id: number, special: boolean, normalized: boolean): AddedToken {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized, special };
}

/** A serialised AddedToken ({"content", "special", ...}); `id` when the entry has none. */
function addedToken(entry: unknown, where: string, id: number | null): AddedToken {
  const e = (entry ?? {}) as Record<string, unknown>;
  const entryId = typeof e.id === "number" ? e.id : id;
  if (typeof e.content !== "string" || entryId === null) {
    throw new InputError(`${where}: expected {"id", "content", ...}, got ${JSON.stringify(entry)}`);
  }
  const special = e.special === true;
  return {
    id: entryId,
    content: e.content,
    single_word: e.single_word === true,
    lstrip: e.lstrip === true,
    rstrip: e.rstrip === true,
    normalized: typeof e.normalized === "boolean" ? e.normalized : !special,
    special,
  };
}

/** BertTokenizer's special tokens: the config's (strings or AddedToken objects), else defaults. */
function specialTokens(config: TokenizerConfig): Record<keyof typeof BERT_SPECIALS, string> {
  const out: Record<keyof typeof BERT_SPECIALS, string> = { ...BERT_SPECIALS };
  for (const key of Object.keys(BERT_SPECIALS) as (keyof typeof BERT_SPECIALS)[]) {
    if (config.settings[key] === null) {
      throw new InputError(
        `${settingsPath(config)}: ${key} is null; BertTokenizer needs one (default ` +
          `"${BERT_SPECIALS[key]}")`,
      );
    }
    const text = config.specialTokens[key];
    if (text !== undefined) out[key] = text;
  }
  return out;
}

/** The file the settings came from (special_tokens_map.json's tokens alone: that file). */
function settingsPath(config: TokenizerConfig): string {
  return config.path ?? "special_tokens_map.json";
}

function option<T>(config: TokenizerConfig, key: string, fallback: T, nullable = false): T {
  const value = config.settings[key];
  if (value === undefined) return fallback;
  if (typeof value === "boolean" || (nullable && value === null)) return value as T;
  throw new InputError(
    `${config.path}: ${key}: expected true or false${nullable ? " (or null)" : ""}, got ` +
      JSON.stringify(value),
  );
}

/**
 * BertTokenizer's pipeline, in tokenizer.json's format: `vocab` from the model's file
 * (`source`), options and special tokens from tokenizer_config.json, `added` the added
 * tokens (null: the config's added_tokens_decoder).
 */
function bertTokenizer(
  vocab: Map<string, number>,
  config: TokenizerConfig,
  added: AddedToken[] | null,
  source: string,
): object {
  const specials = specialTokens(config);
  if (!vocab.has(specials.unk_token)) {
    throw new InputError(
      `${source}: the unk_token ${JSON.stringify(specials.unk_token)} is not in the vocabulary` +
        (config.path ? ` (${config.path} names it)` : ""),
    );
  }
  const decoder = config.settings.added_tokens_decoder;
  let tokens: AddedToken[];
  if (added !== null) {
    tokens = added;
  } else if (typeof decoder === "object" && decoder !== null && !Array.isArray(decoder)) {
    tokens = Object.entries(decoder)
      .map(([id, entry]) =>
        addedToken(entry, `${config.path}: added_tokens_decoder.${id}`, Number(id)),
      )
      .sort((a, b) => a.id - b.id);
  } else {
    throw new InputError(`${config.path}: added_tokens_decoder: expected {"<id>": {...}}`);
  }
  // then each named special token not added yet (not normalized, special), in
  // transformers' order: the named ones, then model-specific and extra ones
  const present = new Set(tokens.map((t) => t.content));
  const named = [...Object.values(specials), ...Object.values(config.specialTokens)];
  for (const content of named) {
    if (present.has(content)) continue;
    present.add(content);
    tokens.push(base(content, -1, true, false));
  }
  // ids as the library gives them: the vocabulary's, else the next free one
  let next = 0;
  for (const id of vocab.values()) next = Math.max(next, id + 1);
  const ids = new Map<string, number>();
  const addedTokens = tokens.map((t) => {
    const id = vocab.get(t.content) ?? ids.get(t.content) ?? next++;
    ids.set(t.content, id);
    return { ...t, id };
  });
  const idOf = (token: string) => vocab.get(token) ?? (ids.get(token) as number);
  const { cls_token: cls, sep_token: sep } = specials;
  const special = (id: string, typeId: number) => ({ SpecialToken: { id, type_id: typeId } });
  const sequence = (id: string, typeId: number) => ({ Sequence: { id, type_id: typeId } });
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: {
      type: "BertNormalizer",
      clean_text: true,
      handle_chinese_chars: option(config, "tokenize_chinese_chars", true),
      strip_accents: option<boolean | null>(config, "strip_accents", null, true),
      lowercase: option(config, "do_lower_case", true),
    },
    pre_tokenizer: { type: "BertPreTokenizer" },
    post_processor: {
      type: "TemplateProcessing",
      single: [special(cls, 0), sequence("A", 0), special(sep, 0)],
      pair: [special(cls, 0), sequence("A", 0), special(sep, 0), sequence("B", 1), special(sep, 1)],
      special_tokens: Object.fromEntries(
        [cls, sep].map((token) => [token, { id: token, ids: [idOf(token)], tokens: [token] }]),
      ),
    },
    decoder: { type: "WordPiece", prefix: "##", cleanup: true },
    model: {
      type: "WordPiece",
      unk_token: specials.unk_token,
      continuing_subword_prefix: "##",
      max_input_chars_per_word: 100,
      vocab: Object.fromEntries(vocab),
    },
  };
}
