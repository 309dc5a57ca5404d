import { setTimeout as sleep } from "node:timers/promises";
import { ServiceError } from "../runtime/errors.js";
import { HttpConnectionError, HttpStatusError, requestJson } from "../runtime/http-client.js";
import type { Passage } from "./observation.js";

export interface RetrieverSettings {
  /** The `POST /retrieve` endpoint. */
  url: string;
  topk: number;
  /** Per request. */
  timeoutMs: number;
  /** Retries of a request that failed for a reason that may pass (refused, reset, 5xx, timeout). */
  maxRetries: number;
  /** Queries arriving within this many ms of the first one share a request. */
  batchWindowMs?: number;
  /** Most queries in one request. */
  maxBatch?: number;
  /** First back-off delay; doubles per retry up to 10 s. */
  backoffMs?: number;
  /** Told of each retry (the run is slow for a reason the user should see). */
  onRetry?: (message: string) => void;
  /**
   * Aborting it (a child the run needs died, Ctrl-C) ends the request in flight and the
   * retries at once, instead of a minute of back-off against a server that is gone.
   */
  signal?: AbortSignal;
}

export interface RetrieverStats {
  requests: number;
  queries: number;
  retries: number;
}

interface Pending {
  query: string;
  resolve: (passages: Passage[]) => void;
  reject: (err: Error) => void;
}

/**
 * Search-R1's retriever protocol (`{"queries", "topk", "return_scores": true}` →
 * `{"result": [[{"document": {"contents", ...}, "score"}]]}`) for trajectories that run
 * concurrently: each asks for one query, and the queries that arrive within a few ms of
 * each other go out as one request, as Search-R1's turn-synchronous loop sends one request
 * per turn. A retriever that is down or slow is retried with back-off, then fails the run;
 * it never yields empty documents.
 */
export class RetrieverClient {
  readonly stats: RetrieverStats = { requests: 0, queries: 0, retries: 0 };
  private queue: Pending[] = [];
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly settings: RetrieverSettings) {}

  /** The documents for one query, in rank order. */
  search(query: string): Promise<Passage[]> {
    return new Promise((resolve, reject) => {
      this.queue.push({ query, resolve, reject });
      if (this.queue.length >= (this.settings.maxBatch ?? 512)) this.flush();
      else this.timer ??= setTimeout(() => this.flush(), this.settings.batchWindowMs ?? 5);
    });
  }

  /**
   * The retriever's own totals: `GET /health`'s `counters` (a web search retriever's queries,
   * cache hits, calls and failures, src/retrieval/online/); null when it has none or does
   * not answer: they are for the metrics, never a reason to stop a run.
   */
  async counters(): Promise<Record<string, number> | null> {
    try {
      const health = await requestJson(new URL("health", this.settings.url).href, undefined, {
        timeoutMs: 5_000,
        signal: this.settings.signal,
      });
      const counters = (health as { counters?: unknown })?.counters;
      if (counters === null || typeof counters !== "object") return null;
      return Object.fromEntries(
        Object.entries(counters).filter(([, v]) => typeof v === "number" && Number.isFinite(v)),
      );
    } catch {
      return null;
    }
  }

  private flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const batch = this.queue;
    this.queue = [];
    if (batch.length === 0) return;
    this.retrieve(batch.map((p) => p.query)).then(
      (results) => {
        for (const [i, p] of batch.entries()) p.resolve(results[i] as Passage[]);
      },
      (err: Error) => {
        for (const p of batch) p.reject(err);
      },
    );
  }

  /** One request, with retries; the documents of each query. */
  private async retrieve(queries: string[]): Promise<Passage[][]> {
    const { url, maxRetries } = this.settings;
    const body = { queries, topk: this.settings.topk, return_scores: true };
    for (let attempt = 0; ; attempt++) {
      try {
        this.stats.requests++;
        const answer = await requestJson(url, body, {
          timeoutMs: this.settings.timeoutMs,
          signal: this.settings.signal,
        });
        this.stats.queries += queries.length;
        return parseAnswer(answer, queries.length, url);
      } catch (err) {
        this.settings.signal?.throwIfAborted();
        const transient =
          err instanceof HttpConnectionError ||
          (err instanceof HttpStatusError && (err.status >= 500 || err.status === 429));
        if (!transient) {
          if (err instanceof HttpStatusError) {
            throw new ServiceError(
              `retriever ${url} refused the request (${err.status}): ${err.detail}`,
            );
          }
          throw err;
        }
        const reason =
          err instanceof HttpStatusError
            ? `answered ${err.status}: ${err.detail}`
            : err.message.slice(url.length + 2);
        if (attempt >= maxRetries) {
          throw new ServiceError(
            `retriever ${url} failed ${attempt + 1} times (${reason}); check that ` +
              "serve-retriever is running there (retriever.url), or raise retriever.max_retries " +
              "/ retriever.timeout_s",
          );
        }
        const delay = Math.min((this.settings.backoffMs ?? 500) * 2 ** attempt, 10_000);
        this.stats.retries++;
        this.settings.onRetry?.(
          `retriever ${url} ${reason}; retry ${attempt + 1}/${maxRetries} in ${(delay / 1000).toFixed(1)} s`,
        );
        await sleep(delay, undefined, { signal: this.settings.signal }).catch(() =>
          this.settings.signal?.throwIfAborted(),
        );
      }
    }
  }
}

function parseAnswer(answer: unknown, count: number, url: string): Passage[][] {
  const bad = (what: string) =>
    new ServiceError(
      `retriever ${url} answered ${what}; expected Search-R1's {"result": [[{"document": {"contents": ...}, "score": ...}]]}`,
    );
  const result = (answer as { result?: unknown })?.result;
  if (!Array.isArray(result)) throw bad('without a "result" list');
  if (result.length !== count) throw bad(`${result.length} result lists for ${count} queries`);
  return result.map((hits, q) => {
    if (!Array.isArray(hits)) throw bad(`a non-list at result[${q}]`);
    return hits.map((hit, k) => {
      // With return_scores the document sits under "document"; bare documents are accepted too.
      const doc = (hit as { document?: unknown })?.document ?? hit;
      const contents = (doc as { contents?: unknown })?.contents;
      if (typeof contents !== "string") throw bad(`no "contents" string at result[${q}][${k}]`);
      const id = (doc as { id?: unknown }).id;
      return id === undefined || id === null ? { contents } : { id: String(id), contents };
    });
  });
}
