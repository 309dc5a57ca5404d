// Seeded random Qwen2 (or, without attention biases, Llama) Hugging Face folders and padded
// batches for the native trainer's tests, in any shape. test/native/bf16_tolerance.py
// draws the very same values (its `Rng`, `random_params` and `random_batch` mirror this
// file), so the tolerances it measures are those of the models the tests run.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type NamedTensor, writeSafetensors } from "../../src/tensors/safetensors.js";

export interface ModelShape {
  vocab: number;
  hidden: number;
  intermediate: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  tied: boolean;
  /** q/k/v biases: Qwen2 always has them; without them the folder is a Llama model. */
  attentionBias: boolean;
}

/** Padding of one batch row: pad tokens before and after its real tokens. */
export interface RowPadding {
  left: number;
  right: number;
}

/**
 * Counter-based mulberry32: draw k is a hash of seed + (k + 1) · 0x6d2b79f5 in 32-bit
 * integer arithmetic, which numpy reproduces bit for bit. Normals are Irwin-Hall sums of
 * 12 uniforms minus 6 (mean 0, variance 1): the sum of 12 multiples of 2^-33 is exact in a
 * double, so no transcendental function can round differently in Python.
 */
export class Rng {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  u32(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }

  /** In [0, n). */
  int(n: number): number {
    return this.u32() % n;
  }

  normal(): number {
    let sum = 0;
    for (let i = 0; i < 12; i++) sum += (this.u32() + 0.5) / 2 ** 32;
    return sum - 6;
  }
}

// Scales: the fixtures (make_fixtures.py) use std 0.15 at hidden size 64, i.e. a gain of
// 0.15 · sqrt(64) = 1.2 over sqrt(fan-in); keeping that gain at every size keeps the
// projections' outputs, attention scores and logits of order 1 as the fixtures' are.
// Biases have std 0.15 and RMSNorm weights are 1 + 0.1 · normal (not all ones) as there.
const GAIN = 1.2;
const BIAS_STD = 0.15;
const NORM_STD = 0.1;

type Kind = "matrix" | "bias" | "norm";

/** (name, shape, kind) of every parameter in Hugging Face checkpoint order (param_specs). */
export function paramSpecs(s: ModelShape): [string, number[], Kind][] {
  const q = s.heads * s.headDim;
  const kv = s.kvHeads * s.headDim;
  const specs: [string, number[], Kind][] = [
    ["model.embed_tokens.weight", [s.vocab, s.hidden], "matrix"],
  ];
  for (let i = 0; i < s.layers; i++) {
    const p = `model.layers.${i}.`;
    specs.push([`${p}input_layernorm.weight`, [s.hidden], "norm"]);
    for (const [proj, rows] of [
      ["q", q],
      ["k", kv],
      ["v", kv],
    ] as const) {
      specs.push([`${p}self_attn.${proj}_proj.weight`, [rows, s.hidden], "matrix"]);
      if (s.attentionBias) specs.push([`${p}self_attn.${proj}_proj.bias`, [rows], "bias"]);
    }
    specs.push(
      [`${p}self_attn.o_proj.weight`, [s.hidden, q], "matrix"],
      [`${p}post_attention_layernorm.weight`, [s.hidden], "norm"],
      [`${p}mlp.gate_proj.weight`, [s.intermediate, s.hidden], "matrix"],
      [`${p}mlp.up_proj.weight`, [s.intermediate, s.hidden], "matrix"],
      [`${p}mlp.down_proj.weight`, [s.hidden, s.intermediate], "matrix"],
    );
  }
  specs.push(["model.norm.weight", [s.hidden], "norm"]);
  if (!s.tied) specs.push(["lm_head.weight", [s.vocab, s.hidden], "matrix"]);
  return specs;
}

/** config.json of the model, with the fixtures' keys. */
export function modelConfig(s: ModelShape): Record<string, unknown> {
  if (s.hidden !== s.heads * s.headDim) {
    throw new Error(`hidden ${s.hidden} != heads ${s.heads} × head_dim ${s.headDim}`);
  }
  return {
    architectures: [s.attentionBias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"],
    // Qwen2 always has q/k/v biases; a Llama config says whether it has them.
    ...(s.attentionBias ? {} : { attention_bias: false }),
    attention_dropout: 0.0,
    bos_token_id: 1,
    eos_token_id: 2,
    head_dim: s.headDim,
    hidden_act: "silu",
    hidden_size: s.hidden,
    intermediate_size: s.intermediate,
    max_position_embeddings: 4096,
    model_type: s.attentionBias ? "qwen2" : "llama",
    num_attention_heads: s.heads,
    num_hidden_layers: s.layers,
    num_key_value_heads: s.kvHeads,
    rms_norm_eps: 1e-6,
    rope_theta: 10000.0,
    tie_word_embeddings: s.tied,
    torch_dtype: "float32",
    use_sliding_window: false,
    vocab_size: s.vocab,
  };
}

/** Writes `dir`/config.json and `dir`/model.safetensors (F32), seeded by `seed`. */
export async function writeRandomModel(dir: string, s: ModelShape, seed: number): Promise<void> {
  const config = modelConfig(s);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "config.json"), `${JSON.stringify(config, null, 2)}\n`);
  const rng = new Rng(seed);
  const tensors: NamedTensor[] = paramSpecs(s).map(([name, shape, kind]) => {
    const data = new Float32Array(shape.reduce((a, b) => a * b, 1));
    const std = kind === "matrix" ? GAIN / Math.sqrt(shape[1] ?? 1) : BIAS_STD;
    for (let i = 0; i < data.length; i++) {
      data[i] = kind === "norm" ? 1 + NORM_STD * rng.normal() : std * rng.normal();
    }
    return { name, dtype: "F32", shape, data };
  });
  await writeSafetensors(join(dir, "model.safetensors"), tensors, { format: "pt" });
}

/** A row's token t is predicted when it and the token before it are real (as the trainer). */
export function predicted(rows: readonly RowPadding[], T: number): boolean[] {
  return rows.flatMap(({ left, right }) =>
    Array.from({ length: T }, (_, t) => t > left && t < T - right),
  );
}

/**
 * Writes a batch file: input_ids (I64 [B, T], random real tokens, 0 at padding),
 * attention_mask (I64) from the per-row padding, and weights (F32, normal at predicted
 * tokens, 0 elsewhere) for `grad`.
 */
export async function writeRandomBatch(
  file: string,
  vocab: number,
  T: number,
  rows: readonly RowPadding[],
  seed: number,
): Promise<void> {
  const B = rows.length;
  const rng = new Rng(seed);
  const mask = rows.flatMap(({ left, right }) => {
    if (left + right > T) throw new Error(`padding ${left} + ${right} exceeds T = ${T}`);
    return Array.from({ length: T }, (_, t) => (t >= left && t < T - right ? 1n : 0n));
  });
  const ids = mask.map((m) => BigInt(rng.int(vocab)) * m);
  const pred = predicted(rows, T);
  const weights = pred.map((p) => {
    const w = rng.normal();
    return p ? w : 0;
  });
  await writeSafetensors(file, [
    { name: "input_ids", dtype: "I64", shape: [B, T], data: BigInt64Array.from(ids) },
    { name: "attention_mask", dtype: "I64", shape: [B, T], data: BigInt64Array.from(mask) },
    { name: "weights", dtype: "F32", shape: [B, T], data: Float32Array.from(weights) },
  ]);
}
