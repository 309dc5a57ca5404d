import { join } from "node:path";
import type { ServiceError } from "../../runtime/errors.js";
import { InputError } from "../../runtime/errors.js";
import { loadEncoderTokenizer } from "../../text/encoder-tokenizer.js";
import type { TextTokenizer } from "../../text/tokenizer.js";
import { readJsonObject, readTokenizerConfig } from "../../text/tokenizer-config.js";
import { checkEncoderFolder, IndexProcess, type RerankerInfo } from "../dense/index-process.js";

export interface CrossEncoderOptions {
  /** The cross-encoder's Hugging Face folder (BertForSequenceClassification, one label). */
  model: string;
  device: "auto" | "cpu" | "cuda";
  /** CPU threads; null: all cores. */
  threads: number | null;
  /** Pairs per call of the native model (Search-R1's --reranker_batch_size). */
  batchSize: number;
}

/** What sentence-transformers' CrossEncoder applies to the logit (its `activation_fn`). */
export type Activation = "identity" | "sigmoid";

/** The torch classes config.json may name, as sentence-transformers imports them. */
const ACTIVATIONS: Record<string, Activation> = {
  "torch.nn.modules.linear.Identity": "identity",
  "torch.nn.Identity": "identity",
  "torch.nn.modules.activation.Sigmoid": "sigmoid",
  "torch.nn.Sigmoid": "sigmoid",
};

/**
 * A BERT cross-encoder scoring (query, passage) pairs as sentence-transformers'
 * `CrossEncoder(model).predict(pairs)` does, the model Search-R1's rerank servers load
 * (cross-encoder/ms-marco-MiniLM-L12-v2): the model's own tokenizer encodes each pair as
 * `[CLS] query [SEP] passage [SEP]` (token types 0 then 1), cut 'longest_first' to
 * max_length = min(tokenizer_config's model_max_length, max_position_embeddings) as
 * sentence-transformers' models/Transformer.py sets max_seq_length; the native model
 * (searchr1-index serve --reranker: BertForSequenceClassification) gives the logit, and the
 * activation config.json names is applied (`activation`).
 */
export class CrossEncoder {
  private constructor(
    private readonly process: IndexProcess,
    private readonly tokenizer: TextTokenizer,
    readonly model: string,
    readonly maxLength: number,
    readonly activation: Activation,
    private readonly info: RerankerInfo,
    private readonly batchSize: number,
  ) {}

  static async open(options: CrossEncoderOptions): Promise<CrossEncoder> {
    await checkEncoderFolder(options.model);
    const activation = activationOf(options.model);
    const process = await IndexProcess.start({
      reranker: options.model,
      device: options.device,
      threads: options.threads,
    });
    try {
      const info = process.info.reranker;
      if (info === undefined) throw new Error("searchr1-index serve loaded no reranker");
      const maxLength = Math.min(modelMaxLength(options.model), info.max_position_embeddings);
      const tokenizer = loadEncoderTokenizer(options.model, {
        maxLength,
        missing: "a reranker needs its tokenizer.json, or a BERT vocab.txt (--reranker)",
      });
      return new CrossEncoder(
        process,
        tokenizer,
        options.model,
        maxLength,
        activation,
        info,
        options.batchSize,
      );
    } catch (err) {
      await process.shutdown();
      throw err;
    }
  }

  /** The score of each (query, passage) pair, in order. */
  async score(pairs: readonly (readonly [string, string])[]): Promise<number[]> {
    const scores: number[] = [];
    for (let from = 0; from < pairs.length; from += this.batchSize) {
      const encoded = await this.tokenizer.encodePairBatch(
        pairs.slice(from, from + this.batchSize),
      );
      const logits = await this.process.rerank(
        encoded.map((e) => e.ids),
        encoded.map((e) => e.typeIds),
      );
      for (const x of logits)
        scores.push(this.activation === "sigmoid" ? 1 / (1 + Math.exp(-x)) : x);
    }
    return scores;
  }

  /** Told if the native process dies while serving. */
  onDeath(listener: (err: ServiceError) => void): void {
    this.process.onDeath(listener);
  }

  /** Facts for `GET /health`. */
  describe(): Record<string, unknown> {
    return {
      model: this.model,
      ...this.info,
      max_length: this.maxLength,
      activation: this.activation,
      batch_size: this.batchSize,
    };
  }

  close(): Promise<void> {
    return this.process.shutdown();
  }
}

/**
 * sentence-transformers' CrossEncoder.get_default_activation_fn: config.json's
 * `sentence_transformers.activation_fn`, else (before v4) `sbert_ce_default_activation_function`,
 * else Sigmoid for one label. A class other than Identity or Sigmoid is refused.
 */
export function activationOf(dir: string): Activation {
  const path = join(dir, "config.json");
  const config = readJsonObject(path);
  const st = config.sentence_transformers as Record<string, unknown> | undefined;
  const named = st?.activation_fn ?? config.sbert_ce_default_activation_function ?? null;
  if (named === null) return "sigmoid";
  const activation = typeof named === "string" ? ACTIVATIONS[named] : undefined;
  if (activation === undefined) {
    throw new InputError(
      `${path}: the activation ${JSON.stringify(named)} is not supported (${Object.keys(ACTIVATIONS).join(", ")})`,
    );
  }
  return activation;
}

/**
 * tokenizer_config.json's model_max_length; unbounded when absent (transformers'
 * VERY_LARGE_INTEGER), so that max_position_embeddings decides.
 */
function modelMaxLength(dir: string): number {
  const value = readTokenizerConfig(dir).settings.model_max_length;
  return typeof value === "number" && value >= 1 ? Math.floor(value) : Number.POSITIVE_INFINITY;
}
