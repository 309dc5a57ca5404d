import type { Command } from "commander";
import { Document, isScalar } from "yaml";
import { flagNamesOf, splitArgs } from "../src/command/options.js";
import { configReference } from "../src/config/reference.js";
import { CONFIG_SPECS } from "../src/config/registry.js";
import { type ConfigDraft, jsonSchemaOf, resolveConfigDraft } from "../src/config/resolve.js";
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

/**
 * The resolved config as YAML; a required key that nothing sets is `null` with a comment
 * saying how to set it (`path: null # required: set --model or model.path`).
 */
function draftYaml(draft: ConfigDraft, flagNames: Record<string, string>): string {
  const doc = new Document(draft.values);
  for (const path of draft.missing) {
    const node = doc.getIn(path, true);
    if (!isScalar(node)) continue;
    const dotted = path.join(".");
    const via = flagNames[dotted];
    const how = via ? `${via.startsWith("-") ? via : `the ${via}`} or ${dotted}` : dotted;
    node.comment = ` required: set ${how}`;
  }
  return doc.toString();
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
        // The command's own flags name the keys in errors and in the `required` comments.
        const target = program.commands.find((c) => c.name() === spec.command);
        const flagNames = target ? flagNamesOf(target) : {};
        const draft = resolveConfigDraft(spec, {
          configFile: opts.config,
          overrides,
          env: process.env,
          flagNames,
        });
        process.stdout.write(draftYaml(draft, flagNames));
        if (draft.missing.length > 0) {
          const keys = draft.missing.map((p) => p.join(".")).join(", ");
          process.stderr.write(
            `searchr1: note: required and not set (null above): ${keys}; \`searchr1 ${spec.command}\` refuses to run without ${draft.missing.length > 1 ? "them" : "it"}\n`,
          );
        }
      },
    );
}
