/**
 * The dotted keys whose values differ between two resolved configs (plain JSON objects),
 * sorted, with both values: how node 0 tells a node started with another config what differs.
 * Keys in `skip` (what must differ: the node's rank) are left out.
 */
export function configDiff(
  a: unknown,
  b: unknown,
  skip: ReadonlySet<string>,
): { key: string; a: unknown; b: unknown }[] {
  const out: { key: string; a: unknown; b: unknown }[] = [];
  const walk = (x: unknown, y: unknown, path: string) => {
    if (skip.has(path)) return;
    if (isObject(x) && isObject(y)) {
      for (const k of [...new Set([...Object.keys(x), ...Object.keys(y)])].sort())
        walk(x[k], y[k], path ? `${path}.${k}` : k);
      return;
    }
    if (JSON.stringify(x) !== JSON.stringify(y)) out.push({ key: path, a: x, b: y });
  };
  walk(a, b, "");
  return out;
}

function isObject(x: unknown): x is Record<string, unknown> {
  return typeof x === "object" && x !== null && !Array.isArray(x);
}
