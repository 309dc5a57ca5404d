import { z } from "zod";
import { UsageError } from "../runtime/errors.js";
import { coerce, coerceValue } from "./coerce.js";
import {
  emptyLayer,
  formatOrigin,
  getPath,
  isPlainObject,
  type Layer,
  mergeValues,
  type Origin,
  originOf,
  setValue,
} from "./layers.js";
import { leafPaths, nodeAt, objectShape, typeName } from "./schema-walk.js";
import { siblingKeys, suggestKey } from "./suggest.js";
import {
  translateLayer,
  type VerlDialect,
  verlDefaultsLayer,
  verlEnvWarnings,
} from "./verl-layers.js";
import { loadConfigFile } from "./yaml-file.js";

/** What the config layer knows about one command. */
export interface CommandConfigSpec<S extends z.ZodType = z.ZodType> {
  command: string;
  schema: S;
  /** Documented environment variables → the dotted key each one sets. */
  env: Record<string, string>;
  /**
   * Keys accepted only so that verl/Search-R1 config files load: dotted key → why it has no
   * effect here. Setting one warns; test/config/key-reads.test.ts checks that every other
   * key is read by the command.
   */
  compat?: Record<string, string>;
  /** Present: verl's and Search-R1's key names are read too (verl-keys.ts). */
  verl?: VerlDialect;
}

/** A value given on the command line, before coercion. */
export interface CliValue {
  key: string;
  value: unknown;
  origin: Origin;
}

export interface ResolveInput {
  configFile?: string;
  /** Flags and positional arguments, in the order given. */
  cli?: CliValue[];
  /** Trailing `key.path=value` arguments. */
  overrides?: string[];
  env?: Record<string, string | undefined>;
  /** key → flag that sets it, to tell the user how to fix a missing key. */
  flagNames?: Record<string, string>;
  /** Where the warnings go (a verl key with no effect here); none: dropped. */
  warn?: (line: string) => void;
}

const OVERRIDE_RE = /^\+{0,2}([A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*)=([\s\S]*)$/;

export function isOverride(arg: string): boolean {
  return OVERRIDE_RE.test(arg);
}

/**
 * Resolves a command's config from its sources, lowest to highest: schema defaults <
 * YAML file (with extends) < env vars < CLI flags < `key=value` overrides. Strings are
 * coerced by the schema; every problem is reported with the key, its origin and what was
 * expected, all at once.
 */
export function resolveConfig<S extends z.ZodType>(
  spec: CommandConfigSpec<S>,
  input: ResolveInput = {},
): z.infer<S> {
  const layers = buildLayers(spec, input);
  const merged = mergeValues(layers);
  const result = spec.schema.safeParse(merged);
  if (result.success) return result.data;
  throw issuesError(spec, layers, merged, result.error.issues, input);
}

/** A config resolved as far as it goes: the required keys that nothing sets are null. */
export interface ConfigDraft {
  values: Record<string, unknown>;
  /** The required keys no source sets, as key paths (null in `values`). */
  missing: string[][];
}

/**
 * Resolves a config for display (`searchr1 config <command>`): like resolveConfig, but a
 * required key that no source sets is not an error; it is null in the result and listed
 * in `missing`. Any other problem (a typo, a wrong type) is the same error as for the run.
 */
export function resolveConfigDraft(spec: CommandConfigSpec, input: ResolveInput = {}): ConfigDraft {
  const layers = buildLayers(spec, input);
  const merged = mergeValues(layers);
  const result = spec.schema.safeParse(merged);
  if (result.success) return { values: result.data as Record<string, unknown>, missing: [] };
  const missing = result.error.issues.map((issue) => missingKeys(spec, merged, issue));
  if (missing.some((m) => m === undefined)) {
    throw issuesError(spec, layers, merged, result.error.issues, input);
  }
  return {
    values: draftValues(spec.schema, merged) as Record<string, unknown>,
    missing: missing.flatMap((m) => m ?? []),
  };
}

/** Each key resolved by its own schema node; a key that cannot be is null. */
function draftValues(schema: z.ZodType, value: unknown): unknown {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const shape = objectShape(schema);
  if (!shape || !(value === undefined || isPlainObject(value))) return null;
  return Object.fromEntries(
    Object.entries(shape).map(([key, node]) => [key, draftValues(node, value?.[key])]),
  );
}

function issuesError(
  spec: CommandConfigSpec,
  layers: Layer[],
  merged: Record<string, unknown>,
  issues: z.core.$ZodIssue[],
  input: ResolveInput,
): UsageError {
  const lines = issues.flatMap((issue) =>
    describeIssue(spec, layers, merged, issue, input.flagNames ?? {}),
  );
  return new UsageError(lines.join("\n"));
}

/** How to set a required key: its flag (or argument) when it has one, then the key itself. */
export function howToSet(dotted: string, flagNames: Record<string, string>): string {
  return [flagNames[dotted], `"${dotted}:" in --config FILE`, `${dotted}=...`]
    .filter(Boolean)
    .join(", ");
}

/**
 * The required keys an issue is about when it says that nothing set them (a missing
 * section counts as its required keys); undefined when the issue is about something else.
 */
function missingKeys(
  spec: CommandConfigSpec,
  merged: Record<string, unknown>,
  issue: z.core.$ZodIssue,
): string[][] | undefined {
  if (issue.code !== "invalid_type" && issue.code !== "invalid_value") return undefined; // enums say the latter
  if (issue.path.some((p) => typeof p !== "string")) return undefined;
  const path = issue.path as string[];
  const node = nodeAt(spec.schema, path);
  if (!node || getPath(merged, path) !== undefined) return undefined;
  return leafPaths(node, path).filter((p) => !nodeAt(spec.schema, p)?.safeParse(undefined).success);
}

function buildLayers(spec: CommandConfigSpec, input: ResolveInput): Layer[] {
  const files = input.configFile ? loadConfigFile(input.configFile) : [];
  const overrides = emptyLayer();
  for (const text of input.overrides ?? []) {
    const m = OVERRIDE_RE.exec(text);
    if (!m) throw new UsageError(`override "${text}": expected key.path=value`);
    setValue(overrides, (m[1] as string).split("."), m[2] as string, { kind: "override", text });
  }
  const { layers: named, defaults } = inOwnNames(spec, [...files, overrides], input);
  // One coercion rule for every source: YAML values and override text are read by the schema
  // as flags are.
  const coerced = (layer: Layer): Layer => ({
    ...layer,
    values: coerceValue(layer.values, spec.schema) as Record<string, unknown>,
  });
  const fileLayers = named.slice(0, files.length).map(coerced);
  const overrideLayer = coercedText(named[files.length] as Layer, spec.schema);
  const coerceAt = (key: string[], raw: unknown) =>
    typeof raw === "string"
      ? coerce(raw, nodeAt(spec.schema, key))
      : coerceValue(raw, nodeAt(spec.schema, key));

  const env = emptyLayer();
  for (const [name, key] of Object.entries(spec.env)) {
    const raw = input.env?.[name];
    if (raw === undefined || raw === "") continue;
    const path = key.split(".");
    setValue(env, path, coerceAt(path, raw), { kind: "env", name });
  }
  const cli = emptyLayer();
  for (const { key, value, origin } of input.cli ?? []) {
    const path = key.split(".");
    setValue(cli, path, coerceAt(path, value), origin);
  }
  return [...(defaults ? [coerced(defaults)] : []), ...fileLayers, env, cli, overrideLayer];
}

/** Override text read by the schema at its key, as a flag's is; typed values are kept. */
function coercedText(layer: Layer, schema: z.ZodType): Layer {
  const out = emptyLayer();
  for (const [dotted, origin] of layer.origins) {
    const path = dotted.split(".");
    const raw = getPath(layer.values, path);
    if (raw === undefined) continue;
    const node = nodeAt(schema, path);
    setValue(
      out,
      path,
      typeof raw === "string" ? coerce(raw, node) : coerceValue(raw, node),
      origin,
    );
  }
  return out;
}

/**
 * The layers in this command's key names (verl-layers.ts) when it reads verl's, with the
 * Search-R1 defaults to put under them when any of verl's names was used.
 */
function inOwnNames(
  spec: CommandConfigSpec,
  layers: Layer[],
  input: ResolveInput,
): { layers: Layer[]; defaults: Layer | null } {
  if (!spec.verl) return { layers, defaults: null };
  const warned = new Set<string>();
  // Once per key, though a script may give one twice.
  const warn = (line: string, key: string) => {
    if (warned.has(key)) return;
    warned.add(key);
    input.warn?.(line);
  };
  for (const line of verlEnvWarnings(input.env ?? {})) input.warn?.(line);
  const dialect = spec.verl;
  const translated = layers.map((l) => translateLayer(spec.schema, dialect, l, warn));
  const named = translated.map((t) => t.layer);
  const usedVerl = translated.some((t) => t.usedVerl);
  return { layers: named, defaults: usedVerl ? verlDefaultsLayer(spec.schema, named) : null };
}

function displayKey(path: readonly PropertyKey[]): string {
  return path
    .map((p, i) => (typeof p === "number" ? `[${p}]` : `${i > 0 ? "." : ""}${String(p)}`))
    .join("");
}

function describeIssue(
  spec: CommandConfigSpec,
  layers: Layer[],
  merged: Record<string, unknown>,
  issue: z.core.$ZodIssue,
  flagNames: Record<string, string>,
): string[] {
  // Numeric path parts are list indices: origins and schema nodes live at the list's key.
  const stop = issue.path.findIndex((p) => typeof p !== "string");
  const ownerPath = (stop < 0 ? issue.path : issue.path.slice(0, stop)) as string[];
  if (issue.code === "unrecognized_keys") {
    return issue.keys.map((key) => {
      const full = [...ownerPath, key];
      const origin = formatOrigin(originOf(layers, full));
      const suggestion = suggestKey(spec.schema, ownerPath, key);
      const hint = suggestion
        ? `did you mean "${suggestion}"?`
        : `valid keys${ownerPath.length ? ` under "${ownerPath.join(".")}"` : ""}: ${siblingKeys(spec.schema, ownerPath).join(", ")}`;
      return `unknown key "${full.join(".")}" (${origin}); ${hint}`;
    });
  }
  const key = displayKey(issue.path) || "(config)";
  const value = getPath(merged, issue.path);
  const node = nodeAt(spec.schema, ownerPath);
  const required = missingKeys(spec, merged, issue);
  if (required) {
    // A missing section is reported as its required keys, which is what the user must set.
    return required.map((p) => {
      const dotted = p.join(".");
      return `missing required key "${dotted}": expected ${typeName(nodeAt(spec.schema, p) as z.ZodType)} (set it with ${howToSet(dotted, flagNames)})`;
    });
  }
  const origin = formatOrigin(originOf(layers, ownerPath));
  let expected: string;
  if (issue.code === "invalid_type")
    expected = `expected ${node && stop < 0 ? typeName(node) : issue.expected}`;
  else if (issue.code === "invalid_value")
    expected = `expected one of ${issue.values.map(String).join("|")}`;
  else expected = issue.message.replace(/^Too (small|big): /, "").replace(/^Invalid input: /, "");
  return [`"${key}" = ${JSON.stringify(value)} (${origin}): ${expected}`];
}

/** JSON Schema of a command's config file (input side: defaults make keys optional). */
export function jsonSchemaOf(spec: CommandConfigSpec): unknown {
  return {
    title: `searchr1 ${spec.command} config`,
    ...(z.toJSONSchema(spec.schema, { io: "input", unrepresentable: "any" }) as object),
  };
}
