import type { Command } from "commander";
import { stringify } from "yaml";
import { splitArgs } from "../src/cli/options.js";
import { configReference } from "../src/config/reference.js";
import { CONFIG_SPECS } from "../src/config/registry.js";
import { jsonSchemaOf, resolveConfig } from "../src/config/resolve.js";
import { UsageError } from "../src/runtime/errors.js";

/** The commands that have a config, with their aliases as the command tree defines them. */
function commandNames(program: Command): string {
  return Object.keys(CONFIG_SPECS)
    .map((name) => {
      const aliases = program.commands.find((c) => c.name() === name)?.aliases() ?? [];
      return aliases.length ? `${name} (alias ${aliases.join(", ")})` : name;
    })
    .join(", ");
}

/** The command a name or an alias stands for: aliases work wherever a name does. */
function commandNamed(program: Command, name: string): string {
  return program.commands.find((c) => c.aliases().includes(name))?.name() ?? name;
}

export function register(program: Command): Command {
  return program
    .command("config")
    .description("print a command's fully resolved config as YAML, or its JSON Schema")
    .argument("<command>", "the command (or alias) whose config to print")
    .argument("[overrides...]", "key.path=value overrides")
    .option("-c, --config <file>", "YAML config file (may `extends:` another, relative to itself)")
    .option("--schema", "print the JSON Schema of the command's config file instead")
    .option("--reference", "print the command's config keys as a Markdown table instead")
    .addHelpText(
      "after",
      "\nExamples:\n" +
        "  $ searchr1 config train --config run.yaml actor.lr=5e-7 rollout.n=8\n" +
        "  $ searchr1 config train --schema > searchr1-train.schema.json\n",
    )
    .action(
      (
        command: string,
        args: string[],
        opts: { config?: string; schema?: boolean; reference?: boolean },
      ) => {
        const spec = CONFIG_SPECS[commandNamed(program, command)];
        if (!spec) {
          throw new UsageError(
            `config: unknown command "${command}"; expected one of ${commandNames(program)}`,
          );
        }
        if (opts.schema) {
          process.stdout.write(`${JSON.stringify(jsonSchemaOf(spec), null, 2)}\n`);
          return;
        }
        if (opts.reference) {
          process.stdout.write(`${configReference(spec)}\n`);
          return;
        }
        const { overrides, positional } = splitArgs(args);
        if (positional.length > 0) {
          throw new UsageError(
            `config: unexpected argument "${positional[0]}" (overrides are key.path=value)`,
          );
        }
        const config = resolveConfig(spec, {
          configFile: opts.config,
          overrides,
          env: process.env,
        });
        process.stdout.write(stringify(config));
      },
    );
}
