/**
 * The pieces of a JSON-over-HTTP server that `serve-retriever` and `serve-engine` share:
 * errors answered as `{"error": "<message naming the field>"}`, a body read up to a limit
 * (413 as soon as it is known to be too large), a refused body read and dropped so the
 * client gets its answer, malformed HTTP answered in JSON, and listen errors as one line;
 * the server itself ({@link JsonHttpServer}: listening, requests in flight, draining) and
 * what SIGINT/SIGTERM do to it ({@link drainOnSignal}).
 */
import {
  createServer,
  type IncomingMessage,
  type OutgoingHttpHeaders,
  type Server,
  type ServerResponse,
  STATUS_CODES,
} from "node:http";
import type { AddressInfo, Socket } from "node:net";
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

/** Idle keep-alive connections are kept this long: longer than clients' pools keep them. */
const KEEP_ALIVE_MS = 65_000;

export interface JsonHttpServerOptions {
  /** The command, named in logged failures ("serve-engine"). */
  name: string;
  host: string;
  /** 0 = any free port (read it back from `port`). */
  port: number;
  /** What `url` adds to `http://host:port` ("" or e.g. "/retrieve"). */
  urlPath: string;
  /** How long one request may take, in ms; 0 = no limit. */
  requestTimeoutMs: number;
  /** How long `close()` lets requests in flight run before it cuts their connections. */
  graceMs: number;
  /** Where unexpected failures are reported; default stderr. */
  log?: (line: string) => void;
}

/**
 * A JSON-over-HTTP server on `node:http`: keep-alive longer than clients' pools, malformed
 * HTTP answered in JSON, the requests in flight counted, errors answered as
 * `{"error": message}` (a refused body dropped first), and draining: `close()` stops
 * accepting, lets requests in flight finish (their responses say `Connection: close`),
 * closes keep-alive connections as they turn idle, and cuts the rest after a grace period.
 * Subclasses answer requests in `route`.
 */
export abstract class JsonHttpServer {
  protected readonly log: (line: string) => void;
  private readonly server: Server;
  private active = 0;
  private stopping: Promise<void> | null = null;
  /**
   * Connections that have not sent a request yet. Node's closeIdleConnections leaves them
   * open, and a client's pool may hold one (undici, behind fetch and the `openai` client,
   * opens one after a request it aborted): draining closes them itself.
   */
  private readonly fresh = new Set<Socket>();

  protected constructor(private readonly shell: JsonHttpServerOptions) {
    this.log = shell.log ?? ((line) => process.stderr.write(`${line}\n`));
    this.server = createServer({ noDelay: true, keepAlive: true }, (req, res) =>
      this.onRequest(req, res),
    );
    this.server.keepAliveTimeout = KEEP_ALIVE_MS;
    this.server.headersTimeout = 60_000;
    this.server.requestTimeout = shell.requestTimeoutMs;
    this.server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) =>
      onClientError(err, socket),
    );
    this.server.on("connection", (socket: Socket) => {
      this.fresh.add(socket);
      socket.once("close", () => this.fresh.delete(socket));
    });
  }

  /** Answers one request (`path` without query string); a throw is answered by `fail`. */
  protected abstract route(req: IncomingMessage, res: ServerResponse, path: string): Promise<void>;

  /** Starts listening; rejects with the listen error (EADDRINUSE, EACCES, ...). */
  protected start(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.server.once("error", reject);
      this.server.listen(this.shell.port, this.shell.host, () => {
        this.server.off("error", reject);
        resolve();
      });
    });
  }

  get port(): number {
    return (this.server.address() as AddressInfo).port;
  }

  /** `http://host:port` and the URL path (the bound host; IPv6 in brackets). */
  get url(): string {
    const host = this.shell.host.includes(":") ? `[${this.shell.host}]` : this.shell.host;
    return `http://${host}:${this.port}${this.shell.urlPath}`;
  }

  /** Requests being answered now. */
  get inFlight(): number {
    return this.active;
  }

  /** `close` was called: the server is draining. */
  protected get closing(): boolean {
    return this.stopping !== null;
  }

  /**
   * Stops accepting connections, lets requests in flight finish (their responses say
   * `Connection: close`), closes idle keep-alive connections, and resolves when every
   * connection is gone. After `graceMs` (the server's grace by default) the remaining
   * connections are cut.
   */
  close(graceMs = this.shell.graceMs): Promise<void> {
    if (this.stopping) return this.stopping;
    this.stopping = new Promise<void>((resolve) => {
      const timer = setTimeout(() => this.server.closeAllConnections(), graceMs);
      timer.unref();
      this.server.close(() => {
        clearTimeout(timer);
        resolve();
      });
      this.server.closeIdleConnections();
      for (const socket of this.fresh) socket.destroy();
    });
    return this.stopping;
  }

  /** Cuts every connection now (a second Ctrl-C). */
  closeNow(): Promise<void> {
    const closing = this.close();
    this.server.closeAllConnections();
    return closing;
  }

  private onRequest(req: IncomingMessage, res: ServerResponse): void {
    this.fresh.delete(req.socket);
    this.active++;
    res.once("close", () => {
      this.active--;
      // A connection that turned idle after its last response: close it while draining.
      if (this.stopping) setImmediate(() => this.server.closeIdleConnections());
    });
    this.route(req, res, pathOf(req.url))
      .catch((err: unknown) => this.fail(req, res, err))
      .catch((err: unknown) => {
        this.log(`searchr1 ${this.shell.name}: ${(err as Error)?.stack ?? String(err)}`);
        res.destroy();
      });
  }

  /** The message answered with 500 for an error other than HttpError; logged by default. */
  protected serverError(err: unknown): string {
    this.log(`searchr1 ${this.shell.name}: ${(err as Error)?.stack ?? String(err)}`);
    return `internal error: ${(err as Error)?.message ?? String(err)}`;
  }

  private async fail(req: IncomingMessage, res: ServerResponse, err: unknown): Promise<void> {
    if (err instanceof ClientGone || res.destroyed) return;
    if (res.headersSent) {
      // Mid-way through an answer: the client sees a truncated response.
      this.log(`searchr1 ${this.shell.name}: error while answering: ${(err as Error)?.message}`);
      res.destroy();
      return;
    }
    let status = 500;
    let message: string;
    let headers: Record<string, string> = {};
    if (err instanceof HttpError) {
      status = err.status;
      message = err.message;
      headers = { ...err.headers };
    } else {
      message = this.serverError(err);
    }
    // A body this server will not read is dropped first (up to a limit), so that a client
    // still sending it gets to read the answer.
    if (!(await settleBody(req, res, headers))) return;
    this.sendJson(res, status, this.errorBody(req, status, message, err), headers);
  }

  /**
   * The JSON answered for an error: `{"error": message}`; a server whose routes speak
   * another protocol's error shape (serve-engine's OpenAI routes) answers it there.
   */
  protected errorBody(
    _req: IncomingMessage,
    _status: number,
    message: string,
    _err: unknown,
  ): unknown {
    return { error: message };
  }

  /** Writes the status and headers; while draining, says `Connection: close`. */
  protected writeHead(res: ServerResponse, status: number, headers: OutgoingHttpHeaders): void {
    if (this.stopping) headers.Connection = "close";
    res.writeHead(status, headers);
  }

  /** Answers `value` as JSON. */
  protected sendJson(
    res: ServerResponse,
    status: number,
    value: unknown,
    extra: Record<string, string> = {},
  ): void {
    this.sendJsonText(res, status, JSON.stringify(value), extra);
  }

  /** Answers JSON text already written. */
  protected sendJsonText(
    res: ServerResponse,
    status: number,
    text: string,
    extra: Record<string, string> = {},
  ): void {
    this.writeHead(res, status, {
      ...extra,
      "Content-Type": "application/json",
      "Content-Length": Buffer.byteLength(text),
    });
    res.end(text);
  }
}

/** Installs `handler` for SIGINT and SIGTERM; returns what removes it. */
export function onStopSignals(handler: (signal: NodeJS.Signals) => void): () => void {
  process.on("SIGINT", handler);
  process.on("SIGTERM", handler);
  return () => {
    process.off("SIGINT", handler);
    process.off("SIGTERM", handler);
  };
}

/**
 * What SIGINT/SIGTERM do to a serving server: the first drains it (`close()` with its
 * grace: requests in flight finish) and calls `closed` once it is closed; another cuts
 * every connection at once.
 */
export function drainOnSignal(
  server: Pick<JsonHttpServer, "inFlight" | "close" | "closeNow">,
  err: (line: string) => void,
  closed: () => void,
): (signal: NodeJS.Signals) => void {
  let signals = 0;
  return (signal) => {
    signals++;
    if (signals === 1) {
      const n = server.inFlight;
      err(
        `${signal}: stopping; ${n === 0 ? "no requests" : `${n} request${n === 1 ? "" : "s"}`} ` +
          "in flight to finish (again to stop at once)",
      );
      void server.close().then(closed);
    } else {
      err(`${signal}: closing all connections now`);
      void server.closeNow();
    }
  };
}
