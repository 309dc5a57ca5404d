/**
 * Character classes, escapes and quantifiers, as regular expressions (./regex.ts) and EBNF
 * grammars (./ebnf.ts) write them, read from a cursor and turned into grammar nodes
 * (./builder.ts).
 * Characters are UTF-8 code points: a class takes one whole character. Ranges stay within
 * ASCII; other characters are listed one by one, and a negated class may not list them.
 */
import { type GrammarBuilder, MANY } from "./builder.js";

/** A class: [lo, hi] ASCII ranges, non-ASCII characters listed, and whether it is negated. */
export interface CharSet {
  ranges: [number, number][];
  wide: string[];
  negated: boolean;
}

/** A position in a source text, and how a problem at it is reported. */
export class Cursor {
  constructor(
    readonly src: string,
    public i: number,
    private readonly onError: (what: string, at: number) => never,
  ) {}

  /** The character (UTF-16 unit) at the cursor; undefined at the end. */
  peek(): string | undefined {
    return this.src[this.i];
  }

  fail(what: string): never {
    return this.onError(what, this.i);
  }

  /** The code point at the cursor, taken. */
  take(): string {
    const ch = String.fromCodePoint(this.src.codePointAt(this.i) as number);
    this.i += ch.length;
    return ch;
  }
}

const DIGIT: [number, number][] = [[0x30, 0x39]];
const WORD: [number, number][] = [
  [0x30, 0x39],
  [0x41, 0x5a],
  [0x5f, 0x5f],
  [0x61, 0x7a],
];
const SPACE: [number, number][] = [
  [0x09, 0x0d],
  [0x20, 0x20],
];

/**
 * The escape at the cursor (a backslash): `\d` `\w` `\s` and their negations as a class
 * (ASCII, as Python's re.ASCII), or the character of `\n` `\t` `\r` `\f` `\v` `\0` `\xHH`
 * `\uHHHH` or of an escaped non-alphanumeric character.
 */
export function readEscape(c: Cursor): CharSet | string {
  const e = c.src[c.i + 1];
  if (e === undefined) c.fail("a trailing backslash");
  c.i += 2;
  const sets: Record<string, [number, number][]> = { d: DIGIT, w: WORD, s: SPACE };
  const lower = e.toLowerCase();
  if (lower in sets) {
    return { ranges: sets[lower] as [number, number][], wide: [], negated: e !== lower };
  }
  const simple: Record<string, string> = { n: "\n", t: "\t", r: "\r", f: "\f", v: "\v", "0": "\0" };
  if (e in simple) return simple[e] as string;
  const hex = e === "x" ? 2 : e === "u" ? 4 : 0;
  if (hex > 0) {
    const digits = c.src.slice(c.i, c.i + hex);
    if (!new RegExp(`^[0-9A-Fa-f]{${hex}}$`).test(digits)) c.fail(`\\${e} needs ${hex} hex digits`);
    c.i += hex;
    return String.fromCodePoint(Number.parseInt(digits, 16));
  }
  if (/[A-Za-z0-9]/.test(e)) {
    c.i -= 2;
    c.fail(`the escape \\${e} is not supported`);
  }
  return e;
}

/** The class at the cursor (`[`), up to and past its `]`. */
export function readClass(c: Cursor): CharSet {
  c.i++;
  const set: CharSet = { ranges: [], wide: [], negated: false };
  if (c.peek() === "^") {
    set.negated = true;
    c.i++;
  }
  let first = true;
  while (c.peek() !== "]" || first) {
    if (c.i >= c.src.length) c.fail("an unclosed class");
    first = false;
    const lo = classChar(c, set);
    if (lo === null) continue;
    if (c.peek() === "-" && c.src[c.i + 1] !== "]" && c.i + 1 < c.src.length) {
      c.i++;
      const hi = classChar(c, set);
      if (hi === null) c.fail("a range to a class escape");
      const [a, b] = [lo.codePointAt(0) as number, hi.codePointAt(0) as number];
      if (b < a) c.fail("a range the wrong way round");
      if (b > 0x7f) c.fail("a range beyond ASCII (list such characters one by one)");
      set.ranges.push([a, b]);
    } else if ((lo.codePointAt(0) as number) > 0x7f) {
      set.wide.push(lo);
    } else {
      const code = lo.codePointAt(0) as number;
      set.ranges.push([code, code]);
    }
  }
  c.i++;
  if (set.negated && set.wide.length > 0) c.fail("a negated class with a non-ASCII character");
  return set;
}

/** One character of a class (a class escape adds its ranges to `set` and gives null). */
function classChar(c: Cursor, set: CharSet): string | null {
  if (c.peek() === "\\") {
    const e = readEscape(c);
    if (typeof e === "string") return e;
    if (e.negated) c.fail("a negated class escape (\\D, \\W, \\S) inside a class");
    set.ranges.push(...e.ranges);
    return null;
  }
  return c.take();
}

/** The complement of ranges within ASCII [0, 0x7f]. */
function complement(ranges: [number, number][]): [number, number][] {
  const sorted = [...ranges].sort((a, b) => a[0] - b[0]);
  const out: [number, number][] = [];
  let next = 0;
  for (const [lo, hi] of sorted) {
    if (lo > next) out.push([next, lo - 1]);
    next = Math.max(next, hi + 1);
  }
  if (next <= 0x7f) out.push([next, 0x7f]);
  return out;
}

/** One character of `set`: its ASCII bytes or listed characters; negated, any other. */
export function charNode(g: GrammarBuilder, set: CharSet, c: Cursor): number {
  if (!set.negated) {
    const options = set.wide.map((w) => g.lit(w));
    if (set.ranges.length > 0) options.unshift(g.bytes(set.ranges));
    if (options.length === 0) c.fail("an empty class");
    return g.alt(...options);
  }
  const ascii = complement(set.ranges);
  return g.alt(...(ascii.length > 0 ? [g.bytes(ascii)] : []), g.nonAscii());
}

/**
 * The quantifier at the cursor, taken: `*`, `+`, `?`, `{m}`, `{m,}` or `{m,n}` (with blanks
 * inside the braces when `spaced`: EBNF's); null, and nothing taken, where there is none (a
 * `{` that starts no quantifier is a literal, as in Python's re).
 */
export function readQuantifier(c: Cursor, spaced: boolean): { min: number; max: number } | null {
  const q = c.peek();
  const simple: Record<string, [number, number]> = { "*": [0, MANY], "+": [1, MANY], "?": [0, 1] };
  const bounds = q === undefined ? undefined : simple[q];
  if (bounds) {
    c.i++;
    return { min: bounds[0], max: bounds[1] };
  }
  const braces = (spaced ? /^\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}/ : /^\{(\d+)(,(\d*))?\}/).exec(
    c.src.slice(c.i),
  );
  if (braces === null) return null;
  const min = Number(braces[1]);
  const max = braces[2] === undefined ? min : braces[3] === "" ? MANY : Number(braces[3]);
  if (max !== MANY && max < min) c.fail(`{${min},${max}} has its bounds the wrong way round`);
  c.i += braces[0].length;
  return { min, max };
}
