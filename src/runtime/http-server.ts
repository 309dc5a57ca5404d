/**
 * The pieces of a JSON-over-HTTP server that `serve-retriever` and `serve-engine` share:
 * errors answered as `{"error": "<message naming the field>"}`, a body read up to a limit
 * (413 as soon as it is known to be too large), a refused body read and dropped so the
 * client gets its answer, malformed HTTP answered in JSON, and listen errors as one line.
 */
import { type IncomingMessage, type ServerResponse, STATUS_CODES } from "node:http";
import type { Socket } from "node:net";
import { UsageError } from "./errors.js";

/** An error answered to the client: status, a message naming the field, extra headers. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = "HttpError";
  }
}

/** The client went away before its request was read: nothing to answer. */
export class ClientGone extends Error {}

/** After a refused body, this much more is read and dropped so the client sees the answer. */
export const DISCARD_BYTES = 64 << 20;
const DISCARD_MS = 10_000;

/** The path of a request URL, without query string or fragment. */
export function pathOf(url: string | undefined): string {
  const raw = url ?? "/";
  const q = raw.search(/[?#]/);
  return q < 0 ? raw : raw.slice(0, q);
}

/** How a JSON value is named in error messages: its type, and short scalars themselves. */
export function typeOf(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "a list";
  return typeof value === "object" ? "an object" : `${typeof value} ${JSON.stringify(value)}`;
}

/**
 * The whole body, or HttpError 413 as soon as it is known to pass `max` bytes; `advice`
 * tells the client what to do instead (e.g. "send fewer queries per request").
 */
export function readBody(req: IncomingMessage, max: number, advice: string): Promise<Buffer> {
  const limitMb = Math.round((max / 2 ** 20) * 100) / 100;
  const tooLarge = (size: string) =>
    new HttpError(
      413,
      `request body ${size} is larger than this server's limit of ${limitMb} MiB ` +
        `(${advice}, or restart the server with a larger --max-body-mb)`,
    );
  const declared = req.headers["content-length"];
  if (declared !== undefined && Number(declared) > max) {
    return Promise.reject(tooLarge(`(${declared} bytes)`));
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const cleanup = () => {
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("close", onClose);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > max) {
        cleanup();
        reject(tooLarge(`(more than ${max} bytes)`));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => {
      cleanup();
      resolve(Buffer.concat(chunks, size));
    };
    const onClose = () => {
      cleanup();
      reject(new ClientGone());
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("close", onClose);
  });
}

/** The body parsed as JSON; HttpError 400 when it is not JSON. */
export async function readJsonBody(
  req: IncomingMessage,
  max: number,
  advice: string,
): Promise<unknown> {
  const raw = await readBody(req, max, advice);
  try {
    return JSON.parse(raw.toString("utf8"));
  } catch (err) {
    throw new HttpError(400, `request body is not valid JSON (${(err as Error).message})`);
  }
}

/**
 * Reads and drops the rest of a refused body, up to a limit (past it, or after a while,
 * the connection is cut). Resolves true when the whole body was read.
 */
export function discardBody(req: IncomingMessage): Promise<boolean> {
  return new Promise((resolve) => {
    let seen = 0;
    const timer = setTimeout(() => cut(), DISCARD_MS);
    timer.unref();
    const done = (complete: boolean) => {
      clearTimeout(timer);
      resolve(complete);
    };
    const cut = () => {
      done(false);
      req.socket.destroy();
    };
    req.on("data", (chunk: Buffer) => {
      seen += chunk.length;
      if (seen > DISCARD_BYTES) cut();
    });
    req.once("end", () => done(true));
    req.once("close", () => done(req.complete));
    req.resume();
  });
}

/**
 * Before answering an error to a request whose body was not read: drops the body (up to a
 * limit) so that a client still sending it gets to read the answer. A keep-alive client is
 * answered at once (the connection lives on once the rest is dropped); one that asked for
 * `Connection: close` is answered after, as Node closes the socket on answering, and a
 * client that sends its whole body before reading would see a broken pipe. Returns false
 * when there is no one left to answer; may set `Connection: close` in `headers`.
 */
export async function settleBody(
  req: IncomingMessage,
  res: ServerResponse,
  headers: Record<string, string>,
): Promise<boolean> {
  if (!req.complete) {
    const declared = Number(req.headers["content-length"] ?? 0);
    if (declared > DISCARD_BYTES) headers.Connection = "close";
    else {
      const dropped = discardBody(req);
      if (!res.shouldKeepAlive && !(await dropped)) return false;
    }
  }
  return !res.destroyed;
}

/** Resolves when the response can take more data (or is gone). */
export function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.on("drain", done);
    res.on("close", done);
  });
}

/** Malformed HTTP (not JSON problems): a JSON answer, then the connection is closed. */
export function onClientError(err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === "ECONNRESET" || !socket.writable) {
    socket.destroy();
    return;
  }
  const status =
    err.code === "HPE_HEADER_OVERFLOW" ? 431 : err.code === "ERR_HTTP_REQUEST_TIMEOUT" ? 408 : 400;
  const body = JSON.stringify({ error: `malformed HTTP request (${err.code ?? err.message})` });
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}

/** Addresses that reach this machine from others. */
export const WILDCARD_HOSTS = new Set(["0.0.0.0", "::", "[::]", "::0"]);

/** A listen failure as one line naming the address and what to change. */
export function listenError(
  e: NodeJS.ErrnoException,
  host: string,
  port: number,
  /** What may already be running there, e.g. "another retriever". */
  other: string,
): Error {
  const where = `${host.includes(":") ? `[${host}]` : host}:${port}`;
  const why: Record<string, string> = {
    EADDRINUSE: `the address is in use (${other} running? pick another --port)`,
    EACCES: "permission denied (ports below 1024 need privileges; pick another --port)",
    EADDRNOTAVAIL: "this machine has no such address (--host)",
    ENOTFOUND: "unknown host name (--host)",
  };
  return new UsageError(
    `cannot listen on ${where}: ${why[e.code ?? ""] ?? e.message ?? String(e)}`,
  );
}
