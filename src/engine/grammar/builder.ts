/**
 * The grammars the native engine constrains a sequence's output with (the `grammar` field of
 * its `generate` command; native/src/engine/grammar.h reads and runs them): a graph of byte
 * literals, byte classes, sequences, choices and repetitions, over the output's UTF-8 bytes.
 * This builder writes that graph, and the pieces of JSON's own grammar (RFC 8259) that the
 * JSON Schema compiler (./json-schema.ts) and the tool-call grammar (./tool-calls.ts) share;
 * regular expressions (./regex.ts) and EBNF grammars (./ebnf.ts) are compiled with it too.
 */

/** One node of the engine's grammar (PROTOCOL.md, "Constrained decoding"). */
export type GrammarNode =
  | { lit: string }
  | { class: [number, number][]; min: number; max: number }
  | { seq: number[] }
  | { alt: number[] }
  | { rep: number; min: number; max: number };

/** What the engine's `generate` takes: the nodes and the one the output must match. */
export interface Grammar {
  start: number;
  nodes: GrammarNode[];
}

/** Unbounded, as a repetition's `max`. */
export const MANY = -1;

/**
 * Most whitespace bytes JSON may have in one place: enough for an indented document, while a
 * model cannot stall on blanks inside the JSON (xgrammar and Outlines bound it too).
 */
export const MAX_WHITESPACE = 20;

const range = (from: string, to = from): [number, number] => [from.charCodeAt(0), to.charCodeAt(0)];

export class GrammarBuilder {
  private readonly nodes: GrammarNode[] = [];
  private readonly shared = new Map<string, number>();

  add(node: GrammarNode): number {
    this.nodes.push(node);
    return this.nodes.length - 1;
  }

  lit(text: string): number {
    return this.once(`lit:${text}`, () => this.add({ lit: text }));
  }

  /** Bytes in `ranges` ([lo, hi] inclusive), between min and max of them. */
  bytes(ranges: [number, number][], min = 1, max = min): number {
    return this.add({ class: ranges, min, max });
  }

  seq(...items: number[]): number {
    const [only] = items;
    return items.length === 1 && only !== undefined ? only : this.add({ seq: items });
  }

  alt(...items: number[]): number {
    const [only] = items;
    return items.length === 1 && only !== undefined ? only : this.add({ alt: items });
  }

  /** `item` between min and max times (max MANY: no bound). */
  rep(item: number, min: number, max: number): number {
    if (max === 0) return this.lit("");
    return min === 1 && max === 1 ? item : this.add({ rep: item, min, max });
  }

  optional(item: number): number {
    return this.rep(item, 0, 1);
  }

  /** A node to be defined later (a recursive rule refers to it before it is complete). */
  reserve(): number {
    return this.add({ lit: "" });
  }

  define(slot: number, node: number): void {
    this.nodes[slot] = { seq: [node] };
  }

  /** The node made by `make`, made once per key (the JSON pieces below are shared). */
  once(key: string, make: () => number): number {
    let node = this.shared.get(key);
    if (node === undefined) {
      node = make();
      this.shared.set(key, node);
    }
    return node;
  }

  build(start: number): Grammar {
    return { start, nodes: this.nodes.map((n) => ({ ...n })) };
  }

  // ---- JSON (RFC 8259) ----

  /** Optional whitespace: space, tab, newline, carriage return. */
  ws(): number {
    return this.once("ws", () =>
      this.bytes([range("\t", "\n"), range("\r"), range(" ")], 0, MAX_WHITESPACE),
    );
  }

  /** Makes `node` the whitespace JSON's pieces use (vLLM's whitespace_pattern); before them. */
  setWhitespace(node: number): void {
    if (this.shared.has("ws"))
      throw new Error("setWhitespace after the whitespace was used (a bug)");
    this.shared.set("ws", node);
  }

  /** One character beyond ASCII: a 2-, 3- or 4-byte UTF-8 sequence. */
  nonAscii(): number {
    return this.once("non-ascii", () => {
      const cont = (n: number) => this.bytes([[0x80, 0xbf]], n);
      const two = this.seq(this.bytes([[0xc2, 0xdf]]), cont(1));
      const three = this.seq(this.bytes([[0xe0, 0xef]]), cont(2));
      const four = this.seq(this.bytes([[0xf0, 0xf4]]), cont(3));
      return this.alt(two, three, four);
    });
  }

  /** One character of a JSON string: unescaped UTF-8 (one code point) or an escape. */
  stringChar(): number {
    return this.once("char", () => {
      const ascii = this.bytes([
        [0x20, 0x21],
        [0x23, 0x5b],
        [0x5d, 0x7f],
      ]);
      const hex4 = this.bytes([range("0", "9"), range("A", "F"), range("a", "f")], 4);
      const simple = this.bytes(['"', "\\", "/", "b", "f", "n", "r", "t"].map((c) => range(c)));
      const escaped = this.seq(this.lit("\\"), this.alt(simple, this.seq(this.lit("u"), hex4)));
      return this.alt(ascii, this.nonAscii(), escaped);
    });
  }

  /** A JSON string of min to max characters (code points; an escape is one). */
  string(min = 0, max = MANY): number {
    return this.once(`string:${min}:${max}`, () => {
      const quote = this.lit('"');
      return this.seq(quote, this.rep(this.stringChar(), min, max), quote);
    });
  }

  integer(): number {
    return this.once("integer", () => {
      const digits = this.bytes([range("1", "9")]);
      const more = this.bytes([range("0", "9")], 0, MANY);
      return this.seq(
        this.optional(this.lit("-")),
        this.alt(this.lit("0"), this.seq(digits, more)),
      );
    });
  }

  number(): number {
    return this.once("number", () => {
      const digits = this.bytes([range("0", "9")], 1, MANY);
      const fraction = this.optional(this.seq(this.lit("."), digits));
      const sign = this.optional(this.bytes([range("+"), range("-")]));
      const exponent = this.optional(this.seq(this.bytes([range("E"), range("e")]), sign, digits));
      return this.seq(this.integer(), fraction, exponent);
    });
  }

  boolean(): number {
    return this.once("boolean", () => this.alt(this.lit("true"), this.lit("false")));
  }

  /**
   * `open` (ws item (ws sep ws item)* )? ws `close`, with between min and max items: a JSON
   * array's or object's body. Whitespace sits only before a token, so no two whitespace
   * runs meet (which would give the recognizer a parse per way of splitting them).
   */
  list(open: string, item: number, close: string, min = 0, max = MANY): number {
    const ws = this.ws();
    const end = this.seq(ws, this.lit(close));
    if (max === 0) return this.seq(this.lit(open), end);
    const rest = this.rep(
      this.seq(ws, this.lit(","), ws, item),
      Math.max(min - 1, 0),
      max === MANY ? MANY : max - 1,
    );
    const items = this.seq(ws, item, rest);
    return this.seq(this.lit(open), min === 0 ? this.optional(items) : items, end);
  }

  /** `"key"` ws `:` ws value. */
  member(key: number, value: number): number {
    const ws = this.ws();
    return this.seq(key, ws, this.lit(":"), ws, value);
  }

  /** Any JSON value (objects and arrays of any depth). */
  anyValue(): number {
    return this.once("any", () => {
      const value = this.reserve();
      this.shared.set("any", value); // the nested values below refer back to it
      const object = this.list("{", this.member(this.string(), value), "}");
      const array = this.list("[", value, "]");
      const nul = this.lit("null");
      this.define(
        value,
        this.alt(object, array, this.string(), this.number(), this.boolean(), nul),
      );
      return value;
    });
  }

  /** Any JSON object. */
  anyObject(): number {
    return this.once("any-object", () =>
      this.list("{", this.member(this.string(), this.anyValue()), "}"),
    );
  }
}
