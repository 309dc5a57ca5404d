// Masked statistics over a whole batch, as verl's torch_functional defines them (masked_mean,
// masked_var, masked_whiten): one mean and one variance over every masked token of every row,
// not per row. PPO's GAE advantages and REINFORCE++'s returns are whitened with them.

import { checkRows, type Rows, zerosLike } from "./rows.js";

/** Σ v·m / Σ m over all tokens of the batch. */
export function maskedMean(values: Rows, mask: Rows): number {
  checkRows("values", values, mask, "mask");
  let sum = 0;
  let count = 0;
  for (let b = 0; b < values.length; b++) {
    const v = values[b] as ArrayLike<number>;
    const m = mask[b] as ArrayLike<number>;
    for (let t = 0; t < v.length; t++) {
      if (m[t] === 0) continue;
      sum += v[t] as number;
      count++;
    }
  }
  return sum / count;
}

/**
 * Variance over the masked tokens. verl's masked_whiten calls masked_var with its default
 * unbiased=True: the mean square deviation times n/(n−1) (Bessel), which is why a batch with
 * fewer than two masked tokens is refused (verl raises on the same two cases).
 */
export function maskedVar(values: Rows, mask: Rows, unbiased = true): number {
  const mean = maskedMean(values, mask);
  let sq = 0;
  let count = 0;
  for (let b = 0; b < values.length; b++) {
    const v = values[b] as ArrayLike<number>;
    const m = mask[b] as ArrayLike<number>;
    for (let t = 0; t < v.length; t++) {
      if (m[t] === 0) continue;
      const d = (v[t] as number) - mean;
      sq += d * d;
      count++;
    }
  }
  if (!unbiased) return sq / count;
  if (count === 0) throw new Error("masked variance: the mask has no 1 in the whole batch");
  if (count === 1) {
    throw new Error("masked variance: the mask has a single 1 in the whole batch (n−1 = 0)");
  }
  return sq / (count - 1);
}

/**
 * (v − mean) / sqrt(var + 1e-8) with the batch's masked mean and unbiased variance (verl:
 * rsqrt(var + 1e-8)). Positions outside the mask are 0 (verl whitens them too; every consumer
 * masks them, so 0 changes nothing downstream and keeps stray values out of the tensors).
 */
export function maskedWhiten(values: Rows, mask: Rows): Float64Array[] {
  const mean = maskedMean(values, mask);
  const scale = 1 / Math.sqrt(maskedVar(values, mask) + 1e-8);
  const out = zerosLike(values);
  for (let b = 0; b < values.length; b++) {
    const v = values[b] as ArrayLike<number>;
    const m = mask[b] as ArrayLike<number>;
    const o = out[b] as Float64Array;
    for (let t = 0; t < v.length; t++) if (m[t] !== 0) o[t] = ((v[t] as number) - mean) * scale;
  }
  return out;
}
