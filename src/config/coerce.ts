import { parse as parseYaml } from "yaml";
import type { z } from "zod";
import {
  arrayElement,
  kindOf,
  objectShape,
  tupleItems,
  unionOptions,
  unwrap,
} from "./schema-walk.js";

/**
 * Turns a string from a flag, an env var or a `key=value` override into the type the
 * schema expects at that key, the way Hydra overrides are read: numbers, booleans,
 * `null`, lists `[a,b]` (or `a,b`), quoted strings. A string that cannot be coerced is
 * returned unchanged so that validation reports it with its origin.
 */
export function coerce(raw: string, schema: z.ZodType | undefined): unknown {
  const text = raw.trim();
  if (!schema) return parseLoose(text);
  const { inner, nullable } = unwrap(schema);
  if (nullable && (text === "null" || text === "~")) return null;
  const options = unionOptions(inner);
  if (options) {
    for (const option of options) {
      const value = coerce(raw, option);
      if (option.safeParse(value).success) return value;
    }
    return parseLoose(text);
  }
  switch (kindOf(inner)) {
    case "number":
    case "int":
    case "bigint":
      return parseNumber(text) ?? raw;
    case "boolean":
      return parseBoolean(text) ?? raw;
    case "array": {
      const element = arrayElement(inner);
      return splitList(text).map((item) => coerce(item, element));
    }
    case "tuple": {
      const items = tupleItems(inner) ?? [];
      return splitList(text).map((item, i) => coerce(item, items[i]));
    }
    case "object":
    case "record":
      return objectShape(inner) && text.startsWith("{") ? parseLoose(text) : raw;
    case "null":
      return text === "null" || text === "~" ? null : raw;
    default:
      return unquote(text);
  }
}

const TEXT_KINDS = new Set(["string", "enum", "literal", "template_literal"]);

/**
 * The one coercion rule, for values from every source: text (flags, env vars, overrides)
 * and values YAML has already typed. Text is read as {@link coerce} reads it; a single
 * value where the schema wants a list becomes a one-item list (`splits: test` is
 * `--splits test` is `splits=test`); a YAML number or boolean where the schema wants text
 * becomes that text (`revision: 2024`), and a YAML string where it wants a number, a
 * boolean or a list is read as that text would be on the command line. Mappings and lists
 * are walked key by key. Anything that still does not fit is left for validation to
 * report with its origin.
 */
export function coerceValue(value: unknown, schema: z.ZodType | undefined): unknown {
  if (!schema || value === null || value === undefined) return value;
  const { inner } = unwrap(schema);
  const kind = kindOf(inner);
  if (typeof value === "string") return TEXT_KINDS.has(kind) ? value : coerce(value, schema);
  if (Array.isArray(value)) {
    if (kind === "tuple") {
      const items = tupleItems(inner) ?? [];
      return value.map((item, i) => coerceValue(item, items[i]));
    }
    const element = kind === "array" ? arrayElement(inner) : undefined;
    return element ? value.map((item) => coerceValue(item, element)) : value;
  }
  if (typeof value === "object") {
    const shape = objectShape(inner);
    if (!shape) return value;
    return Object.fromEntries(
      Object.entries(value).map(([key, v]) => [key, coerceValue(v, shape[key])]),
    );
  }
  // A number or a boolean.
  if (kind === "array") return [coerceValue(value, arrayElement(inner))];
  if (kind === "string") return String(value);
  if (kind === "union") {
    const options = unionOptions(inner) ?? [];
    if (options.some((o) => o.safeParse(value).success)) return value;
    for (const option of options) {
      const v = coerceValue(value, option);
      if (option.safeParse(v).success) return v;
    }
  }
  return value;
}

function parseNumber(text: string): number | undefined {
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) return undefined;
  return Number(text);
}

function parseBoolean(text: string): boolean | undefined {
  const t = text.toLowerCase();
  if (["true", "yes", "on", "1"].includes(t)) return true;
  if (["false", "no", "off", "0"].includes(t)) return false;
  return undefined;
}

function unquote(text: string): string {
  const q = text[0];
  if (text.length >= 2 && (q === '"' || q === "'") && text.endsWith(q)) return text.slice(1, -1);
  return text;
}

/** `[a, "b,c", d]` or `a,b` → items; commas inside quotes or brackets do not split. */
export function splitList(text: string): string[] {
  let body = text;
  if (body.startsWith("[") && body.endsWith("]")) body = body.slice(1, -1);
  if (body.trim() === "") return [];
  const items: string[] = [];
  let depth = 0;
  let quote: string | undefined;
  let current = "";
  for (const ch of body) {
    if (quote) {
      if (ch === quote) quote = undefined;
    } else if (ch === '"' || ch === "'") quote = ch;
    else if (ch === "[" || ch === "{") depth++;
    else if (ch === "]" || ch === "}") depth--;
    else if (ch === "," && depth === 0) {
      items.push(current.trim());
      current = "";
      continue;
    }
    current += ch;
  }
  items.push(current.trim());
  return items;
}

/** For keys the schema does not know (they will be reported): read the text as YAML would. */
function parseLoose(text: string): unknown {
  try {
    return parseYaml(text);
  } catch {
    return text;
  }
}
