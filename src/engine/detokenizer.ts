/**
 * Text from token ids with the model's own `tokenizer.json` (loaded by src/text: Hugging Face
 * `tokenizers`, the Rust library behind transformers' fast tokenizers, so byte-level BPE and
 * SentencePiece-style vocabularies decode exactly as in Python), and stop strings checked
 * token by token.
 *
 * Decoding calls made in the same turn of the event loop go to the library as one
 * `decodeBatch` (one call per decode step of the engine, however many sequences check stop
 * strings), which costs a fraction of separate calls.
 */
import { tokenBytesHex } from "../text/token-bytes.js";
import { TextTokenizer } from "../text/tokenizer.js";

interface Pending {
  ids: number[];
  resolve: (text: string) => void;
  reject: (err: unknown) => void;
}

export class Detokenizer {
  private readonly queued: [Pending[], Pending[]] = [[], []];
  private flushing = false;
  private bytes: string[] | null = null;

  private constructor(private readonly text: TextTokenizer) {}

  /** Loads `<dir>/tokenizer.json`; an InputError naming the file when it is missing or bad. */
  static load(dir: string): Detokenizer {
    return new Detokenizer(
      TextTokenizer.load(dir, {
        missing:
          "serve-engine decodes text and checks stop strings with the model's tokenizer.json " +
          "(copy it into the model folder, or serve token ids only with --skip-tokenizer-init)",
      }),
    );
  }

  /** The tokenizer itself (the OpenAI routes encode text prompts with it). */
  get tokenizer(): TextTokenizer {
    return this.text;
  }

  /** The tokenizer.json file. */
  get path(): string {
    return this.text.path;
  }

  /**
   * Each token id's bytes as hex, as the engine's `token_bytes` command takes them
   * (src/text/token-bytes.ts), read once. Throws an InputError naming tokenizer.json when
   * its vocabulary's bytes cannot be read (see grammarProblem).
   */
  tokenBytes(): string[] {
    if (this.bytes === null) this.bytes = tokenBytesHex(this.text.path);
    return this.bytes;
  }

  /** Why this tokenizer cannot serve constrained decoding, or null when it can. */
  grammarProblem(): string | null {
    try {
      this.tokenBytes();
      return null;
    } catch (err) {
      return (err as Error).message;
    }
  }

  /** Tokens the tokenizer knows (added tokens included). */
  get vocabSize(): number {
    return this.text.vocabSize;
  }

  /** The text of `ids`, as `tokenizer.decode(ids, skip_special_tokens)` gives it. */
  decode(ids: readonly number[], skipSpecialTokens: boolean): Promise<string> {
    return new Promise((resolve, reject) => {
      this.queued[skipSpecialTokens ? 1 : 0].push({ ids: ids as number[], resolve, reject });
      if (!this.flushing) {
        this.flushing = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.flushing = false;
    for (const skip of [0, 1] as const) {
      const batch = this.queued[skip];
      if (batch.length === 0) continue;
      this.queued[skip] = [];
      this.text
        .decodeBatch(
          batch.map((p) => p.ids),
          skip === 1,
        )
        .then(
          (texts) => {
            for (let i = 0; i < batch.length; i++) (batch[i] as Pending).resolve(texts[i] ?? "");
          },
          (err: unknown) => {
            for (const p of batch) p.reject(err);
          },
        );
    }
  }
}

/** The stop string found and where it starts in the text so far. */
export interface StopMatch {
  stop: string;
  /** Its position in the text decoded so far (UTF-16 units). */
  index: number;
}

/** A stop string found token by token, with the text before it. */
export interface StopHit extends StopMatch {
  before: string;
}

const REPLACEMENT = "\uFFFD";

/**
 * The text of a growing list of output ids, one token at a time, and the first stop string
 * it contains. Incremental as in vLLM and SGLang: each step decodes only a window of the
 * last tokens (the text of the window's older part is subtracted from the whole window's),
 * so the cost per token does not grow with the output. A token that ends inside a
 * multi-byte character (the text ends in U+FFFD) is held back until the character is
 * complete, but the text before it is already checked: a request ends at the first token
 * whose decoded text contains a stop string. With no stop strings it only follows the
 * text (what a streamed answer sends).
 */
export class StopChecker {
  private readonly ids: number[] = [];
  private text = "";
  private prefixOffset = 0;
  private readOffset = 0;
  private readonly longest: number;

  constructor(
    private readonly detokenizer: Detokenizer,
    private readonly stops: readonly string[],
    private readonly skipSpecialTokens: boolean,
  ) {
    this.longest = Math.max(0, ...stops.map((s) => s.length));
  }

  /** Text committed so far (complete characters only). */
  get decoded(): string {
    return this.text;
  }

  /** Adds one token; resolves with the first stop string the text now contains, if any. */
  async push(id: number): Promise<StopHit | null> {
    this.ids.push(id);
    const skip = this.skipSpecialTokens;
    const [prefix, full] = await Promise.all([
      this.detokenizer.decode(this.ids.slice(this.prefixOffset, this.readOffset), skip),
      this.detokenizer.decode(this.ids.slice(this.prefixOffset), skip),
    ]);
    const before = this.text.length;
    let candidate = this.text;
    if (full.length > prefix.length && !full.endsWith(REPLACEMENT)) {
      this.text += full.slice(prefix.length);
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
      candidate = this.text;
    } else {
      let visible = full;
      while (visible.endsWith(REPLACEMENT)) visible = visible.slice(0, -1);
      if (visible.length > prefix.length) candidate += visible.slice(prefix.length);
    }
    const match = firstStop(candidate, this.stops, Math.max(0, before - this.longest + 1));
    return match && { ...match, before: candidate.slice(0, match.index) };
  }
}

/**
 * The stop string that starts first in `text` at or after `from` (on a tie, the one listed
 * first), or null.
 */
export function firstStop(text: string, stops: readonly string[], from = 0): StopMatch | null {
  let best: StopMatch | null = null;
  for (const stop of stops) {
    const index = text.indexOf(stop, from);
    if (index >= 0 && (best === null || index < best.index)) best = { stop, index };
  }
  return best;
}
