/**
 * A regular expression → the engine's grammar (./builder.ts): the whole output must match it
 * (SGLang's `regex` sampling key; Outlines and xgrammar read theirs the same way, anchored at
 * both ends). Python's `re` syntax, the subset a grammar can hold:
 * - literals and escapes (`\.` `\\` `\n` `\t` `\r` `\f` `\v` `\xHH` `\uHHHH`), `.` (any
 *   character but a newline, as `re` without DOTALL);
 * - classes `[abc]`, `[a-z]`, `[^...]` and `\d` `\w` `\s` (ASCII, as `re.ASCII`) and their
 *   negations; characters are UTF-8 code points, so a class or `.` takes one whole character;
 * - groups `( )`, `(?: )`, `(?P<name> )`, alternation `|`, quantifiers `*` `+` `?` `{m}`
 *   `{m,}` `{m,n}` (lazy ones too: the set of outputs is the same);
 * - `^` at the start and `$` at the end (the match is whole anyway).
 * Refused with a 400 naming the field and the position: backreferences, lookarounds, anchors
 * elsewhere, flags, a negated class holding a non-ASCII character, and a repeated part that
 * can match nothing (`(a*)*`: the engine refuses such a loop).
 */
import { HttpError } from "../../runtime/http-server.js";
import { type Grammar, GrammarBuilder, MANY } from "./builder.js";

const bad = (message: string) => new HttpError(400, message);
/** `{m}`, `{m,}` or `{m,n}` (another `{` is a literal, as in Python's re). */
const QUANTIFIER = /^\{(\d+)(,(\d*))?\}/;

/** A part of the expression: its node, and whether it can match nothing. */
interface Part {
  node: number;
  nullable: boolean;
}

/** [lo, hi] byte ranges (ASCII) of a class, or non-ASCII characters listed in it. */
interface CharSet {
  ranges: [number, number][];
  wide: string[];
  negated: boolean;
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

export function regexGrammar(pattern: string, field: string): Grammar {
  const g = new GrammarBuilder();
  const parser = new RegexParser(g, pattern, field);
  return g.build(parser.parse().node);
}

class RegexParser {
  private i = 0;

  constructor(
    private readonly g: GrammarBuilder,
    private readonly src: string,
    private readonly field: string,
  ) {}

  private fail(what: string): never {
    throw bad(`"${this.field}": ${what} at position ${this.i} of ${JSON.stringify(this.src)}`);
  }

  parse(): Part {
    if (this.src.startsWith("^")) this.i = 1;
    const part = this.alternation();
    if (this.src[this.i] === "$" && this.i === this.src.length - 1) this.i++;
    if (this.i < this.src.length) this.fail(`unexpected ${JSON.stringify(this.src[this.i])}`);
    return part;
  }

  private alternation(): Part {
    const options = [this.sequence()];
    while (this.src[this.i] === "|") {
      this.i++;
      options.push(this.sequence());
    }
    return {
      node: this.g.alt(...options.map((o) => o.node)),
      nullable: options.some((o) => o.nullable),
    };
  }

  private sequence(): Part {
    const parts: Part[] = [];
    while (this.i < this.src.length && !"|)".includes(this.src[this.i] as string)) {
      if (this.src[this.i] === "$" && this.i === this.src.length - 1) break;
      parts.push(this.quantified(this.atom()));
    }
    if (parts.length === 0) return { node: this.g.lit(""), nullable: true };
    return {
      node: this.g.seq(...parts.map((p) => p.node)),
      nullable: parts.every((p) => p.nullable),
    };
  }

  private quantified(atom: Part): Part {
    const c = this.src[this.i];
    let min: number;
    let max: number;
    if (c === "*") [min, max] = [0, MANY];
    else if (c === "+") [min, max] = [1, MANY];
    else if (c === "?") [min, max] = [0, 1];
    else if (c === "{" && QUANTIFIER.test(this.src.slice(this.i))) {
      const m = QUANTIFIER.exec(this.src.slice(this.i)) as RegExpExecArray;
      min = Number(m[1]);
      max = m[2] === undefined ? min : m[3] === "" ? MANY : Number(m[3]);
      if (max !== MANY && max < min)
        this.fail(`{${min},${max}} has its bounds the wrong way round`);
      this.i += m[0].length - 1;
    } else {
      return atom;
    }
    this.i++;
    if (this.src[this.i] === "?") this.i++; // lazy: the same outputs
    const next = this.src[this.i];
    if (
      next === "*" ||
      next === "+" ||
      next === "?" ||
      (next === "{" && QUANTIFIER.test(this.src.slice(this.i)))
    ) {
      this.fail("a quantifier on a quantifier (possessive quantifiers are not supported)");
    }
    if (atom.nullable && (max === MANY || max > 1)) {
      this.fail("a repeated part that can match nothing");
    }
    return { node: this.g.rep(atom.node, min, max), nullable: atom.nullable || min === 0 };
  }

  private atom(): Part {
    const c = this.src[this.i] as string;
    if (c === "(") return this.group();
    if (c === "[") return this.charClass();
    if (c === ".") {
      this.i++;
      return {
        node: this.chars({ ranges: [[0x0a, 0x0a]], wide: [], negated: true }),
        nullable: false,
      };
    }
    if (c === "\\") return this.escape();
    if ("*+?".includes(c)) this.fail(`nothing to repeat before ${JSON.stringify(c)}`);
    if (c === "^" || c === "$") this.fail(`the anchor ${c} only at the pattern's ends`);
    const ch = String.fromCodePoint(this.src.codePointAt(this.i) as number);
    this.i += ch.length;
    return { node: this.g.lit(ch), nullable: false };
  }

  private group(): Part {
    this.i++;
    if (this.src[this.i] === "?") {
      const rest = this.src.slice(this.i);
      const named = /^\?P<[A-Za-z_][A-Za-z0-9_]*>/.exec(rest);
      if (rest.startsWith("?:")) this.i += 2;
      else if (named) this.i += named[0].length;
      else this.fail("lookarounds, flags and backreferences are not supported");
    }
    const inner = this.alternation();
    if (this.src[this.i] !== ")") this.fail("an unclosed group");
    this.i++;
    return inner;
  }

  /** `\d` and the like as a class, or an escaped character. */
  private escapeSet(): CharSet | string {
    const c = this.src[this.i + 1];
    if (c === undefined) this.fail("a trailing backslash");
    this.i += 2;
    const sets: Record<string, [number, number][]> = { d: DIGIT, w: WORD, s: SPACE };
    const lower = c.toLowerCase();
    if (lower in sets) {
      return { ranges: sets[lower] as [number, number][], wide: [], negated: c !== lower };
    }
    const simple: Record<string, string> = {
      n: "\n",
      t: "\t",
      r: "\r",
      f: "\f",
      v: "\v",
      "0": "\0",
    };
    if (c in simple) return simple[c] as string;
    const hex = c === "x" ? 2 : c === "u" ? 4 : 0;
    if (hex > 0) {
      const digits = this.src.slice(this.i, this.i + hex);
      if (!new RegExp(`^[0-9A-Fa-f]{${hex}}$`).test(digits))
        this.fail(`\\${c} needs ${hex} hex digits`);
      this.i += hex;
      return String.fromCodePoint(Number.parseInt(digits, 16));
    }
    if (/[A-Za-z0-9]/.test(c)) this.fail(`the escape \\${c} is not supported`);
    return c;
  }

  private escape(): Part {
    const e = this.escapeSet();
    return { node: typeof e === "string" ? this.g.lit(e) : this.chars(e), nullable: false };
  }

  private charClass(): Part {
    this.i++;
    const set: CharSet = { ranges: [], wide: [], negated: false };
    if (this.src[this.i] === "^") {
      set.negated = true;
      this.i++;
    }
    let first = true;
    while (this.src[this.i] !== "]" || first) {
      if (this.i >= this.src.length) this.fail("an unclosed class");
      first = false;
      const lo = this.classChar(set);
      if (lo === null) continue;
      if (
        this.src[this.i] === "-" &&
        this.src[this.i + 1] !== "]" &&
        this.i + 1 < this.src.length
      ) {
        this.i++;
        const hi = this.classChar(set);
        if (hi === null) this.fail("a range to a class escape");
        const [a, b] = [lo.codePointAt(0) as number, hi.codePointAt(0) as number];
        if (b < a) this.fail("a range the wrong way round");
        if (b > 0x7f) this.fail("a range beyond ASCII (list such characters one by one)");
        set.ranges.push([a, b]);
      } else if ((lo.codePointAt(0) as number) > 0x7f) {
        set.wide.push(lo);
      } else {
        const code = lo.codePointAt(0) as number;
        set.ranges.push([code, code]);
      }
    }
    this.i++;
    if (set.negated && set.wide.length > 0) {
      this.fail("a negated class with a non-ASCII character");
    }
    return { node: this.chars(set), nullable: false };
  }

  /** One character of a class (a class escape adds its ranges to `set` and gives null). */
  private classChar(set: CharSet): string | null {
    if (this.src[this.i] === "\\") {
      const e = this.escapeSet();
      if (typeof e === "string") return e;
      if (e.negated) this.fail("a negated class escape (\\D, \\W, \\S) inside a class");
      set.ranges.push(...e.ranges);
      return null;
    }
    const ch = String.fromCodePoint(this.src.codePointAt(this.i) as number);
    this.i += ch.length;
    return ch;
  }

  /** One character of `set`: its ASCII bytes, its listed wide characters; negated, any other. */
  private chars(set: CharSet): number {
    const g = this.g;
    if (!set.negated) {
      const options = set.wide.map((w) => g.lit(w));
      if (set.ranges.length > 0) options.unshift(g.bytes(set.ranges));
      if (options.length === 0) this.fail("an empty class");
      return g.alt(...options);
    }
    const ascii = complement(set.ranges);
    return g.alt(...(ascii.length > 0 ? [g.bytes(ascii)] : []), g.nonAscii());
  }
}
