import type { z } from "zod";

/**
 * Read-only views of a zod schema: the node at a dotted path, the keys of an object,
 * defaults and type names. The config layer needs them to coerce strings from flags,
 * env vars and overrides, to suggest keys for typos and to print help.
 */

type AnyDef = { type: string; [k: string]: unknown };
const def = (s: z.ZodType): AnyDef => (s as unknown as { _zod: { def: AnyDef } })._zod.def;

const WRAPPERS = new Set(["optional", "nullable", "default", "prefault", "readonly", "catch"]);

/** The schema without optional/nullable/default wrappers, and whether null is accepted. */
export function unwrap(schema: z.ZodType): { inner: z.ZodType; nullable: boolean } {
  let s = schema;
  let nullable = false;
  for (;;) {
    const d = def(s);
    if (d.type === "nullable") nullable = true;
    if (WRAPPERS.has(d.type)) s = d.innerType as z.ZodType;
    // z.preprocess(fn, T) is a pipe from a transform to T: T is what the key takes (zod's
    // JSON Schema reads it the same way); any other pipe is described by its input.
    else if (d.type === "pipe")
      s = (def(d.in as z.ZodType).type === "transform" ? d.out : d.in) as z.ZodType;
    else return { inner: s, nullable };
  }
}

export function kindOf(schema: z.ZodType): string {
  return def(unwrap(schema).inner).type;
}

export function objectShape(schema: z.ZodType): Record<string, z.ZodType> | undefined {
  const { inner } = unwrap(schema);
  const d = def(inner);
  return d.type === "object" ? (d.shape as Record<string, z.ZodType>) : undefined;
}

export function arrayElement(schema: z.ZodType): z.ZodType | undefined {
  const d = def(unwrap(schema).inner);
  return d.type === "array" ? (d.element as z.ZodType) : undefined;
}

/** The item schemas of a tuple (`actor.betas`), in order. */
export function tupleItems(schema: z.ZodType): z.ZodType[] | undefined {
  const d = def(unwrap(schema).inner);
  return d.type === "tuple" ? (d.items as z.ZodType[]) : undefined;
}

export function unionOptions(schema: z.ZodType): z.ZodType[] | undefined {
  const d = def(unwrap(schema).inner);
  return d.type === "union" ? (d.options as z.ZodType[]) : undefined;
}

export function enumValues(schema: z.ZodType): string[] | undefined {
  const d = def(unwrap(schema).inner);
  if (d.type === "enum") return Object.values(d.entries as Record<string, string>);
  if (d.type === "literal") return (d.values as unknown[]).map(String);
  return undefined;
}

/** The schema node at a dotted key path, or undefined when no such key exists. */
export function nodeAt(schema: z.ZodType, path: readonly string[]): z.ZodType | undefined {
  let node: z.ZodType | undefined = schema;
  for (const key of path) {
    const shape: Record<string, z.ZodType> | undefined = node ? objectShape(node) : undefined;
    node = shape?.[key];
    if (!node) return undefined;
  }
  return node;
}

/** Every leaf key path of the schema (objects are descended, everything else is a leaf). */
export function leafPaths(schema: z.ZodType, prefix: string[] = []): string[][] {
  const shape = objectShape(schema);
  if (!shape) return [prefix];
  return Object.entries(shape).flatMap(([k, v]) => leafPaths(v, [...prefix, k]));
}

/** The default value the schema gives the key at `path` when nothing sets it. */
export function defaultAt(schema: z.ZodType, path: readonly string[]): unknown {
  const node = nodeAt(schema, path);
  if (!node) return undefined;
  const r = node.safeParse(undefined);
  return r.success ? r.data : undefined;
}

export function describeOf(schema: z.ZodType): string | undefined {
  return (schema as { description?: string }).description ?? unwrap(schema).inner.description;
}

/** A short human name for the expected type: "number", "one of grpo|ppo", "list of string". */
export function typeName(schema: z.ZodType): string {
  const { inner, nullable } = unwrap(schema);
  const values = enumValues(inner);
  const d = def(inner);
  let name: string;
  if (values) name = `one of ${values.join("|")}`;
  else if (d.type === "array") name = `list of ${typeName(d.element as z.ZodType)}`;
  else if (d.type === "union") name = (d.options as z.ZodType[]).map(typeName).join(" or ");
  else if (d.type === "object") name = "mapping";
  else if (d.type === "int" || (d.type === "number" && isInt(inner))) name = "integer";
  else name = d.type;
  return nullable ? `${name} or null` : name;
}

function isInt(schema: z.ZodType): boolean {
  const checks = (def(schema).checks as { _zod?: { def?: { format?: string } } }[]) ?? [];
  return checks.some((c) => c._zod?.def?.format === "safeint" || c._zod?.def?.format === "int32");
}
