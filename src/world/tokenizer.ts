/**
 * A small byte-level BPE tokenizer for the world, laid out as Qwen2.5's (same normaliser,
 * pre-tokenizer regex, byte-level decoder, ChatML special tokens and chat template), so
 * that everything downstream treats the tiny model exactly as it would treat a Qwen model.
 *
 * The merges are learned here rather than with `tokenizers`' own trainer: its Node binding
 * exposes only `Tokenizer.train(files)` with a default trainer (no vocabulary size, no
 * initial alphabet). The library still does the pre-tokenization the learning counts words
 * from, and loads, encodes and decodes the result. The 256 byte symbols are always in the
 * vocabulary, so any text round-trips.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Tokenizer } from "tokenizers";

/** Qwen2's pre-tokenizer regex (words with their leading space, single digits, ...). */
const SPLIT_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

export const SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] as const;

/**
 * The agent's tags, one token each. Not special: they survive
 * `decode(skip_special_tokens=True)`, which the agent's text processing relies on.
 */
export const TAG_TOKENS = [
  "<think>",
  "</think>",
  "<search>",
  "</search>",
  "<answer>",
  "</answer>",
  "<information>",
  "</information>",
] as const;

export const SYSTEM_PROMPT = "You are a helpful assistant.";

/**
 * Qwen2.5's ChatML layout without its tool-calling branches: a default system turn when
 * the conversation has none, each message as `<|im_start|>role\ncontent<|im_end|>\n`.
 */
export const CHAT_TEMPLATE =
  "{%- if messages[0]['role'] == 'system' %}" +
  "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}" +
  "{%- else %}" +
  `{{- '<|im_start|>system\\n${SYSTEM_PROMPT}<|im_end|>\\n' }}` +
  "{%- endif %}" +
  "{%- for message in messages %}" +
  "{%- if not (loop.first and message['role'] == 'system') %}" +
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}" +
  "{%- endif %}" +
  "{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/** The ids a model config needs. */
export interface TokenIds {
  /** Every token, added ones included (the model's vocab_size). */
  vocabSize: number;
  endOfText: number;
  imStart: number;
  imEnd: number;
}

/**
 * GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the
 * others map to U+0100 onwards, so every byte is one visible character (space is "Ġ").
 */
function byteSymbols(): string[] {
  const keep = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  const out: string[] = [];
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    out.push(String.fromCodePoint(keep(b) ? b : 256 + extra++));
  }
  return out;
}

const BYTE_LEVEL = {
  type: "ByteLevel",
  add_prefix_space: false,
  trim_offsets: false,
  use_regex: false,
};

function tokenizerJson(vocab: Record<string, number>, merges: [string, string][]): object {
  const base = Object.keys(vocab).length;
  const added = [...SPECIAL_TOKENS, ...TAG_TOKENS].map((content, i) => ({
    id: base + i,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: (SPECIAL_TOKENS as readonly string[]).includes(content),
  }));
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: { type: "NFC" },
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: SPLIT_REGEX }, behavior: "Isolated", invert: false },
        BYTE_LEVEL,
      ],
    },
    post_processor: BYTE_LEVEL,
    decoder: BYTE_LEVEL,
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
      merges,
    },
  };
}

function tokenizerConfig(base: number, maxLength: number): object {
  const decoder: Record<string, object> = {};
  [...SPECIAL_TOKENS, ...TAG_TOKENS].forEach((content, i) => {
    decoder[String(base + i)] = {
      content,
      lstrip: false,
      normalized: false,
      rstrip: false,
      single_word: false,
      special: (SPECIAL_TOKENS as readonly string[]).includes(content),
    };
  });
  return {
    add_bos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: decoder,
    additional_special_tokens: ["<|im_start|>", "<|im_end|>"],
    bos_token: null,
    chat_template: CHAT_TEMPLATE,
    clean_up_tokenization_spaces: false,
    eos_token: "<|im_end|>",
    errors: "replace",
    model_max_length: maxLength,
    pad_token: "<|endoftext|>",
    split_special_tokens: false,
    tokenizer_class: "Qwen2Tokenizer",
    unk_token: null,
  };
}

const ADDED = new RegExp(
  [...SPECIAL_TOKENS, ...TAG_TOKENS].map((t) => t.replace(/[|<>/]/g, "\\$&")).join("|"),
  "g",
);

/** Pre-tokenized words (byte-level strings) of `texts`, counted, added tokens cut out. */
function countWords(texts: Iterable<string>): Map<string, number> {
  const symbols = byteSymbols();
  const vocab = Object.fromEntries(symbols.map((s, i) => [s, i]));
  const splitter = Tokenizer.fromString(JSON.stringify(tokenizerJson(vocab, [])));
  const pre = splitter.getPreTokenizer();
  if (!pre) throw new Error("world tokenizer: the pre-tokenizer did not load");
  const counts = new Map<string, number>();
  for (const text of texts) {
    for (const piece of text.normalize("NFC").split(ADDED)) {
      if (piece === "") continue;
      for (const [word] of pre.preTokenizeString(piece)) {
        counts.set(word, (counts.get(word) ?? 0) + 1);
      }
    }
  }
  return counts;
}

/**
 * Learns merges over the counted words until the vocabulary (bytes + merged tokens) holds
 * `size` tokens or no pair occurs twice. The most frequent pair wins; ties go to the pair
 * that sorts first, so the result depends on the counts alone.
 */
function learnMerges(
  counts: Map<string, number>,
  size: number,
): { vocab: Record<string, number>; merges: [string, string][] } {
  const vocab: Record<string, number> = {};
  byteSymbols().forEach((s, i) => {
    vocab[s] = i;
  });
  let next = 256;
  const words = [...counts]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([w, count]) => ({ symbols: [...w], count }));
  const merges: [string, string][] = [];
  while (next < size) {
    // Byte-level symbols never contain a space, so "a b" names a pair unambiguously.
    const pairs = new Map<string, number>();
    for (const { symbols, count } of words) {
      for (let i = 0; i + 1 < symbols.length; i++) {
        const key = `${symbols[i]} ${symbols[i + 1]}`;
        pairs.set(key, (pairs.get(key) ?? 0) + count);
      }
    }
    let best = "";
    let bestCount = 1;
    for (const [key, c] of pairs) {
      if (c > bestCount || (c === bestCount && best !== "" && key < best)) {
        best = key;
        bestCount = c;
      }
    }
    if (best === "") break;
    const [a, b] = best.split(" ") as [string, string];
    merges.push([a, b]);
    const merged = a + b;
    if (!(merged in vocab)) vocab[merged] = next++;
    for (const word of words) {
      const s = word.symbols;
      for (let i = 0; i + 1 < s.length; i++) {
        if (s[i] === a && s[i + 1] === b) s.splice(i, 2, merged);
      }
    }
  }
  return { vocab, merges };
}

export interface TrainedTokenizer {
  ids: TokenIds;
  /** tokenizer.json's text. */
  json: string;
  /** tokenizer_config.json's text. */
  config: string;
}

/**
 * Trains the tokenizer on `texts` (the texts it will see: prompts, passages, responses) to
 * `vocabSize` tokens in all, the 11 added tokens included.
 */
export function trainTokenizer(
  texts: Iterable<string>,
  vocabSize: number,
  maxLength: number,
): TrainedTokenizer {
  const added = SPECIAL_TOKENS.length + TAG_TOKENS.length;
  if (!Number.isInteger(vocabSize) || vocabSize < 256 + added) {
    throw new RangeError(
      `world vocabSize: expected an integer >= ${256 + added}, got ${vocabSize}`,
    );
  }
  const { vocab, merges } = learnMerges(countWords(texts), vocabSize - added);
  const base = Object.keys(vocab).length;
  return {
    ids: { vocabSize: base + added, endOfText: base, imStart: base + 1, imEnd: base + 2 },
    json: `${JSON.stringify(tokenizerJson(vocab, merges), null, 2)}\n`,
    config: `${JSON.stringify(tokenizerConfig(base, maxLength), null, 2)}\n`,
  };
}

/** Writes tokenizer.json and tokenizer_config.json into `dir`. */
export async function writeTokenizer(dir: string, trained: TrainedTokenizer): Promise<void> {
  await writeFile(join(dir, "tokenizer.json"), trained.json);
  await writeFile(join(dir, "tokenizer_config.json"), trained.config);
}
