import type { z } from "zod";
import { leafPaths, nodeAt, objectShape } from "./schema-walk.js";

export function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      cur[j] = Math.min(
        (prev[j] as number) + 1,
        (cur[j - 1] as number) + 1,
        (prev[j - 1] as number) + cost,
      );
    }
    prev = cur;
  }
  return prev[b.length] as number;
}

function nearest(word: string, candidates: string[], budget: number): string | undefined {
  let best: string | undefined;
  let bestD = Number.POSITIVE_INFINITY;
  for (const c of candidates) {
    const d = editDistance(word.toLowerCase(), c.toLowerCase());
    if (d < bestD) {
      bestD = d;
      best = c;
    }
  }
  return bestD <= budget ? best : undefined;
}

/**
 * The valid key a typo most likely meant: first a close sibling (`actor.lrr` → `actor.lr`),
 * then the same leaf name elsewhere (`lr` → `actor.lr`), then a close full path.
 */
export function suggestKey(schema: z.ZodType, parent: string[], key: string): string | undefined {
  const siblingsNode = nodeAt(schema, parent);
  const siblings = siblingsNode ? Object.keys(objectShape(siblingsNode) ?? {}) : [];
  const sibling = nearest(key, siblings, Math.max(2, Math.floor(key.length / 3)));
  if (sibling) return [...parent, sibling].join(".");
  const all = leafPaths(schema).map((p) => p.join("."));
  const sameLeaf = all.filter((p) => p.endsWith(`.${key}`) || p === key);
  if (sameLeaf.length > 0) return sameLeaf[0];
  const full = [...parent, key].join(".");
  return nearest(full, all, Math.max(2, Math.floor(full.length / 4)));
}

export function siblingKeys(schema: z.ZodType, parent: string[]): string[] {
  const node = nodeAt(schema, parent);
  return node ? Object.keys(objectShape(node) ?? {}) : [];
}
