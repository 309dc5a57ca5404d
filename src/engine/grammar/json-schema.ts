/**
 * JSON Schema → the engine's grammar (./builder.ts): the output is then a JSON document the
 * schema accepts. The subset is what structured-output clients send (OpenAI's strict
 * schemas, function parameters, pydantic's model_json_schema): `type` (one or a list),
 * `enum`, `const`, `properties`/`required`/`additionalProperties`, `items`/`minItems`/
 * `maxItems`, `minLength`/`maxLength`, `anyOf`/`oneOf`, `allOf` of one schema, `nullable`,
 * and `$ref` to `#`, `#/$defs/…` or `#/definitions/…` (recursive ones too).
 *
 * As xgrammar does by default (its strict mode), an object with `properties` is written with
 * those properties only, in the schema's order, required ones always and optional ones when
 * the model chooses; `oneOf` is read as `anyOf`. Every document the grammar allows is valid;
 * not every valid document is allowed (another property order, say). A keyword that would
 * constrain values beyond this (`pattern`, `format`, `minimum`, `uniqueItems`, …) is refused
 * with a 400 naming it and where it is, never ignored; annotations (`title`, `description`,
 * `default`, `examples`, …) are ignored.
 */
import { HttpError, typeOf } from "../../runtime/http-server.js";
import { type Grammar, GrammarBuilder, MANY } from "./builder.js";
import { regexNode } from "./regex.js";

type Schema = Record<string, unknown>;

/** Keywords that say nothing about which values are valid. */
const ANNOTATIONS = new Set([
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$comment",
  "deprecated",
  "readOnly",
  "writeOnly",
  "$defs",
  "definitions",
  "strict",
]);

const KEYWORDS = new Set([
  "type",
  "enum",
  "const",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "anyOf",
  "oneOf",
  "allOf",
  "nullable",
  "$ref",
]);

const TYPES = ["string", "number", "integer", "boolean", "null", "object", "array"];

const bad = (message: string) => new HttpError(400, message);
const isObject = (v: unknown): v is Schema =>
  v !== null && typeof v === "object" && !Array.isArray(v);

/**
 * Compiles `schema` into a grammar; `field` names it in errors
 * (`response_format.json_schema.schema`). A string is the schema's JSON text (SGLang's
 * `json_schema`, vLLM's `guided_json` take either).
 */
export function jsonSchemaGrammar(
  schema: unknown,
  field: string,
  whitespace?: Whitespace,
): Grammar {
  if (typeof schema === "string") {
    let parsed: unknown;
    try {
      parsed = JSON.parse(schema);
    } catch (err) {
      throw bad(`"${field}" is not JSON (${(err as Error).message})`);
    }
    return jsonSchemaGrammar(parsed, field, whitespace);
  }
  const g = jsonBuilder(whitespace);
  return g.build(new SchemaCompiler(g, schema, field).compile(schema, field));
}

/** A regular expression for the whitespace between JSON's tokens (vLLM's whitespace_pattern). */
export interface Whitespace {
  pattern: string;
  field: string;
}

/** A builder whose JSON whitespace is `whitespace`'s, or JSON's own (bounded) by default. */
export function jsonBuilder(whitespace?: Whitespace): GrammarBuilder {
  const g = new GrammarBuilder();
  if (whitespace) g.setWhitespace(regexNode(g, whitespace.pattern, whitespace.field));
  return g;
}

/** Compiles schemas into nodes of `g`, resolving `$ref`s against `root`. */
export class SchemaCompiler {
  private readonly refs = new Map<string, number>();

  constructor(
    private readonly g: GrammarBuilder,
    private readonly root: unknown,
    private readonly rootField: string,
  ) {}

  compile(schema: unknown, at: string): number {
    const g = this.g;
    if (schema === true) return g.anyValue();
    if (schema === false) throw bad(`"${at}" is false: no value is valid`);
    if (!isObject(schema)) {
      throw bad(`"${at}" must be a JSON Schema object, got ${typeOf(schema)}`);
    }
    for (const key of Object.keys(schema)) {
      if (!KEYWORDS.has(key) && !ANNOTATIONS.has(key)) {
        throw bad(
          `"${at}.${key}": the JSON Schema keyword "${key}" is not supported by constrained ` +
            `decoding (supported: ${[...KEYWORDS].join(", ")})`,
        );
      }
    }
    const node = this.compileValue(schema, at);
    return schema.nullable === true ? g.alt(node, g.lit("null")) : node;
  }

  private compileValue(s: Schema, at: string): number {
    const g = this.g;
    if (s.$ref !== undefined) return this.ref(s, at);
    if (s.const !== undefined) return g.lit(JSON.stringify(s.const));
    if (s.enum !== undefined) {
      if (!Array.isArray(s.enum) || s.enum.length === 0) {
        throw bad(`"${at}.enum" must be a non-empty list of values`);
      }
      return g.alt(...s.enum.map((v) => g.lit(JSON.stringify(v))));
    }
    for (const key of ["anyOf", "oneOf"] as const) {
      if (s[key] === undefined) continue;
      const list = s[key];
      if (!Array.isArray(list) || list.length === 0) {
        throw bad(`"${at}.${key}" must be a non-empty list of schemas`);
      }
      this.alone(s, key, at);
      return g.alt(...list.map((sub, i) => this.compile(sub, `${at}.${key}[${i}]`)));
    }
    if (s.allOf !== undefined) {
      if (!Array.isArray(s.allOf) || s.allOf.length !== 1) {
        throw bad(`"${at}.allOf": only a list of one schema is supported (no merging of schemas)`);
      }
      this.alone(s, "allOf", at);
      return this.compile(s.allOf[0], `${at}.allOf[0]`);
    }
    const types = this.types(s, at);
    return g.alt(...types.map((t) => this.typed(t, s, at)));
  }

  /** `anyOf` and the like may sit beside annotations only. */
  private alone(s: Schema, key: string, at: string): void {
    const other = Object.keys(s).find((k) => k !== key && k !== "nullable" && !ANNOTATIONS.has(k));
    if (other !== undefined) {
      throw bad(
        `"${at}": "${key}" beside "${other}" is not supported: move "${other}" into each schema of "${key}"`,
      );
    }
  }

  private types(s: Schema, at: string): string[] {
    if (s.type === undefined) {
      if (s.properties !== undefined || s.additionalProperties !== undefined) return ["object"];
      if (s.items !== undefined) return ["array"];
      if (s.minLength !== undefined || s.maxLength !== undefined) return ["string"];
      return ["any"];
    }
    const list = Array.isArray(s.type) ? s.type : [s.type];
    if (list.length === 0) throw bad(`"${at}.type" must name at least one type`);
    for (const t of list) {
      if (typeof t !== "string" || !TYPES.includes(t)) {
        throw bad(
          `"${at}.type" must be one of ${TYPES.join(", ")} (or a list of them), got ${JSON.stringify(t)}`,
        );
      }
    }
    return list as string[];
  }

  private typed(type: string, s: Schema, at: string): number {
    const g = this.g;
    switch (type) {
      case "any":
        return g.anyValue();
      case "string":
        return g.string(this.count(s, "minLength", 0, at), this.count(s, "maxLength", MANY, at));
      case "integer":
        return g.integer();
      case "number":
        return g.number();
      case "boolean":
        return g.boolean();
      case "null":
        return g.lit("null");
      case "array": {
        const item = s.items === undefined ? g.anyValue() : this.compile(s.items, `${at}.items`);
        const min = this.count(s, "minItems", 0, at);
        const max = this.count(s, "maxItems", MANY, at);
        if (max !== MANY && max < min) throw bad(`"${at}.maxItems" is below "minItems"`);
        return g.list("[", item, "]", min, max);
      }
      default:
        return this.object(s, at);
    }
  }

  private count(s: Schema, key: string, fallback: number, at: string): number {
    const v = s[key];
    if (v === undefined) return fallback;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
      throw bad(`"${at}.${key}" must be a non-negative integer, got ${typeOf(v)}`);
    }
    return v;
  }

  private object(s: Schema, at: string): number {
    const g = this.g;
    const required = s.required ?? [];
    if (!Array.isArray(required) || !required.every((r) => typeof r === "string")) {
      throw bad(`"${at}.required" must be a list of property names`);
    }
    if (s.properties === undefined) {
      if (required.length > 0) {
        throw bad(
          `"${at}.required" names properties, but "${at}" has no "properties" to write them from`,
        );
      }
      const extra = s.additionalProperties;
      if (extra === false) return g.list("{", g.anyValue(), "}", 0, 0);
      const value =
        extra === undefined || extra === true
          ? g.anyValue()
          : this.compile(extra, `${at}.additionalProperties`);
      return g.list("{", g.member(g.string(), value), "}");
    }
    if (!isObject(s.properties)) throw bad(`"${at}.properties" must be an object of schemas`);
    const names = Object.keys(s.properties);
    for (const r of required) {
      if (!names.includes(r))
        throw bad(`"${at}.required" names "${r}", which is not in "properties"`);
    }
    const properties = names.map((name) => ({
      name,
      required: required.includes(name),
      member: g.member(
        g.lit(JSON.stringify(name)),
        this.compile((s.properties as Schema)[name], `${at}.properties.${name}`),
      ),
    }));
    const ws = g.ws();
    const comma = g.seq(ws, g.lit(","), ws);
    // rest(i, after): properties i.. in order, each optional one there or not; `after`: one
    // was written before, so the next is preceded by a comma.
    const memo = new Map<string, number>();
    const rest = (i: number, after: boolean): number => {
      const property = properties[i];
      if (property === undefined) return g.lit("");
      const key = `${i}:${after}`;
      const known = memo.get(key);
      if (known !== undefined) return known;
      const write = g.seq(after ? comma : ws, property.member, rest(i + 1, true));
      const node = property.required ? write : g.alt(write, rest(i + 1, after));
      memo.set(key, node);
      return node;
    };
    return g.seq(g.lit("{"), rest(0, false), ws, g.lit("}"));
  }

  private ref(s: Schema, at: string): number {
    const ref = s.$ref;
    if (typeof ref !== "string") throw bad(`"${at}.$ref" must be a string`);
    this.alone(s, "$ref", at);
    const known = this.refs.get(ref);
    if (known !== undefined) return known;
    const match = /^#(?:\/(\$defs|definitions)\/([^/]+))?$/.exec(ref) as
      | [string, string | undefined, string]
      | null;
    if (match === null) {
      throw bad(
        `"${at}.$ref" = ${JSON.stringify(ref)}: only "#", "#/$defs/NAME" and "#/definitions/NAME" are supported`,
      );
    }
    let target: unknown = this.root;
    let field = this.rootField;
    if (match[1] !== undefined) {
      const defs = isObject(this.root) ? this.root[match[1]] : undefined;
      const name = decodeURIComponent(match[2]).replaceAll("~1", "/").replaceAll("~0", "~");
      target = isObject(defs) ? defs[name] : undefined;
      field = `${this.rootField}.${match[1]}.${name}`;
      if (target === undefined)
        throw bad(`"${at}.$ref" = ${JSON.stringify(ref)}: "${field}" does not exist`);
    }
    const slot = this.g.reserve();
    this.refs.set(ref, slot); // a schema that refers to itself finds the slot
    this.g.define(slot, this.compile(target, field));
    return slot;
  }
}
