/**
 * The tensors a Hugging Face config.json implies, named, shaped and ordered as transformers'
 * save_pretrained writes them, and a check of converted tensors against that list.
 */
import { InputError } from "../runtime/errors.js";
import { shapeStr, type TensorEntry } from "../tensors/safetensors.js";
import { modelDims } from "./model-dims.js";

export interface ExpectedTensor {
  name: string;
  shape: number[];
}

const MODEL_TYPES = ["llama", "mistral", "qwen2", "qwen3"];

/**
 * Biases follow transformers: qwen2 always has q/k/v biases and never an o_proj bias;
 * llama, mistral and qwen3 have all four with `attention_bias`, and llama and mistral MLP
 * biases with `mlp_bias`. qwen3 adds per-head q/k norms. Every model config class defaults
 * `tie_word_embeddings` to false, so without it there is an `lm_head.weight`.
 */
export function expectedTensors(
  config: Record<string, unknown>,
  configPath: string,
): ExpectedTensor[] {
  const type = config.model_type;
  if (typeof type !== "string" || !MODEL_TYPES.includes(type)) {
    throw new InputError(
      `${configPath}: "model_type" ${JSON.stringify(type)} is not supported (supported: ${MODEL_TYPES.join(", ")})`,
    );
  }
  const flag = (field: string): boolean => {
    const value = config[field] ?? false;
    if (typeof value !== "boolean") {
      throw new InputError(
        `${configPath}: "${field}" must be true or false (got ${JSON.stringify(value)})`,
      );
    }
    return value;
  };
  // Qwen3Config defaults head_dim to 128 instead of deriving it from the hidden size.
  const dims = modelDims(type === "qwen3" ? { head_dim: 128, ...config } : config, configPath);
  const attentionBias = type !== "qwen2" && flag("attention_bias");
  const qkvBias = type === "qwen2" || attentionBias;
  const mlpBias = (type === "llama" || type === "mistral") && flag("mlp_bias");
  const tied = flag("tie_word_embeddings");

  const { hiddenSize: hidden, intermediateSize: inter, headDim } = dims;
  const q = dims.heads * headDim;
  const kv = dims.kvHeads * headDim;
  const out: ExpectedTensor[] = [
    { name: "model.embed_tokens.weight", shape: [dims.vocabSize, hidden] },
  ];
  for (let i = 0; i < dims.layers; i++) {
    const prefix = `model.layers.${i}.`;
    const add = (name: string, shape: number[]) => out.push({ name: prefix + name, shape });
    const linear = (name: string, outFeatures: number, inFeatures: number, bias: boolean) => {
      add(`${name}.weight`, [outFeatures, inFeatures]);
      if (bias) add(`${name}.bias`, [outFeatures]);
    };
    linear("self_attn.q_proj", q, hidden, qkvBias);
    linear("self_attn.k_proj", kv, hidden, qkvBias);
    linear("self_attn.v_proj", kv, hidden, qkvBias);
    linear("self_attn.o_proj", hidden, q, attentionBias);
    if (type === "qwen3") {
      add("self_attn.q_norm.weight", [headDim]);
      add("self_attn.k_norm.weight", [headDim]);
    }
    linear("mlp.gate_proj", inter, hidden, mlpBias);
    linear("mlp.up_proj", inter, hidden, mlpBias);
    linear("mlp.down_proj", hidden, inter, mlpBias);
    add("input_layernorm.weight", [hidden]);
    add("post_attention_layernorm.weight", [hidden]);
  }
  out.push({ name: "model.norm.weight", shape: [hidden] });
  if (!tied) out.push({ name: "lm_head.weight", shape: [dims.vocabSize, hidden] });
  return out;
}

/**
 * A table (header row first; render with runtime/table.ts) with one row per expected
 * tensor, in order, then one per tensor the config has no place for; `problems` counts
 * the rows whose status is not "ok".
 */
export function verifyTensors(
  expected: readonly ExpectedTensor[],
  actual: readonly TensorEntry[],
): { rows: string[][]; problems: number } {
  const byName = new Map(actual.map((t) => [t.name, t]));
  const rows = [["tensor", "shape", "dtype", "status"]];
  let problems = 0;
  const row = (name: string, shape: readonly number[], dtype: string, status: string) => {
    rows.push([name, shapeStr(shape), dtype, status]);
    if (status !== "ok") problems++;
  };
  for (const e of expected) {
    const t = byName.get(e.name);
    if (!t) {
      row(e.name, e.shape, "", "missing");
      continue;
    }
    byName.delete(e.name);
    const same = shapeStr(t.shape) === shapeStr(e.shape);
    row(
      t.name,
      t.shape,
      t.dtype,
      same ? "ok" : `shape ${shapeStr(t.shape)} ≠ expected ${shapeStr(e.shape)}`,
    );
  }
  for (const t of byName.values()) row(t.name, t.shape, t.dtype, "unexpected");
  return { rows, problems };
}
