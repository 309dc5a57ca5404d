import { appendFileSync } from "node:fs";
import { isPlainObject } from "./layers.js";

/**
 * Which config keys a run reads: the record that keeps a documented key from being silently
 * ignored. With SEARCHR1_KEY_READS=<file> in the environment, every command wraps its
 * resolved config so that reading a key (a leaf: a value that is not a section) appends
 * `{"command", "key"}` to that file, once per key and process, as it happens (a server
 * stopped by a signal has still written what it read). test/config/key-reads.test.ts runs
 * every command with every key set and checks that each key is read or declared in the
 * command's `compat` list (keys accepted only so that verl/Search-R1 files load).
 */
export const KEY_READS_ENV = "SEARCHR1_KEY_READS";

const RAW = Symbol("raw config");

/**
 * `config` behind a proxy that calls `onRead` with the dotted path of each leaf read.
 * Sections come back wrapped too (the same wrapper each time), so a section handed to a
 * library function is recorded key by key as that function reads it.
 */
export function recordReads<T extends object>(config: T, onRead: (key: string) => void): T {
  const wrappers = new WeakMap<object, object>();
  const wrap = (section: object, prefix: string): object => {
    const known = wrappers.get(section);
    if (known) return known;
    const proxy = new Proxy(section, {
      get(target, prop, receiver) {
        if (prop === RAW) return target;
        const value = Reflect.get(target, prop, receiver);
        if (typeof prop !== "string" || !Object.hasOwn(target, prop)) return value;
        const key = prefix ? `${prefix}.${prop}` : prop;
        if (isPlainObject(value)) return wrap(value, key);
        onRead(key);
        return value;
      },
    });
    wrappers.set(section, proxy);
    return proxy;
  };
  return wrap(config, "") as T;
}

/** The config without the recording wrapper: for writing it out whole (config.yaml). */
export function rawConfig<T extends object>(config: T): T {
  return ((config as Record<symbol, unknown>)[RAW] as T | undefined) ?? config;
}

/** The command's config, recording its reads when SEARCHR1_KEY_READS names a file. */
export function withKeyReadsRecord<T>(command: string, config: T): T {
  const file = process.env[KEY_READS_ENV];
  if (!file || !isPlainObject(config)) return config;
  const seen = new Set<string>();
  return recordReads(config, (key) => {
    if (seen.has(key)) return;
    seen.add(key);
    appendFileSync(file, `${JSON.stringify({ command, key })}\n`);
  }) as T;
}
