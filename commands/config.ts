import type { Command } from "commander";
import { Document, isScalar } from "yaml";
import { flagNamesOf, splitArgs } from "../src/command/options.js";
import { configReference } from "../src/config/reference.js";
import { CONFIG_SPECS } from "../src/config/registry.js";
import {
  type CommandConfigSpec,
  type ConfigDraft,
  jsonSchemaOf,
  resolveConfigDraft,
} from "../src/config/resolve.js";
import { readScriptCommand, type ScriptCommand } from "../src/config/script-args.js";
import { explainKey } from "../src/config/verl-layers.js";
import { UsageError } from "../src/runtime/errors.js";

/** The training line of a script, for a command that reads verl's names. */
function scriptOf(spec: CommandConfigSpec, file: string): ScriptCommand {
  if (!spec.verl) {
    throw new UsageError(`config: --from-script is for train and eval, not ${spec.command}`);
  }
  const script = readScriptCommand(file, process.env);
  if (script.others.length > 0) {
    process.stderr.write(
      `searchr1: note: ${file}: not read (only key=value arguments are): ${script.others.join(" ")}\n`,
    );
  }
  return script;
}

/** A comment line per argument of the script: what it became here. */
function scriptLines(spec: CommandConfigSpec, script: ScriptCommand): string {
  const lines = script.overrides.map((arg) => {
    const key = arg.slice(0, arg.indexOf("=")).replace(/^\++/, "");
    return `#   ${arg}  ->  ${explainKey(spec.schema, spec.verl ?? {}, key)}`;
  });
  return `# ${script.program}: its ${lines.length} key=value arguments, and what each became\n${lines.join("\n")}\n`;
}

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
    .option(
      "--from-script <file>",
      "train, eval: read the key=value arguments of a Search-R1/verl shell script's training line (python3 -m verl.trainer.main_ppo or searchr1 train) and its exported variables, and print what each became",
    )
    .addHelpText(
      "after",
      "\nExamples:\n" +
        "  $ searchr1 config train --config run.yaml actor.lr=5e-7 rollout.n=8\n" +
        "  $ searchr1 config train --schema > searchr1-train.schema.json\n" +
        "  $ searchr1 config train --from-script Search-R1/scripts/nq_hotpotqa/v0.2/train_grpo.sh\n",
    )
    .action(
      (
        command: string,
        args: string[],
        opts: { config?: string; schema?: boolean; reference?: boolean; fromScript?: string },
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
        const { overrides: given, positional } = splitArgs(args);
        if (positional.length > 0) {
          throw new UsageError(
            `config: unexpected argument "${positional[0]}" (overrides are key.path=value)`,
          );
        }
        // The command's own flags name the keys in errors and in the `required` comments.
        const target = program.commands.find((c) => c.name() === spec.command);
        const flagNames = target ? flagNamesOf(target) : {};
        const script = opts.fromScript ? scriptOf(spec, opts.fromScript) : null;
        const draft = resolveConfigDraft(spec, {
          configFile: opts.config,
          overrides: [...(script?.overrides ?? []), ...given],
          env: { ...process.env, ...script?.env },
          flagNames,
          warn: (line) => process.stderr.write(`${line}\n`),
        });
        if (script) process.stdout.write(scriptLines(spec, script));
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
