import { isDeepStrictEqual } from "node:util";
import type { z } from "zod";
import type { CommandLine } from "../runtime/child-server.js";
import { UsageError } from "../runtime/errors.js";
import { getPath, isPlainObject } from "./layers.js";
import { type CommandConfigSpec, type ConfigDraft, resolveConfigDraft } from "./resolve.js";
import { nodeAt, objectShape } from "./schema-walk.js";

/** Every key optional at every depth; lists and scalars are given whole. */
export type DeepPartial<T> = T extends readonly unknown[]
  ? T
  : T extends object
    ? { [K in keyof T]?: DeepPartial<T[K]> }
    : T;

/**
 * Config values for a command, typed by its schema's input side: any subset of its keys
 * (undefined = not given). What one command passes to another that it starts.
 */
export type ConfigValues<S extends CommandConfigSpec> = DeepPartial<z.input<S["schema"]>>;

/**
 * The command line that gives `spec`'s command these config values: `--config FILE` when
 * given, then one `key.path=value` override per value (every command reads them, and they
 * outrank its flags and env vars). It is resolved here with the command's own schema first,
 * so a key it does not have, a value of the wrong type, or a value that would not read back
 * exactly fails now, naming the key; a required key left out is the child's to report.
 */
export function commandLine<S extends CommandConfigSpec>(
  spec: S,
  values: ConfigValues<S>,
  options: { configFile?: string } = {},
): CommandLine {
  const given = leaves(spec.schema, values as Record<string, unknown>, []);
  const overrides = given.map(({ path, value }) => `${path.join(".")}=${overrideText(value)}`);
  const { configFile } = options;
  const fail = (message: string) =>
    new UsageError(`the arguments of searchr1 ${spec.command}: ${message}`);
  let draft: ConfigDraft;
  try {
    draft = resolveConfigDraft(spec, { configFile, overrides });
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    // The required keys left out are the child's to report (with its own advice).
    const lines = err.message.split("\n").filter((l) => !l.startsWith("missing required key"));
    throw fail(lines.join("\n"));
  }
  for (const { path, value } of given) {
    const want = nodeAt(spec.schema, path)?.safeParse(value);
    const got = getPath(draft.values, path);
    if (want?.success && !isDeepStrictEqual(want.data, got)) {
      throw fail(
        `"${path.join(".")}" = ${JSON.stringify(value)} would read back as ${JSON.stringify(got)}`,
      );
    }
  }
  return {
    command: spec.command,
    args: [...(configFile ? ["--config", configFile] : []), ...overrides],
  };
}

/**
 * The command line of a `serve-*` command started as a child, listening on a free port
 * (ChildServer reads its URL) of `host`: the loopback, or on another node of a multi-node
 * run the address node 0 reaches it at.
 */
export function serverLine<S extends CommandConfigSpec<z.ZodType<unknown, ListenValues>>>(
  spec: S,
  values: ConfigValues<S>,
  host = "127.0.0.1",
): CommandLine {
  return commandLine(spec, { ...values, host, port: 0 } as ConfigValues<S>);
}

/** The keys every `serve-*` schema has (schemas/server-fields.ts's listenFields). */
interface ListenValues {
  host?: string;
  port?: number;
}

/** The values to write as overrides: sections are descended, anything else is one value. */
function leaves(
  schema: z.ZodType,
  values: Record<string, unknown>,
  prefix: string[],
): { path: string[]; value: unknown }[] {
  return Object.entries(values).flatMap(([key, value]) => {
    if (value === undefined) return [];
    const path = [...prefix, key];
    const node = nodeAt(schema, path);
    // A key the schema lacks is descended too, so that the error names it in full.
    return isPlainObject(value) && (!node || objectShape(node))
      ? leaves(schema, value, path)
      : [{ path, value }];
  });
}

/** Text that config/coerce.ts needs no schema to read as text. */
const PLAIN = /^[\w./:@%+-]+$/;
/** Plain text that it might read as null, a boolean or a number. */
const TYPED = /^(null|~|true|false|yes|no|on|off|[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?)$/i;

/**
 * A value as coerce() reads it back: numbers, booleans and null as themselves, lists as
 * `[a,b]`, text quoted unless it is plain (coerce drops one pair of quotes and reads
 * nothing inside them, so `"x"` is x whatever x holds; in a list a quote of the other kind
 * is taken when the text holds the first).
 */
function overrideText(value: unknown): string {
  if (typeof value === "string") {
    if (PLAIN.test(value) && !TYPED.test(value)) return value;
    return value.includes('"') && !value.includes("'") ? `'${value}'` : `"${value}"`;
  }
  if (Array.isArray(value)) return `[${value.map(overrideText).join(",")}]`;
  if (value === null || typeof value !== "object") return String(value);
  return JSON.stringify(value);
}
