import { isRetryable } from "./http-errors.js";

export interface RetryPolicy {
  /** Further attempts after the first. */
  retries: number;
  /** First back-off in seconds; doubles each attempt, capped at 30 s, with jitter. */
  backoffS: number;
}

/** Waits, but wakes early (rejecting) when the signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Exponential back-off with jitter in [50%, 100%] of the step, so parallel clients spread out. */
export function backoffMs(attempt: number, policy: RetryPolicy): number {
  const step = Math.min(30, policy.backoffS * 2 ** attempt) * 1000;
  return step * (0.5 + Math.random() / 2);
}

/**
 * Runs `attempt` until it succeeds, a failure is not worth retrying, or retries run out.
 * `attempt` receives the attempt number so it can resume from where the last one stopped.
 */
export async function withRetries<T>(
  attempt: (n: number) => Promise<T>,
  policy: RetryPolicy,
  signal: AbortSignal | undefined,
  onRetry?: (err: unknown, waitMs: number, n: number) => void,
): Promise<T> {
  for (let n = 0; ; n++) {
    try {
      return await attempt(n);
    } catch (err) {
      if (signal?.aborted || n >= policy.retries || !isRetryable(err)) throw err;
      const wait = backoffMs(n, policy);
      onRetry?.(err, wait, n + 1);
      await sleep(wait, signal);
    }
  }
}
