import type { OnlineRetrieverKind } from "../../config/schemas/serve-retriever.js";
import { UsageError } from "../../runtime/errors.js";
import { GOOGLE_KEY_ENV, GOOGLE_URL, google } from "./google.js";
import type { Provider, ProviderSettings } from "./provider.js";
import { SERPAPI_KEY_ENV, SERPAPI_URL, serpapi } from "./serpapi.js";
import { SERPER_KEY_ENV, SERPER_URL, serper } from "./serper.js";

interface ProviderEntry {
  url: string;
  /** Environment variables holding its credentials, all required for live searches. */
  keyEnv: readonly string[];
  make(settings: ProviderSettings, serpEngine: string): Provider;
}

const PROVIDERS: Record<OnlineRetrieverKind, ProviderEntry> = {
  serpapi: { url: SERPAPI_URL, keyEnv: SERPAPI_KEY_ENV, make: (s, engine) => serpapi(s, engine) },
  serper: { url: SERPER_URL, keyEnv: SERPER_KEY_ENV, make: (s) => serper(s) },
  google: { url: GOOGLE_URL, keyEnv: GOOGLE_KEY_ENV, make: (s) => google(s) },
};

export interface OpenedProvider {
  provider: Provider;
  /** The endpoint called (--search-url, else the engine's own). */
  url: string;
  /** The credentials' values: never to appear in a message. */
  secrets: string[];
}

/**
 * The engine `kind` with its credentials from the environment (only there: a key on the
 * command line shows in `ps` and shell history). Replay-only needs none.
 */
export function openProvider(
  kind: OnlineRetrieverKind,
  options: { searchUrl: string | null; serpEngine: string; replayOnly: boolean },
  env: NodeJS.ProcessEnv = process.env,
): OpenedProvider {
  const entry = PROVIDERS[kind];
  const url = options.searchUrl ?? entry.url;
  const missing = entry.keyEnv.filter((name) => !env[name]);
  if (missing.length > 0 && !options.replayOnly) {
    throw new UsageError(
      `--retriever ${kind} needs ${missing.join(" and ")} in the environment (the API key is ` +
        "read from there only, never from the command line or a config file); or serve " +
        "earlier searches with --replay-only",
    );
  }
  const keys = Object.fromEntries(entry.keyEnv.map((name) => [name, env[name] ?? ""]));
  return {
    provider: entry.make({ url, keys }, options.serpEngine),
    url,
    secrets: Object.values(keys).filter((v) => v !== ""),
  };
}
