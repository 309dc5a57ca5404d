/**
 * The SFT data file `searchr1-trainer sft --data` reads (native/src/model/batch.h): right-
 * padded `input_ids` [B, T] (I64), `attention_mask` [B, T] (I64, 1 on real tokens) and
 * `loss_mask` [B, T] (F32; at position t it selects token t as a target, so 1 on the
 * tokens the model generated, 0 on prompt, observations and padding).
 */
import { writeSafetensors } from "../tensors/safetensors.js";

export interface SftRow {
  ids: readonly number[];
  lossMask: readonly number[];
}

/** Writes the rows, padded with `padId` to the longest; returns that length (T). */
export async function writeSftFile(
  path: string,
  rows: readonly SftRow[],
  padId: number,
  maxPositions: number,
): Promise<number> {
  if (rows.length === 0) throw new Error("no SFT rows to write");
  const T = Math.max(...rows.map((r) => r.ids.length));
  if (T > maxPositions) {
    throw new Error(`an SFT row has ${T} tokens, more than the model's ${maxPositions} positions`);
  }
  const B = rows.length;
  const ids = new BigInt64Array(B * T).fill(BigInt(padId));
  const attention = new BigInt64Array(B * T);
  const loss = new Float32Array(B * T);
  rows.forEach((row, b) => {
    if (row.lossMask.length !== row.ids.length) {
      throw new Error(`SFT row ${b}: ${row.ids.length} ids but ${row.lossMask.length} mask values`);
    }
    row.ids.forEach((id, t) => {
      ids[b * T + t] = BigInt(id);
      attention[b * T + t] = 1n;
      loss[b * T + t] = row.lossMask[t] as number;
    });
  });
  await writeSafetensors(path, [
    { name: "input_ids", dtype: "I64", shape: [B, T], data: ids },
    { name: "attention_mask", dtype: "I64", shape: [B, T], data: attention },
    { name: "loss_mask", dtype: "F32", shape: [B, T], data: loss },
  ]);
  return T;
}
