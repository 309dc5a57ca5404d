import type { Command } from "commander";
import { compatWarnings } from "../config/compat.js";
import { withKeyReadsRecord } from "../config/key-reads.js";
import type { CliValue, CommandConfigSpec } from "../config/resolve.js";
import { NotImplementedError } from "../runtime/errors.js";
import { addConfigFlags, type FlagSpec, resolveFromCli, splitArgs } from "./options.js";

export interface CommandDefinition<S extends CommandConfigSpec> {
  spec: S;
  description: string;
  aliases?: string[];
  /**
   * Name of the positional arguments (mixed with key=value overrides), e.g. "dataset";
   * `single` takes exactly one value (a string key) instead of a list.
   */
  positional?: { name: string; key: string; single?: boolean };
  flags: FlagSpec[];
  /** Usage examples shown by --help. */
  examples: string[];
  /** Absent while the capability has not landed: the command then says so and exits 2. */
  run?: (config: ReturnType<S["schema"]["parse"]>) => Promise<void>;
}

/** Registers one command: its flags from the config schema, help, and config resolution. */
export function defineCommand<S extends CommandConfigSpec>(
  program: Command,
  def: CommandDefinition<S>,
): Command {
  const single = def.positional?.single === true;
  const cmd = program.command(def.spec.command).description(def.description);
  if (def.positional && single) {
    cmd
      .argument(`[${def.positional.name}]`, def.positional.name)
      .argument("[overrides...]", "key.path=value overrides");
  } else {
    cmd.argument(
      def.positional ? `[${def.positional.name}...]` : "[overrides...]",
      def.positional
        ? `${def.positional.name}s, then key.path=value overrides`
        : "key.path=value overrides",
    );
  }
  cmd.addHelpText("after", `\nExamples:\n${def.examples.map((e) => `  $ ${e}`).join("\n")}\n`);
  for (const alias of def.aliases ?? []) cmd.alias(alias);
  const hints: Record<string, string> = def.positional
    ? {
        [def.positional.key]: `<${def.positional.name}${single ? "> argument" : "...> arguments"}`,
      }
    : {};
  addConfigFlags(cmd, def.spec, def.flags, hints);
  cmd.action(async (...params: unknown[]) => {
    // Commander passes one parameter per declared argument, then options and the command.
    const args = (
      single ? [params[0], ...(params[1] as string[])] : (params[0] as string[])
    ).filter((a): a is string => typeof a === "string");
    const run = def.run;
    if (!run) throw new NotImplementedError(def.spec.command);
    const { overrides, positional } = splitArgs(args);
    const extra: CliValue[] = [];
    if (single && positional.length > 1) {
      cmd.error(
        `error: unexpected argument "${positional[1]}" (one <${def.positional?.name}> only)`,
        {
          exitCode: 2,
        },
      );
    }
    if (def.positional && positional.length > 0) {
      extra.push({
        key: def.positional.key,
        value: single ? positional[0] : positional,
        origin: { kind: "argument", name: def.positional.name },
      });
    } else if (positional.length > 0) {
      cmd.error(`error: unexpected argument "${positional[0]}" (overrides are key.path=value)`, {
        exitCode: 2,
      });
    }
    const config = resolveFromCli(cmd, def.spec, def.flags, overrides, extra);
    for (const line of compatWarnings(def.spec, config)) process.stderr.write(`${line}\n`);
    await run(withKeyReadsRecord(def.spec.command, config));
  });
  return cmd;
}
