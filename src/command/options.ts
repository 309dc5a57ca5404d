import type { Command } from "commander";
import { stringify } from "yaml";
import type { CliValue, CommandConfigSpec } from "../config/resolve.js";
import { isOverride, resolveConfig } from "../config/resolve.js";
import { defaultAt, describeOf, nodeAt } from "../config/schema-walk.js";

/** A command-line flag that sets one config key. */
export interface FlagSpec {
  /** Commander flag syntax, e.g. `--input <dir>` or `--strict`. */
  flags: string;
  /** Dotted config key it sets. */
  key: string;
  /** Help text; defaults to the schema's description of the key. */
  description?: string;
  /** The flag may be given several times, each value joining a list (a key of strings). */
  repeatable?: boolean;
}

function formatDefault(value: unknown): string {
  if (Array.isArray(value)) return value.join(",");
  return typeof value === "string" ? value : stringify(value).trim();
}

/** Each command's config flags and argument hints, for `searchr1 config` to name them. */
const keyHints = new WeakMap<Command, { flags: FlagSpec[]; hints: Record<string, string> }>();

/**
 * Key → how the command sets it on its command line: the first flag for the key (its name
 * in errors) or the positional argument. Keys set only by config or overrides are absent.
 */
export function flagNamesOf(cmd: Command): Record<string, string> {
  const known = keyHints.get(cmd);
  const names: Record<string, string> = { ...known?.hints };
  for (const f of known?.flags ?? []) {
    const option = cmd.options.find((o) => o.flags === f.flags);
    if (option) names[f.key] ??= option.long ?? f.flags;
  }
  return names;
}

/**
 * Adds `--config FILE` and the command's flags, with help texts and defaults taken
 * from the schema so that `--help` never disagrees with what the command does.
 * `hints` names keys set by positional arguments (key → "<kind> argument").
 */
export function addConfigFlags(
  cmd: Command,
  spec: CommandConfigSpec,
  flags: FlagSpec[],
  hints: Record<string, string> = {},
): void {
  keyHints.set(cmd, { flags, hints });
  cmd.option(
    "-c, --config <file>",
    "YAML config file (may `extends:` another, relative to itself)",
  );
  for (const f of flags) {
    const path = f.key.split(".");
    const node = nodeAt(spec.schema, path);
    if (!node) throw new Error(`flag ${f.flags}: no key "${f.key}" in the ${spec.command} schema`);
    const def = defaultAt(spec.schema, path);
    const text = f.description ?? describeOf(node) ?? f.key;
    const shown =
      def === undefined || def === null || def === false || (Array.isArray(def) && def.length === 0)
        ? ""
        : ` (default: ${formatDefault(def)})`;
    if (f.repeatable) {
      const collect = (value: string, list: string[] | undefined) => [...(list ?? []), value];
      cmd.option(f.flags, `${text} (repeatable)${shown}`, collect);
    } else {
      cmd.option(f.flags, `${text}${shown}`);
    }
  }
  const env = Object.entries(spec.env);
  const envHelp = env.length
    ? `\nEnvironment:\n${env.map(([name, key]) => `  ${name.padEnd(24)} sets ${key}`).join("\n")}\n`
    : "";
  cmd.addHelpText(
    "after",
    `${envHelp}\nAny config key can also be set with trailing key.path=value overrides;\n` +
      `\`searchr1 config ${spec.command}\` prints the resolved config, \`--schema\` its JSON Schema.\n`,
  );
}

/** Splits trailing arguments into `key=value` overrides and plain positional values. */
export function splitArgs(args: readonly string[]): { overrides: string[]; positional: string[] } {
  return {
    overrides: args.filter(isOverride),
    positional: args.filter((a) => !isOverride(a)),
  };
}

/** Resolves the command's config from --config, env, the flags the user gave, and overrides. */
export function resolveFromCli<S extends CommandConfigSpec>(
  cmd: Command,
  spec: S,
  flags: FlagSpec[],
  overrides: string[],
  extra: CliValue[] = [],
  hints: Record<string, string> = {},
): ReturnType<S["schema"]["parse"]> {
  const opts = cmd.opts();
  const cli: CliValue[] = [...extra];
  const flagNames: Record<string, string> = { ...hints, ...flagNamesOf(cmd) };
  const given = new Map<string, string>();
  for (const f of flags) {
    const option = cmd.options.find((o) => o.flags === f.flags);
    if (!option) continue;
    const value = opts[option.attributeName()];
    if (value === undefined) continue;
    const flag = option.long ?? f.flags;
    // Two spellings of one key (--lora, --lora-paths): one would silently replace the other.
    const other = given.get(f.key);
    if (other !== undefined)
      cmd.error(`error: give ${other} or ${flag}, not both`, { exitCode: 2 });
    given.set(f.key, flag);
    cli.push({ key: f.key, value, origin: { kind: "flag", flag } });
  }
  return resolveConfig(spec, {
    configFile: opts.config as string | undefined,
    cli,
    overrides,
    env: process.env,
    flagNames,
    warn: (line) => process.stderr.write(`${line}\n`),
  }) as ReturnType<S["schema"]["parse"]>;
}
