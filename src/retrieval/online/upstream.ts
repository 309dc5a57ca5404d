/**
 * Calls to a paid search engine: at most `concurrency` at once (verl's search tool has
 * `rate_limit` for the same reason: engines refuse bursts with 429), each with a timeout,
 * retried with exponential back-off on 429, 5xx, timeouts and dropped connections
 * (src/hub/retry.ts). The API key travels in the URL for SerpAPI and Google, so nothing
 * that leaves here (errors, retry notices) holds the URL's query string or any secret.
 */
import { withRetries } from "../../hub/retry.js";
import { HttpConnectionError, HttpStatusError, requestJson } from "../../runtime/http-client.js";
import { AnswerError, type UpstreamRequest } from "./provider.js";

export interface UpstreamSettings {
  /** Names the engine in messages ("serpapi"). */
  name: string;
  timeoutMs: number;
  retries: number;
  backoffS: number;
  concurrency: number;
  /** Values that must never appear in a message (API keys). */
  secrets: readonly string[];
  /** Told of each retry. */
  log: (line: string) => void;
}

/** A call that failed for good (after its retries): the message is safe to show. */
export class UpstreamError extends Error {}

export class Upstream {
  /** HTTP requests sent (retries included) and retries. */
  readonly stats = { requests: 0, retries: 0 };
  private active = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(private readonly settings: UpstreamSettings) {}

  /** Calls currently sent and not yet answered. */
  get inFlight(): number {
    return this.active;
  }

  /**
   * `read` applied to the parsed JSON answer; UpstreamError once the retries are spent, on a
   * refusal, or when `read` finds an error in the answer (AnswerError).
   */
  async call<T>(request: UpstreamRequest, read: (answer: unknown) => T): Promise<T> {
    const { name, retries, backoffS, timeoutMs, log } = this.settings;
    const where = endpoint(request.url);
    let attempts = 0;
    let answer: unknown;
    try {
      answer = await withRetries(
        () =>
          this.slot(() => {
            attempts++;
            this.stats.requests++;
            return requestJson(request.url, request.body, { timeoutMs, headers: request.headers });
          }),
        { retries, backoffS },
        undefined,
        (err, waitMs, n) => {
          this.stats.retries++;
          log(
            `${name} (${where}) ${this.reason(err)}; retry ${n}/${retries} in ${(waitMs / 1000).toFixed(2)} s`,
          );
        },
      );
    } catch (err) {
      const tries = attempts > 1 ? ` (after ${attempts} attempts)` : "";
      throw new UpstreamError(`${name} (${where}) ${this.reason(err)}${tries}`);
    }
    try {
      return read(answer);
    } catch (err) {
      if (!(err instanceof AnswerError)) throw err;
      throw new UpstreamError(`${name} (${where}) answered with an error: ${this.reason(err)}`);
    }
  }

  /** Runs `task` once fewer than `concurrency` calls are in flight. */
  private async slot<T>(task: () => Promise<T>): Promise<T> {
    if (this.active >= this.settings.concurrency) {
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else this.active++;
    try {
      return await task();
    } finally {
      // The slot passes straight to the next waiter, or is freed.
      const next = this.waiting.shift();
      if (next) next();
      else this.active--;
    }
  }

  /** What went wrong, without the URL's query string or any secret. */
  private reason(err: unknown): string {
    const text =
      err instanceof HttpStatusError
        ? `answered ${err.status}: ${err.detail}`
        : err instanceof HttpConnectionError
          ? err.message.slice(err.url.length + 2)
          : String((err as Error)?.message ?? err);
    return redact(text, this.settings.secrets);
  }
}

/** The URL without its query string (where SerpAPI and Google carry the key). */
export function endpoint(url: string): string {
  const u = new URL(url);
  return `${u.origin}${u.pathname}`;
}

/** `text` with every secret (and its URL-encoded form) replaced by `***`. */
function redact(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const s of secrets) {
    if (s === "") continue;
    for (const form of new Set([s, encodeURIComponent(s)])) out = out.split(form).join("***");
  }
  return out;
}
