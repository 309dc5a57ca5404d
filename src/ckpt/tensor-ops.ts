/** The byte-level tensor operations merging shards needs: concatenation and row selection. */

/**
 * Concatenates row-major tensors along `dim`; all parts agree on every other dimension.
 * Returns the bytes and the merged shape.
 */
export function concat(
  parts: readonly { bytes: Buffer; shape: readonly number[] }[],
  dim: number,
  elementSize: number,
): { bytes: Buffer; shape: number[] } {
  const first = parts[0];
  if (!first) throw new Error("concat of no tensors");
  if (parts.length === 1) return { bytes: first.bytes, shape: [...first.shape] };
  const shape = [...first.shape];
  shape[dim] = parts.reduce((a, p) => a + (p.shape[dim] as number), 0);
  const outer = first.shape.slice(0, dim).reduce((a, b) => a * b, 1);
  const innerElems = first.shape.slice(dim + 1).reduce((a, b) => a * b, 1);
  const out = Buffer.allocUnsafe(outer * (shape[dim] as number) * innerElems * elementSize);
  let o = 0;
  for (let i = 0; i < outer; i++) {
    for (const p of parts) {
      const slab = (p.shape[dim] as number) * innerElems * elementSize;
      p.bytes.copy(out, o, i * slab, (i + 1) * slab);
      o += slab;
    }
  }
  return { bytes: out, shape };
}

/** Rows [start, start + count) of dim 0, for each range in order, as one tensor. */
export function takeRows(
  bytes: Buffer,
  rowBytes: number,
  ranges: readonly { start: number; count: number }[],
): Buffer {
  const out = Buffer.allocUnsafe(ranges.reduce((a, r) => a + r.count, 0) * rowBytes);
  let o = 0;
  for (const r of ranges) {
    o += bytes.copy(out, o, r.start * rowBytes, (r.start + r.count) * rowBytes);
  }
  return out;
}
