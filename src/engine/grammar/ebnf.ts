/**
 * An EBNF grammar → the engine's grammar (./builder.ts): the whole output is a sentence of
 * its rule `root` (SGLang's `ebnf` sampling key, in the GBNF-style notation xgrammar and
 * llama.cpp read):
 *
 *     root   ::= answer ("," ws answer)*
 *     answer ::= "yes" | "no" | [0-9]+
 *     ws     ::= [ \t]*
 *
 * - a rule is `name ::= expression` and runs until the next `name ::=`; `#` starts a comment;
 * - expressions: strings ("..." or '...', with the escapes below), classes (`[a-z]`, `[^"\\]`;
 *   ./char-class.ts), rule names, groups `( )`, alternation `|`, and the quantifiers `*` `+`
 *   `?` `{m}` `{m,}` `{m,n}`;
 * - escapes: `\n` `\t` `\r` `\f` `\v` `\0` `\xHH` `\uHHHH` and an escaped symbol; in classes
 *   `\d` `\w` `\s` too.
 * Rules may refer to each other in any order and recurse. Refused with a 400 naming the field
 * and the rule or position: no `root`, an undefined or twice-defined rule, a left-recursive
 * rule (`expr ::= expr "+" term`: the engine cannot expand it), and a repeated part that can
 * match nothing.
 */
import { HttpError } from "../../runtime/http-server.js";
import { type Grammar, GrammarBuilder } from "./builder.js";
import {
  type CharSet,
  Cursor,
  charNode,
  readClass,
  readEscape,
  readQuantifier,
} from "./char-class.js";

const bad = (message: string) => new HttpError(400, message);
const NAME = /^[A-Za-z_][A-Za-z0-9_.-]*/;

/** The parsed expression of a rule. */
type Expr =
  | { kind: "lit"; text: string }
  | { kind: "chars"; set: CharSet; at: number }
  | { kind: "ref"; name: string; at: number }
  | { kind: "seq" | "alt"; items: Expr[] }
  | { kind: "rep"; item: Expr; min: number; max: number; at: number };

export function ebnfGrammar(text: string, field: string): Grammar {
  const c: Cursor = new Cursor(text, 0, (what, at) => {
    throw bad(`"${field}": ${what} at position ${at}`);
  });
  const rules = new Parser(c).rules();
  if (!rules.has("root")) throw bad(`"${field}": no rule "root" (the output is a root)`);
  const nullables = checkRules(rules, field);
  const g = new GrammarBuilder();
  const slots = new Map([...rules.keys()].map((name) => [name, g.reserve()]));
  const compile = (e: Expr): number => {
    switch (e.kind) {
      case "lit":
        return g.lit(e.text);
      case "chars":
        return charNode(g, e.set, c);
      case "ref":
        return slots.get(e.name) as number;
      case "seq":
        return e.items.length === 0 ? g.lit("") : g.seq(...e.items.map(compile));
      case "alt":
        return g.alt(...e.items.map(compile));
      case "rep":
        // A part that can match nothing, at most once, is that part (checkRules refused more).
        return e.max === 1 && nullables.has(e)
          ? compile(e.item)
          : g.rep(compile(e.item), e.min, e.max);
    }
  };
  for (const [name, expr] of rules) g.define(slots.get(name) as number, compile(expr));
  return g.build(slots.get("root") as number);
}

class Parser {
  constructor(private readonly c: Cursor) {}

  /** Skips blanks and comments; true at a rule's start (`name ::=`) or the end. */
  private skip(): boolean {
    const c: Cursor = this.c;
    for (;;) {
      while (/\s/.test(c.peek() ?? "")) c.i++;
      if (c.peek() !== "#") break;
      while (c.peek() !== undefined && c.peek() !== "\n") c.i++;
    }
    if (c.peek() === undefined) return true;
    const name = NAME.exec(c.src.slice(c.i));
    return name !== null && /^\s*::=/.test(c.src.slice(c.i + name[0].length));
  }

  rules(): Map<string, Expr> {
    const c: Cursor = this.c;
    const out = new Map<string, Expr>();
    this.skip();
    while (c.peek() !== undefined) {
      const name = NAME.exec(c.src.slice(c.i));
      if (name === null) c.fail("expected a rule name");
      if (out.has(name[0])) c.fail(`the rule "${name[0]}" is defined twice`);
      c.i += name[0].length;
      while (/\s/.test(c.peek() ?? "")) c.i++;
      if (!c.src.startsWith("::=", c.i)) c.fail(`expected "::=" after "${name[0]}"`);
      c.i += 3;
      out.set(name[0], this.alternation());
      if (!this.skip()) c.fail(`unexpected ${JSON.stringify(c.peek())}`);
    }
    return out;
  }

  private alternation(): Expr {
    const items = [this.sequence()];
    for (;;) {
      this.skip();
      if (this.c.peek() !== "|") break;
      this.c.i++;
      items.push(this.sequence());
    }
    return items.length === 1 ? (items[0] as Expr) : { kind: "alt", items };
  }

  private sequence(): Expr {
    const items: Expr[] = [];
    while (!this.skip() && this.c.peek() !== "|" && this.c.peek() !== ")")
      items.push(this.quantified());
    return items.length === 1 ? (items[0] as Expr) : { kind: "seq", items };
  }

  private quantified(): Expr {
    const item = this.atom();
    const at = this.c.i;
    const q = readQuantifier(this.c, true);
    return q === null ? item : { kind: "rep", item, min: q.min, max: q.max, at };
  }

  private atom(): Expr {
    const c: Cursor = this.c;
    const at = c.i;
    if (c.peek() === "(") {
      c.i++;
      const inner = this.alternation();
      this.skip();
      if (c.peek() !== ")") c.fail("an unclosed group");
      c.i++;
      return inner;
    }
    if (c.peek() === "[") return { kind: "chars", set: readClass(c), at };
    if (c.peek() === '"' || c.peek() === "'") return { kind: "lit", text: this.string() };
    const name = NAME.exec(c.src.slice(c.i));
    if (name === null) c.fail(`unexpected ${JSON.stringify(c.peek())}`);
    c.i += name[0].length;
    return { kind: "ref", name: name[0], at };
  }

  private string(): string {
    const c: Cursor = this.c;
    const quote = c.take();
    let text = "";
    while (c.peek() !== quote) {
      if (c.peek() === undefined || c.peek() === "\n") c.fail("an unclosed string");
      if (c.peek() === "\\") {
        const e = readEscape(c);
        if (typeof e !== "string") c.fail("a class escape in a string (use a class: [0-9])");
        text += e;
      } else {
        text += c.take();
      }
    }
    c.i++;
    return text;
  }
}

/**
 * What the engine cannot expand, named by rule: references to undefined rules, a rule that
 * reaches itself before any character (left recursion), a repeated part that can match
 * nothing. Returns the repetitions (`?`) of parts that can match nothing, which compile to
 * the part itself.
 */
function checkRules(rules: Map<string, Expr>, field: string): Set<Expr> {
  const walk = (e: Expr, f: (e: Expr) => void): void => {
    f(e);
    if (e.kind === "seq" || e.kind === "alt") for (const x of e.items) walk(x, f);
    if (e.kind === "rep") walk(e.item, f);
  };
  for (const [name, expr] of rules) {
    walk(expr, (e) => {
      if (e.kind === "ref" && !rules.has(e.name)) {
        throw bad(`"${field}": the rule "${name}" refers to "${e.name}", which is not defined`);
      }
    });
  }
  // Which rules can match nothing (a fixpoint).
  const empty = new Set<string>();
  const nullable = (e: Expr): boolean => {
    switch (e.kind) {
      case "lit":
        return e.text === "";
      case "chars":
        return false;
      case "ref":
        return empty.has(e.name);
      case "seq":
        return e.items.every(nullable);
      case "alt":
        return e.items.some(nullable);
      case "rep":
        return e.min === 0 || nullable(e.item);
    }
  };
  for (let changed = true; changed; ) {
    changed = false;
    for (const [name, expr] of rules) {
      if (!empty.has(name) && nullable(expr)) {
        empty.add(name);
        changed = true;
      }
    }
  }
  const optionalEmpty = new Set<Expr>();
  for (const [name, expr] of rules) {
    walk(expr, (e) => {
      if (e.kind !== "rep" || !nullable(e.item)) return;
      if (e.max !== 1) {
        throw bad(
          `"${field}": in the rule "${name}", a repeated part can match nothing (position ${e.at})`,
        );
      }
      optionalEmpty.add(e);
    });
  }
  // The rules each rule can start with, before any character.
  const first = (e: Expr, out: Set<string>): void => {
    if (e.kind === "ref") out.add(e.name);
    else if (e.kind === "alt") for (const x of e.items) first(x, out);
    else if (e.kind === "rep") first(e.item, out);
    else if (e.kind === "seq") {
      for (const x of e.items) {
        first(x, out);
        if (!nullable(x)) break;
      }
    }
  };
  const starts = new Map([...rules.keys()].map((name) => [name, new Set<string>()]));
  for (const [name, expr] of rules) first(expr, starts.get(name) as Set<string>);
  for (const name of rules.keys()) {
    const seen = new Set<string>();
    const stack = [...(starts.get(name) as Set<string>)];
    while (stack.length > 0) {
      const next = stack.pop() as string;
      if (next === name) {
        throw bad(
          `"${field}": the rule "${name}" is left-recursive (it can start with itself), which the engine cannot expand: rewrite it with a repetition`,
        );
      }
      if (seen.has(next)) continue;
      seen.add(next);
      stack.push(...(starts.get(next) as Set<string>));
    }
  }
  return optionalEmpty;
}
