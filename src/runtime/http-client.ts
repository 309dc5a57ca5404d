import http from "node:http";
import https from "node:https";

/**
 * JSON over HTTP for the agent's clients (engine, retriever). node:http rather than fetch:
 * fetch gives up on a response whose headers take over 300 s, and an engine busy with a
 * long queue on a CPU takes longer than that to answer a generation. Connections are kept
 * alive, so hundreds of concurrent trajectories do not open a socket per turn.
 */

const agents = {
  "http:": new http.Agent({ keepAlive: true, maxSockets: 1024 }),
  "https:": new https.Agent({ keepAlive: true, maxSockets: 1024 }),
};

/** The server answered, with a status other than 2xx. */
export class HttpStatusError extends Error {
  constructor(
    readonly url: string,
    readonly status: number,
    /** The server's own message: a JSON error body's `error.message`/`message`, or its text. */
    readonly detail: string,
  ) {
    super(`${url} answered ${status}: ${detail}`);
  }
}

/** The request never got an answer: refused, reset, timed out, DNS failure. */
export class HttpConnectionError extends Error {
  constructor(
    readonly url: string,
    readonly code: string,
    message: string,
  ) {
    super(`${url}: ${message}`);
  }
}

export interface RequestOptions {
  /** Milliseconds until the whole answer must have arrived; none by default. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Sent with the request (e.g. an API key header). */
  headers?: Record<string, string>;
}

/** POSTs `body` as JSON and parses the JSON answer; GET when body is undefined. */
export function requestJson(
  url: string,
  body: unknown,
  options: RequestOptions = {},
): Promise<unknown> {
  const target = new URL(url);
  const transport = target.protocol === "https:" ? https : http;
  const agent = agents[target.protocol as keyof typeof agents];
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const request = transport.request(
      target,
      {
        method: payload ? "POST" : "GET",
        agent,
        signal: options.signal,
        headers: {
          ...options.headers,
          ...(payload
            ? { "content-type": "application/json", "content-length": payload.length }
            : {}),
        },
      },
      (response) => {
        const chunks: Buffer[] = [];
        response.on("data", (chunk: Buffer) => chunks.push(chunk));
        response.on("error", (err) => reject(connectionError(url, err)));
        response.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          const status = response.statusCode ?? 0;
          if (status < 200 || status >= 300) {
            reject(new HttpStatusError(url, status, errorDetail(text)));
            return;
          }
          try {
            resolve(JSON.parse(text));
          } catch {
            reject(new HttpStatusError(url, status, `not JSON: ${text.slice(0, 200)}`));
          }
        });
      },
    );
    const timeoutMs = options.timeoutMs;
    if (timeoutMs !== undefined) {
      request.setTimeout(timeoutMs, () =>
        request.destroy(
          Object.assign(new Error(`no answer within ${timeoutMs / 1000} s`), {
            code: "ETIMEDOUT",
          }),
        ),
      );
    }
    request.on("error", (err) => reject(connectionError(url, err)));
    request.end(payload);
  });
}

function connectionError(url: string, err: Error): Error {
  if (err.name === "AbortError") return err;
  const code = (err as NodeJS.ErrnoException).code ?? "ERR";
  const reason =
    code === "ECONNREFUSED"
      ? "connection refused (is the server running?)"
      : code === "ENOTFOUND"
        ? "host not found"
        : err.message;
  return new HttpConnectionError(url, code, reason);
}

function errorDetail(text: string): string {
  try {
    const parsed = JSON.parse(text) as { error?: { message?: string } | string; message?: string };
    if (typeof parsed.error === "object" && parsed.error?.message) return parsed.error.message;
    if (typeof parsed.error === "string") return parsed.error;
    if (typeof parsed.message === "string") return parsed.message;
  } catch {
    // not JSON: the text itself
  }
  return text.trim().slice(0, 300) || "(empty body)";
}
