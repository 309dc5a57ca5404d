/**
 * A second recognizer for the engine's grammars (src/engine/grammar/builder.ts's nodes),
 * written differently from the native one (native/src/engine/grammar.cpp: a set of parse
 * stacks fed byte by byte): here, the set of positions where each node can end when it
 * starts at a position, memoised. The tests check compiled grammars with it, and the
 * engine's outputs against the grammar they were asked for.
 */
import type { Grammar } from "../../src/engine/grammar/builder.js";

export function grammarMatches(grammar: Grammar, text: string | Buffer): boolean {
  const bytes = typeof text === "string" ? Buffer.from(text) : text;
  const memo = new Map<string, Set<number>>();

  const ends = (id: number, pos: number): Set<number> => {
    const key = `${id}:${pos}`;
    const known = memo.get(key);
    if (known) return known;
    const out = new Set<number>();
    memo.set(key, out); // a node met again at the same place adds nothing (no left recursion)
    const node = grammar.nodes[id];
    if (node === undefined) throw new Error(`no node ${id}`);
    if ("lit" in node) {
      const lit = Buffer.from(node.lit);
      if (bytes.subarray(pos, pos + lit.length).equals(lit)) out.add(pos + lit.length);
    } else if ("class" in node) {
      const inClass = (b: number | undefined) =>
        b !== undefined && node.class.some(([lo, hi]) => b >= lo && b <= hi);
      for (let n = 0; n <= (node.max === -1 ? bytes.length : node.max); n++) {
        if (n >= node.min) out.add(pos + n);
        if (!inClass(bytes[pos + n])) break;
      }
    } else if ("seq" in node) {
      let at = new Set([pos]);
      for (const item of node.seq) {
        const next = new Set<number>();
        for (const p of at) for (const e of ends(item, p)) next.add(e);
        at = next;
      }
      for (const p of at) out.add(p);
    } else if ("alt" in node) {
      for (const item of node.alt) for (const e of ends(item, pos)) out.add(e);
    } else {
      // Counts past the minimum: a position already reached adds nothing new (the repeated
      // node always takes a byte, so positions grow and this ends).
      let at = new Set([pos]);
      for (let n = 0; at.size > 0; n++) {
        if (n >= node.min) for (const p of at) out.add(p);
        if (n === node.max) break;
        const next = new Set<number>();
        for (const p of at) for (const e of ends(node.rep, p)) next.add(e);
        at = n + 1 >= node.min ? new Set([...next].filter((p) => !out.has(p))) : next;
      }
    }
    return out;
  };
  return ends(grammar.start, 0).has(bytes.length);
}
