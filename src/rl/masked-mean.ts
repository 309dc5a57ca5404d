// The masked mean of verl's torch_functional (verl/utils/torch_functional.py, masked_mean;
// volcengine/verl main, 2026-01): (values * mask).sum() / (mask.sum() + 1e-8), one mean over
// every masked token of every row. The 1e-8 makes a batch (or a row) without a token give 0,
// not NaN, as it does in verl; the verl of Search-R1 divided by mask.sum() alone, a relative
// difference of about 1e-8 / n. Positions whose mask is 0 are skipped, so whatever they hold
// (even NaN) stays out of the sum.

import { checkRows, type Rows } from "./rows.js";

/** Σ values·mask and Σ mask over the batch. */
export function maskedTotals(values: Rows, mask: Rows): { sum: number; count: number } {
  checkRows("values", values, mask, "mask");
  let sum = 0;
  let count = 0;
  for (let b = 0; b < values.length; b++) {
    const v = values[b] as ArrayLike<number>;
    const m = mask[b] as ArrayLike<number>;
    for (let t = 0; t < v.length; t++) {
      if (m[t] === 0) continue;
      sum += (v[t] as number) * (m[t] as number);
      count += m[t] as number;
    }
  }
  return { sum, count };
}

/** Σ values·mask / (Σ mask + 1e-8) over the whole batch. */
export function maskedMean(values: Rows, mask: Rows): number {
  const { sum, count } = maskedTotals(values, mask);
  return sum / (count + 1e-8);
}
