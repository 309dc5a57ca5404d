import { existsSync } from "node:fs";
import { join } from "node:path";
import { InputError } from "./errors.js";
import { packageRoot } from "./package-root.js";

/** The native executables built from native/ by `npm install` / `npm run build`. */
export type NativeExecutable = "searchr1-trainer" | "searchr1-engine" | "searchr1-index";

/** Where the native executables are: $SEARCHR1_NATIVE_DIR, else the package's native/build. */
export function nativeDir(): string {
  return process.env.SEARCHR1_NATIVE_DIR || join(packageRoot(), "native", "build");
}

/** The path of a native executable; a clear error when it has not been built. */
export function nativeExecutable(name: NativeExecutable): string {
  const dir = nativeDir();
  const path = join(dir, name);
  if (!existsSync(path)) {
    const from = process.env.SEARCHR1_NATIVE_DIR ? " (from SEARCHR1_NATIVE_DIR)" : "";
    throw new InputError(
      `${path}: the native ${name} is not built${from}; run \`npm run build\` ` +
        "(it needs cmake and g++; OpenBLAS makes it faster) or point SEARCHR1_NATIVE_DIR at a build",
    );
  }
  return path;
}
