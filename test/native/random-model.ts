// Seeded random Qwen2 (or, without attention biases, Llama) Hugging Face folders and padded
// batches for the native trainer's tests, in any shape. test/native/bf16_tolerance.py
// draws the very same values (its `Rng`, `random_params` and `random_batch` mirror this
// file, src/runtime/rng.ts and src/ckpt/model-shape.ts), so the tolerances it measures are
// those of the models the tests run.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type ModelShape, modelConfig, paramSpecs } from "../../src/ckpt/model-shape.js";
import { Rng } from "../../src/runtime/rng.js";
import { type NamedTensor, writeSafetensors } from "../../src/tensors/safetensors.js";

// Re-exported for the tests that import them from here (they live in src/, shared with
// the tiny world's model).
export { type ModelShape, paramSpecs };

/** Padding of one batch row: pad tokens before and after its real tokens. */
export interface RowPadding {
  left: number;
  right: number;
}

// Scales: the fixtures (make_fixtures.py) use std 0.15 at hidden size 64, i.e. a gain of
// 0.15 · sqrt(64) = 1.2 over sqrt(fan-in); keeping that gain at every size keeps the
// projections' outputs, attention scores and logits of order 1 as the fixtures' are.
// Biases have std 0.15 and RMSNorm weights are 1 + 0.1 · normal (not all ones) as there.
const GAIN = 1.2;
const BIAS_STD = 0.15;
const NORM_STD = 0.1;

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
