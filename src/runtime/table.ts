/** Aligned plain-text columns (first row is the header); numbers read better right-aligned. */
export function table(rows: string[][], rightAligned: Set<number>): string[] {
  const widths = rows[0]?.map((_, c) => Math.max(...rows.map((r) => r[c]?.length ?? 0))) ?? [];
  return rows.map((r) =>
    r
      .map((cell, c) => {
        const width = widths[c] ?? 0;
        return rightAligned.has(c) ? cell.padStart(width) : cell.padEnd(width);
      })
      .join("  ")
      .trimEnd(),
  );
}
