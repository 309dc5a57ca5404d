import { CONFIG_SPECS } from "../../src/config/registry.js";
import { isOverride, resolveConfig, resolveConfigDraft } from "../../src/config/resolve.js";
import type { CommandLine } from "../../src/runtime/child-server.js";

/**
 * The config the child `searchr1 <command> <args>` resolves from a command line, read as
 * its own parser reads it (src/command/define.ts): `--config FILE`, then `key=value`
 * overrides, by the command's spec. `draft` leaves required keys that nothing sets null.
 */
export function resolveLine(line: CommandLine, options: { draft?: boolean } = {}): unknown {
  const spec = CONFIG_SPECS[line.command];
  if (!spec) throw new Error(`no config spec for command "${line.command}"`);
  const args = [...line.args];
  const configFile = args[0] === "--config" ? args.splice(0, 2)[1] : undefined;
  const notOverrides = args.filter((a) => !isOverride(a));
  if (notOverrides.length) throw new Error(`not key=value overrides: ${notOverrides.join(" ")}`);
  const input = { configFile, overrides: args };
  return options.draft ? resolveConfigDraft(spec, input).values : resolveConfig(spec, input);
}
