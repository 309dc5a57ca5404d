import { homedir } from "node:os";
import { join } from "node:path";

/** `$XDG_CACHE_HOME/searchr1/<name>`, else `~/.cache/searchr1/<name>`: where caches live. */
export function userCacheDir(name: string): string {
  const base = process.env.XDG_CACHE_HOME || join(homedir(), ".cache");
  return join(base, "searchr1", name);
}
