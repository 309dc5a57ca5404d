import { existsSync, readFileSync } from "node:fs";
import { expect } from "vitest";
import { KEY_READS_ENV } from "../../src/config/key-reads.js";
import type { CommandConfigSpec } from "../../src/config/resolve.js";
import { leafPaths } from "../../src/config/schema-walk.js";

/** The environment that makes a command record the config keys it reads into `file`. */
export function keyReadsEnv(file: string): Record<string, string> {
  return { [KEY_READS_ENV]: file };
}

/** The keys `command` read, over every process that wrote to `file`. */
export function keysRead(file: string, command: string): Set<string> {
  if (!existsSync(file)) return new Set();
  return new Set(
    readFileSync(file, "utf8")
      .split("\n")
      .filter((l) => l)
      .map((l) => JSON.parse(l) as { command: string; key: string })
      .filter((r) => r.command === command)
      .map((r) => r.key),
  );
}

/** Every key of the command's schema was read, or is declared compatibility-only. */
export function expectEveryKeyRead(spec: CommandConfigSpec, file: string): void {
  const read = keysRead(file, spec.command);
  const compat = new Set(Object.keys(spec.compat ?? {}));
  const unread = leafPaths(spec.schema)
    .map((p) => p.join("."))
    .filter((k) => !read.has(k) && !compat.has(k));
  expect(unread, `${spec.command}: keys no run read and not in its compat list`).toEqual([]);
}
