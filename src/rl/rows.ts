// The data layout of every function in src/rl/.
//
// A batch is [B][T_b]: one row per trajectory, one value per response token (position t of a
// row is response token t; the prompt is not included). Rows are anything array-like of
// numbers (number[], Float32Array, Float64Array, Uint8Array for masks) and may differ in
// length: the controller passes each trajectory's own response, so there is no padding to
// carry, yet padded rows work too (their padding has mask 0). All the rows of one trajectory
// (rewards, values, masks, log-probs) have the same length. Masks are 0/1; a position whose
// mask is 0 is ignored whatever the other rows hold there. Everything is computed in float64
// and returned as Float64Array rows; outputs are 0 where the mask that shaped them is 0.

export type Row = ArrayLike<number>;
export type Rows = readonly Row[];

/** Throws unless `rows` has one row per trajectory of `like`, each of the same length. */
export function checkRows(name: string, rows: Rows, like: Rows, likeName: string): void {
  if (rows.length !== like.length) {
    throw new Error(`${name}: ${rows.length} rows, but ${likeName} has ${like.length}`);
  }
  for (let b = 0; b < rows.length; b++) {
    const n = (rows[b] as Row).length;
    const m = (like[b] as Row).length;
    if (n !== m) throw new Error(`${name}[${b}]: ${n} tokens, but ${likeName}[${b}] has ${m}`);
  }
}

/** Float64Array rows shaped like `like`, filled with 0. */
export function zerosLike(like: Rows): Float64Array[] {
  return like.map((row) => new Float64Array(row.length));
}

/** Index of the last position whose mask is 1, or -1 when the row has none. */
export function lastMaskedIndex(mask: Row): number {
  for (let t = mask.length - 1; t >= 0; t--) if (mask[t] !== 0) return t;
  return -1;
}
