import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

interface PackageJson {
  name: string;
  version: string;
}

let cached: { root: string; pkg: PackageJson } | undefined;

/** The installed package's root folder (templates/, native/ live there), from source or dist/. */
function locate(): { root: string; pkg: PackageJson } {
  if (cached) return cached;
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const file = join(dir, "package.json");
    if (existsSync(file)) {
      const pkg = JSON.parse(readFileSync(file, "utf8")) as PackageJson;
      if (pkg.name === "searchr1") {
        cached = { root: dir, pkg };
        return cached;
      }
    }
    const parent = dirname(dir);
    if (parent === dir) throw new Error("searchr1: cannot find the package root (package.json)");
    dir = parent;
  }
}

export const packageRoot = (): string => locate().root;
export const packageVersion = (): string => locate().pkg.version;
