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
import { Cursor, charNode, readClass, readEscape, readQuantifier } from "./char-class.js";

const bad = (message: string) => new HttpError(400, message);

/** A part of the expression: its node, and whether it can match nothing. */
interface Part {
  node: number;
  nullable: boolean;
}

export function regexGrammar(pattern: string, field: string): Grammar {
  const g = new GrammarBuilder();
  return g.build(regexNode(g, pattern, field));
}

/** The node of `g` that matches `pattern` whole. */
export function regexNode(g: GrammarBuilder, pattern: string, field: string): number {
  return new RegexParser(g, pattern, field).parse().node;
}

class RegexParser {
  private readonly c: Cursor;

  constructor(
    private readonly g: GrammarBuilder,
    src: string,
    field: string,
  ) {
    this.c = new Cursor(src, 0, (what, at) => {
      throw bad(`"${field}": ${what} at position ${at} of ${JSON.stringify(src)}`);
    });
  }

  private fail(what: string): never {
    return this.c.fail(what);
  }

  parse(): Part {
    if (this.c.src.startsWith("^")) this.c.i = 1;
    const part = this.alternation();
    if (this.c.src[this.c.i] === "$" && this.c.i === this.c.src.length - 1) this.c.i++;
    if (this.c.i < this.c.src.length)
      this.fail(`unexpected ${JSON.stringify(this.c.src[this.c.i])}`);
    return part;
  }

  private alternation(): Part {
    const options = [this.sequence()];
    while (this.c.src[this.c.i] === "|") {
      this.c.i++;
      options.push(this.sequence());
    }
    return {
      node: this.g.alt(...options.map((o) => o.node)),
      nullable: options.some((o) => o.nullable),
    };
  }

  private sequence(): Part {
    const parts: Part[] = [];
    while (this.c.i < this.c.src.length && !"|)".includes(this.c.src[this.c.i] as string)) {
      if (this.c.src[this.c.i] === "$" && this.c.i === this.c.src.length - 1) break;
      parts.push(this.quantified(this.atom()));
    }
    if (parts.length === 0) return { node: this.g.lit(""), nullable: true };
    return {
      node: this.g.seq(...parts.map((p) => p.node)),
      nullable: parts.every((p) => p.nullable),
    };
  }

  private quantified(atom: Part): Part {
    const q = readQuantifier(this.c, false);
    if (q === null) return atom;
    const { min, max } = q;
    if (this.c.peek() === "?") this.c.i++; // lazy: the same outputs
    const at = this.c.i;
    if (readQuantifier(this.c, false) !== null) {
      this.c.i = at;
      this.fail("a quantifier on a quantifier (possessive quantifiers are not supported)");
    }
    if (atom.nullable && (max === MANY || max > 1)) {
      this.fail("a repeated part that can match nothing");
    }
    if (atom.nullable && max === 1) return atom; // (a?)? is a? (the engine refuses the loop)
    return { node: this.g.rep(atom.node, min, max), nullable: atom.nullable || min === 0 };
  }

  private atom(): Part {
    const c = this.c.src[this.c.i] as string;
    if (c === "(") return this.group();
    if (c === "[") return { node: charNode(this.g, readClass(this.c), this.c), nullable: false };
    if (c === ".") {
      this.c.i++;
      const notNewline = { ranges: [[0x0a, 0x0a]] as [number, number][], wide: [], negated: true };
      return { node: charNode(this.g, notNewline, this.c), nullable: false };
    }
    if (c === "\\") return this.escape();
    if ("*+?".includes(c)) this.fail(`nothing to repeat before ${JSON.stringify(c)}`);
    if (c === "^" || c === "$") this.fail(`the anchor ${c} only at the pattern's ends`);
    return { node: this.g.lit(this.c.take()), nullable: false };
  }

  private group(): Part {
    this.c.i++;
    if (this.c.src[this.c.i] === "?") {
      const rest = this.c.src.slice(this.c.i);
      const named = /^\?P<[A-Za-z_][A-Za-z0-9_]*>/.exec(rest);
      if (rest.startsWith("?:")) this.c.i += 2;
      else if (named) this.c.i += named[0].length;
      else this.fail("lookarounds, flags and backreferences are not supported");
    }
    const inner = this.alternation();
    if (this.c.src[this.c.i] !== ")") this.fail("an unclosed group");
    this.c.i++;
    return inner;
  }

  private escape(): Part {
    const e = readEscape(this.c);
    return {
      node: typeof e === "string" ? this.g.lit(e) : charNode(this.g, e, this.c),
      nullable: false,
    };
  }
}
