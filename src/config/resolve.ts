import { z } from "zod";
import { UsageError } from "../runtime/errors.js";
import { coerce } from "./coerce.js";
import {
  emptyLayer,
  formatOrigin,
  getPath,
  type Layer,
  mergeValues,
  type Origin,
  originOf,
  setValue,
} from "./layers.js";
import { leafPaths, nodeAt, typeName } from "./schema-walk.js";
import { siblingKeys, suggestKey } from "./suggest.js";
import { loadConfigFile } from "./yaml-file.js";

/** What the config layer knows about one command. */
export interface CommandConfigSpec<S extends z.ZodType = z.ZodType> {
  command: string;
  schema: S;
  /** Documented environment variables → the dotted key each one sets. */
  env: Record<string, string>;
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
  const lines = result.error.issues.flatMap((issue) =>
    describeIssue(spec, layers, merged, issue, input.flagNames ?? {}),
  );
  throw new UsageError(lines.join("\n"));
}

function buildLayers(spec: CommandConfigSpec, input: ResolveInput): Layer[] {
  const layers: Layer[] = input.configFile ? loadConfigFile(input.configFile) : [];
  const coerceAt = (key: string[], raw: unknown) =>
    typeof raw === "string" ? coerce(raw, nodeAt(spec.schema, key)) : raw;

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
  const overrides = emptyLayer();
  for (const text of input.overrides ?? []) {
    const m = OVERRIDE_RE.exec(text);
    if (!m) throw new UsageError(`override "${text}": expected key.path=value`);
    const path = (m[1] as string).split(".");
    setValue(overrides, path, coerceAt(path, m[2] as string), { kind: "override", text });
  }
  return [...layers, env, cli, overrides];
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
  const missing = issue.code === "invalid_type" || issue.code === "invalid_value"; // enums say the latter
  if (value === undefined && missing && stop < 0 && node) {
    // A missing section is reported as its required keys, which is what the user must set.
    const required = leafPaths(node, ownerPath).filter(
      (p) => !nodeAt(spec.schema, p)?.safeParse(undefined).success,
    );
    return required.map((p) => {
      const dotted = p.join(".");
      const via = [flagNames[dotted], `"${dotted}:" in --config FILE`, `${dotted}=...`]
        .filter(Boolean)
        .join(", ");
      return `missing required key "${dotted}": expected ${typeName(nodeAt(spec.schema, p) as z.ZodType)} (set it with ${via})`;
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
