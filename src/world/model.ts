/**
 * The tiny Qwen2 model of the quickstart, initialised as transformers initialises a new
 * Qwen2ForCausalLM (every linear and embedding weight normal with std initializer_range
 * 0.02, biases 0, RMSNorm weights 1), written as a Hugging Face folder in float32.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type ModelShape, modelConfig, paramSpecs } from "../ckpt/model-shape.js";
import { Rng } from "../runtime/rng.js";
import { type NamedTensor, writeSafetensors } from "../tensors/safetensors.js";
import type { TokenIds } from "./tokenizer.js";

export interface TinyModelOptions {
  hidden: number;
  layers: number;
  heads: number;
  kvHeads: number;
  intermediate: number;
  maxPositions: number;
  /** lm_head shares the embedding matrix (as Qwen2.5 0.5B does). */
  tied: boolean;
}

/** Sized for a few minutes of SFT and RL on two CPU cores (about 1M parameters). */
export const DEFAULT_MODEL: TinyModelOptions = {
  hidden: 128,
  layers: 4,
  heads: 4,
  kvHeads: 2,
  intermediate: 384,
  maxPositions: 1024,
  tied: true,
};

const INITIALIZER_RANGE = 0.02;

export function tinyModelShape(options: TinyModelOptions, vocab: number): ModelShape {
  const { hidden, heads, kvHeads } = options;
  for (const [key, value] of Object.entries(options)) {
    if (key !== "tied" && !(Number.isInteger(value) && (value as number) > 0)) {
      throw new RangeError(`world model ${key}: expected a positive integer, got ${value}`);
    }
  }
  if (hidden % heads !== 0 || heads % kvHeads !== 0 || (hidden / heads) % 2 !== 0) {
    throw new RangeError(
      `world model: hidden ${hidden}, heads ${heads}, kvHeads ${kvHeads} need heads | hidden, ` +
        "kvHeads | heads and an even head size",
    );
  }
  return {
    vocab,
    hidden,
    intermediate: options.intermediate,
    layers: options.layers,
    heads,
    kvHeads,
    headDim: hidden / heads,
    tied: options.tied,
    attentionBias: true,
  };
}

/** Parameters of the model, embeddings counted once when tied. */
export function parameterCount(shape: ModelShape): number {
  return paramSpecs(shape).reduce((n, [, dims]) => n + dims.reduce((a, b) => a * b, 1), 0);
}

/** Writes config.json, generation_config.json and model.safetensors into `dir`. */
export async function writeTinyModel(
  dir: string,
  options: TinyModelOptions,
  ids: TokenIds,
  seed: number,
): Promise<ModelShape> {
  const shape = tinyModelShape(options, ids.vocabSize);
  const config = modelConfig(shape, {
    bos_token_id: ids.endOfText,
    eos_token_id: ids.imEnd,
    initializer_range: INITIALIZER_RANGE,
    max_position_embeddings: options.maxPositions,
  });
  await writeFile(join(dir, "config.json"), `${JSON.stringify(config, null, 2)}\n`);
  // Qwen2.5's: generation stops at <|im_end|> or <|endoftext|>.
  const generation = {
    bos_token_id: ids.endOfText,
    eos_token_id: [ids.imEnd, ids.endOfText],
    pad_token_id: ids.endOfText,
  };
  await writeFile(join(dir, "generation_config.json"), `${JSON.stringify(generation, null, 2)}\n`);
  const rng = new Rng(seed);
  const tensors: NamedTensor[] = paramSpecs(shape).map(([name, dims, kind]) => {
    const data = new Float32Array(dims.reduce((a, b) => a * b, 1));
    if (kind === "norm") data.fill(1);
    if (kind === "matrix")
      for (let i = 0; i < data.length; i++) data[i] = INITIALIZER_RANGE * rng.normal();
    return { name, dtype: "F32", shape: dims, data };
  });
  await writeSafetensors(join(dir, "model.safetensors"), tensors, { format: "pt" });
  return shape;
}
