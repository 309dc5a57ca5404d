/**
 * Web search behind the retriever API: each query is answered from the cache, else by the
 * engine (and then recorded), else, in replay-only mode, refused. A query already being
 * asked is not asked twice: GRPO's group of rollouts of one prompt often searches the same
 * words at the same moment, and each call is paid for.
 */
import { describeSystemError } from "../../runtime/errors.js";
import type { Provider, SearchDocument } from "./provider.js";
import type { SearchCache } from "./search-cache.js";
import { type Upstream, UpstreamError } from "./upstream.js";

/** What `GET /health` reports as `counters`, totals since the start (train logs them per step). */
export interface SearchCounters {
  /** Queries asked (blank ones answer `[]` and are not counted). */
  queries: number;
  /** Queries answered without calling the engine: from the cache, or by an identical query in flight. */
  cache_hits: number;
  /** Queries sent to the engine (each once; its retries are `retries`). */
  sent: number;
  /** HTTP requests made to the engine, retries included. */
  upstream_requests: number;
  retries: number;
  /** Queries the engine failed on after the retries, or answered with an error. */
  failures: number;
  /** Replay-only queries that were not in the cache. */
  replay_misses: number;
}

/** A request's query that could not be answered; `replayMiss` when replay-only found no entry. */
export class QueryFailure extends Error {
  constructor(
    message: string,
    readonly replayMiss: boolean,
  ) {
    super(message);
  }
}

export interface OnlineSearchOptions {
  provider: Provider;
  cache: SearchCache;
  /** null: replay-only, the engine is never called. */
  upstream: Upstream | null;
  log: (line: string) => void;
}

export class OnlineSearch {
  private readonly counts = { queries: 0, cache_hits: 0, sent: 0, failures: 0, replay_misses: 0 };
  private readonly asking = new Map<string, Promise<SearchDocument[]>>();
  private cacheWriteFailed = false;

  constructor(private readonly options: OnlineSearchOptions) {}

  /** Calls to the engine in flight now. */
  get inFlight(): number {
    return this.options.upstream?.inFlight ?? 0;
  }

  get counters(): SearchCounters {
    const up = this.options.upstream;
    const c = this.counts;
    return {
      queries: c.queries,
      cache_hits: c.cache_hits,
      sent: c.sent,
      upstream_requests: up?.stats.requests ?? 0,
      retries: up?.stats.retries ?? 0,
      failures: c.failures,
      replay_misses: c.replay_misses,
    };
  }

  /**
   * The documents of each query, in order. Every query is settled before answering (those
   * that succeed are cached); the first failure, in query order, is thrown as QueryFailure.
   */
  async search(queries: readonly string[], topk: number): Promise<SearchDocument[][]> {
    const settled = await Promise.allSettled(queries.map((q) => this.one(q, topk)));
    const failed = settled.flatMap((s, i) => (s.status === "rejected" ? [i] : []));
    if (failed.length > 0) {
      const i = failed[0] as number;
      const err = (settled[i] as PromiseRejectedResult).reason as Error;
      if (!(err instanceof UpstreamError || err instanceof QueryFailure)) throw err;
      const more =
        failed.length > 1 ? ` (and ${failed.length - 1} more of the request's queries)` : "";
      const miss = err instanceof QueryFailure && err.replayMiss;
      throw new QueryFailure(
        `queries[${i}] ${JSON.stringify(queries[i])}: ${err.message}${more}`,
        miss,
      );
    }
    return settled.map((s) => (s as PromiseFulfilledResult<SearchDocument[]>).value);
  }

  private async one(raw: string, topk: number): Promise<SearchDocument[]> {
    const { provider, cache, upstream } = this.options;
    const query = provider.prepare(raw);
    if (query.trim() === "") return [];
    this.counts.queries++;
    const engine = provider.cacheName;
    const cached = await cache.get(engine, query, topk, upstream === null);
    if (cached) {
      this.counts.cache_hits++;
      return cached;
    }
    if (upstream === null) {
      this.counts.replay_misses++;
      throw new QueryFailure(
        `replay-only: not in the search cache ${cache.root} (${engine}, topk ${topk}); ` +
          "serve once without --replay-only to record it",
        true,
      );
    }
    const key = JSON.stringify([query, topk]);
    const pending = this.asking.get(key);
    if (pending) {
      this.counts.cache_hits++;
      return pending;
    }
    const asked = this.ask(upstream, query, topk).finally(() => this.asking.delete(key));
    this.asking.set(key, asked);
    return asked;
  }

  private async ask(upstream: Upstream, query: string, topk: number): Promise<SearchDocument[]> {
    const { provider, cache, log } = this.options;
    this.counts.sent++;
    let documents: SearchDocument[];
    try {
      documents = await upstream.call(provider.request(query), (answer) =>
        provider.documents(answer, topk),
      );
    } catch (err) {
      this.counts.failures++;
      throw err;
    }
    try {
      cache.put(provider.cacheName, query, topk, documents);
    } catch (err) {
      // The answer is still good; only its reuse is lost. Said once, not per query.
      if (!this.cacheWriteFailed) {
        this.cacheWriteFailed = true;
        log(
          `warning: cannot write the search cache (${describeSystemError(err) ?? (err as Error).message}); ` +
            "searches are answered but not kept (set --search-cache to a writable folder)",
        );
      }
    }
    return documents;
  }
}
