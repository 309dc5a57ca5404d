// Masked statistics over a whole batch, as verl's torch_functional defines them (masked_var,
// masked_whiten over masked_mean, src/rl/masked-mean.ts): one mean and one variance over every
// masked token of every row, not per row. PPO's GAE advantages and REINFORCE++'s returns are
// whitened with them.

import { maskedMean, maskedTotals } from "./masked-mean.js";
import { type Rows, zerosLike } from "./rows.js";

/**
 * Unbiased variance over the masked tokens, as verl's masked_var with the unbiased=True that
 * masked_whiten uses: the masked mean of the squared deviations times n/(n−1) (Bessel), which
 * is why a batch with fewer than two masked tokens is refused (verl raises on the same two
 * cases).
 */
function maskedVar(values: Rows, mask: Rows): number {
  const mean = maskedMean(values, mask);
  const squares = values.map((row) => Float64Array.from(row, (v) => (v - mean) ** 2));
  const variance = maskedMean(squares, mask);
  const { count } = maskedTotals(mask, mask);
  if (count === 0) throw new Error("masked variance: the mask has no 1 in the whole batch");
  if (count === 1) {
    throw new Error("masked variance: the mask has a single 1 in the whole batch (n−1 = 0)");
  }
  return variance * (count / (count - 1));
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
