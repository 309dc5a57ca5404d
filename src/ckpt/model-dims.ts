/** The sizes in a Hugging Face `config.json` that checkpoint layouts depend on. */
import { readFileSync } from "node:fs";
import { InputError } from "../runtime/errors.js";

export interface ModelDims {
  modelType: string;
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  tied: boolean;
}

/** A JSON file holding an object (config.json, fsdp_config.json), with errors naming it. */
export function readConfig(path: string): Record<string, unknown> {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new InputError(`${path}: cannot read (${(e as NodeJS.ErrnoException).code ?? e})`);
  }
  let config: unknown;
  try {
    config = JSON.parse(text);
  } catch (e) {
    throw new InputError(`${path}: invalid JSON (${(e as Error).message})`);
  }
  if (!config || typeof config !== "object" || Array.isArray(config)) {
    throw new InputError(`${path}: expected a JSON object`);
  }
  return config as Record<string, unknown>;
}

export function modelDims(config: Record<string, unknown>, path: string): ModelDims {
  const int = (field: string, fallback?: number): number => {
    const v = config[field] ?? fallback;
    if (!Number.isSafeInteger(v) || (v as number) <= 0) {
      throw new InputError(
        `${path}: field "${field}" must be a positive integer (got ${JSON.stringify(config[field])})`,
      );
    }
    return v as number;
  };
  const hiddenSize = int("hidden_size");
  const heads = int("num_attention_heads");
  const kvHeads = int("num_key_value_heads", heads);
  if (heads % kvHeads !== 0) {
    throw new InputError(
      `${path}: num_attention_heads ${heads} is not a multiple of num_key_value_heads ${kvHeads}`,
    );
  }
  const headDim =
    config.head_dim === undefined || config.head_dim === null
      ? hiddenSize / heads
      : int("head_dim");
  if (!Number.isSafeInteger(headDim)) {
    throw new InputError(
      `${path}: hidden_size ${hiddenSize} is not a multiple of num_attention_heads`,
    );
  }
  return {
    modelType: String(config.model_type ?? ""),
    vocabSize: int("vocab_size"),
    hiddenSize,
    intermediateSize: int("intermediate_size"),
    layers: int("num_hidden_layers"),
    heads,
    kvHeads,
    headDim,
    tied: config.tie_word_embeddings === true,
  };
}
