import { existsSync, mkdirSync } from "node:fs";
import { resolve } from "node:path";
import type {
  OnlineRetrieverKind,
  ServeRetrieverConfig,
} from "../../config/schemas/serve-retriever.js";
import { userCacheDir } from "../../runtime/cache-dir.js";
import { describeSystemError, InputError, UsageError } from "../../runtime/errors.js";
import { OnlineSearch } from "./online-search.js";
import { openProvider } from "./providers.js";
import { SearchCache } from "./search-cache.js";
import { endpoint, Upstream } from "./upstream.js";

export interface OpenedSearch {
  search: OnlineSearch;
  /** For `GET /health`: the engine, the endpoint (no key), the cache and the call limits. */
  describe: Record<string, unknown>;
  /** For the serving line: what the server calls and where it keeps answers. */
  summary: string;
}

/** The web search of `config.retriever`: its credentials, cache and rate-limited caller. */
export function openOnlineSearch(
  kind: OnlineRetrieverKind,
  config: ServeRetrieverConfig,
  log: (line: string) => void,
): OpenedSearch {
  const replayOnly = config.replay_only;
  const opened = openProvider(kind, {
    searchUrl: config.search_url,
    serpEngine: config.serp_engine,
    replayOnly,
  });
  const { provider, secrets } = opened;
  // Shown without a query string: a proxy's URL may carry a key there.
  const url = endpoint(opened.url);
  const root = resolve(config.search_cache ?? userCacheDir("search"));
  if (replayOnly && !existsSync(root)) {
    throw new InputError(
      `${root}: no search cache to replay (--replay-only answers only from a cache that ` +
        "serving without it recorded; set --search-cache)",
    );
  }
  if (!replayOnly) {
    try {
      mkdirSync(root, { recursive: true });
    } catch (err) {
      throw new UsageError(
        `${describeSystemError(err) ?? `${root}: ${(err as Error).message}`}; set --search-cache to a writable folder`,
      );
    }
  }
  const days = config.search_cache_days;
  const cache = new SearchCache(root, days === null ? null : days * 86_400_000);
  const upstream = replayOnly
    ? null
    : new Upstream({
        name: kind,
        timeoutMs: config.search_timeout_s * 1000,
        retries: config.search_retries,
        backoffS: config.search_backoff_s,
        concurrency: config.search_concurrency,
        secrets,
        log,
      });
  const search = new OnlineSearch({ provider, cache, upstream, log });
  const kept = days === null ? "kept" : `kept ${days} days`;
  return {
    search,
    describe: {
      retriever: kind,
      ...(kind === "serpapi" ? { serp_engine: config.serp_engine } : {}),
      search_url: url,
      replay_only: replayOnly,
      cache: { path: root, max_age_days: days },
      upstream: {
        concurrency: config.search_concurrency,
        timeout_s: config.search_timeout_s,
        retries: config.search_retries,
      },
    },
    summary: replayOnly
      ? `replay-only from ${root}`
      : `${url}, ${config.search_concurrency} calls at once; answers ${kept} in ${root}`,
  };
}
