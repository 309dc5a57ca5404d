import { getPath } from "./layers.js";
import type { CommandConfigSpec } from "./resolve.js";
import { defaultAt } from "./schema-walk.js";

/**
 * One warning per compatibility-only key (CommandConfigSpec.compat) that the config sets to
 * something other than its default: the run goes on, and the user learns the key does nothing.
 */
export function compatWarnings(spec: CommandConfigSpec, config: unknown): string[] {
  return Object.entries(spec.compat ?? {}).flatMap(([key, why]) => {
    const path = key.split(".");
    const value = getPath(config, path);
    const def = defaultAt(spec.schema, path);
    if (JSON.stringify(value) === JSON.stringify(def)) return [];
    return [
      `searchr1: warning: ${key}=${JSON.stringify(value)} has no effect in searchr1 ${spec.command} (${why}); accepted so that verl/Search-R1 configs load`,
    ];
  });
}
