// The trainer's batch layout and ours. The controller keeps one row per trajectory over its
// response tokens only (src/rl/rows.ts); the trainer reads [B, T] tensors over whole
// sequences (native/src/model/batch.h). Row i of a batch file is the prompt, then the
// response, then right padding:
//
//   input_ids       I32 [B, T]  promptIds ++ responseIds ++ 0…
//   attention_mask  U8  [B, T]  1 on those tokens, 0 on the padding
//
// Per-token tensors are F32 [B, T] aligned as the trainer's log-probs: position t is about
// token t given the tokens before it, so response token j of row i sits at t = P_i + j
// (P_i = promptIds.length), and every other position holds 0. The trainer's `values` use the
// same alignment: position P_i + j holds V(state before response token j), which is what
// src/rl/gae.ts calls the value of step j. Token 0 of a row is never predicted, so a row
// needs at least one prompt token.

import {
  type NamedTensor,
  readSafetensors,
  shapeStr,
  type Tensor,
  toFloat32,
  writeSafetensors,
} from "../tensors/safetensors.js";

/** One sequence of a batch: the prompt, then the response (generated and observation tokens). */
export interface Sequence {
  promptIds: readonly number[];
  responseIds: readonly number[];
}

/** One value per response token, row i as long as sequence i's response. */
export type TokenRows = readonly ArrayLike<number>[];

/** The per-token tensors the trainer reads from a batch file (SERVE.md). */
export type TokenTensor =
  | "response_mask"
  | "old_log_probs"
  | "ref_log_probs"
  | "advantages"
  | "values"
  | "returns"
  | "rollout_is_weights";

/** Where each row's response starts, and the batch's shape. */
export interface Layout {
  B: number;
  T: number;
  /** P_i: the position of response token 0 of row i. */
  starts: number[];
}

export function layoutOf(sequences: readonly Sequence[]): Layout {
  if (sequences.length === 0) throw new Error("a trainer batch needs at least one sequence");
  let T = 1;
  const starts = sequences.map((s, i) => {
    if (s.promptIds.length === 0) {
      throw new Error(
        `sequence ${i} has no prompt token: its first response token has no log-prob`,
      );
    }
    T = Math.max(T, s.promptIds.length + s.responseIds.length);
    return s.promptIds.length;
  });
  return { B: sequences.length, T, starts };
}

/** The tensors of a batch file: input_ids, attention_mask and the given per-token rows. */
export function batchTensors(
  sequences: readonly Sequence[],
  rows: Partial<Record<TokenTensor, TokenRows>> = {},
): NamedTensor[] {
  const { B, T, starts } = layoutOf(sequences);
  const ids = new Int32Array(B * T);
  const attention = new Uint8Array(B * T);
  sequences.forEach((s, i) => {
    ids.set(s.promptIds, i * T);
    ids.set(s.responseIds, i * T + (starts[i] as number));
    attention.fill(1, i * T, i * T + s.promptIds.length + s.responseIds.length);
  });
  const tensors: NamedTensor[] = [
    { name: "input_ids", dtype: "I32", shape: [B, T], data: ids },
    { name: "attention_mask", dtype: "U8", shape: [B, T], data: attention },
  ];
  for (const [name, values] of Object.entries(rows) as [TokenTensor, TokenRows][]) {
    if (values === undefined) continue;
    if (values.length !== B) throw new Error(`${name}: ${values.length} rows for ${B} sequences`);
    const data = new Float32Array(B * T);
    sequences.forEach((s, i) => {
      const row = values[i] as ArrayLike<number>;
      if (row.length !== s.responseIds.length) {
        throw new Error(
          `${name}[${i}]: ${row.length} values for ${s.responseIds.length} response tokens`,
        );
      }
      data.set(row, i * T + (starts[i] as number));
    });
    tensors.push({ name, dtype: "F32", shape: [B, T], data });
  }
  return tensors;
}

/** Writes a batch file for the trainer (see batchTensors). */
export async function writeBatch(
  path: string,
  sequences: readonly Sequence[],
  rows: Partial<Record<TokenTensor, TokenRows>> = {},
): Promise<void> {
  await writeSafetensors(path, batchTensors(sequences, rows));
}

/** The response positions of a trainer output [B, T] as one Float32Array per sequence. */
export function responseRows(
  name: string,
  tensor: Tensor,
  sequences: readonly Sequence[],
): Float32Array[] {
  const { B, T, starts } = layoutOf(sequences);
  const [b, t] = tensor.shape;
  if (tensor.shape.length !== 2 || b !== B || t !== T) {
    throw new Error(`${name}: shape ${shapeStr(tensor.shape)}, expected ${shapeStr([B, T])}`);
  }
  const data = toFloat32(tensor);
  return sequences.map((s, i) => {
    const start = i * T + (starts[i] as number);
    return data.slice(start, start + s.responseIds.length);
  });
}

/** Reads the named [B, T] tensors of a trainer output file as response-aligned rows. */
export async function readResponseRows<N extends string>(
  path: string,
  sequences: readonly Sequence[],
  names: readonly N[],
): Promise<Record<N, Float32Array[]>> {
  const tensors = await readSafetensors(path);
  const out = {} as Record<N, Float32Array[]>;
  for (const name of names) {
    const tensor = tensors.get(name);
    if (!tensor) throw new Error(`${path}: the trainer wrote no '${name}'`);
    out[name] = responseRows(`${path}: ${name}`, tensor, sequences);
  }
  return out;
}
