/**
 * The retrieval server: a drop-in for Search-R1's `retrieval_server.py` (`POST /retrieve`)
 * with `GET /health`.
 *
 * Built on `node:http` directly, not a framework: there are only two routes, and the
 * server needs full control over what frameworks hide or decide for it: where a body
 * stops being read (`max_body_mb`: answer 413 and keep serving), keep-alive (trainers
 * hold ~120 pooled connections; an idle timeout shorter than theirs makes requests race
 * a closing socket), and draining on SIGTERM (stop accepting, let in-flight requests
 * finish, close idle keep-alive connections).
 *
 * Documents are the corpus rows' JSON text, embedded verbatim: the response carries the
 * row object exactly as it is in the corpus file, as Search-R1's dense path returns it.
 */
import {
  createServer,
  type IncomingMessage,
  type OutgoingHttpHeaders,
  type Server,
  type ServerResponse,
} from "node:http";
import type { AddressInfo, Socket } from "node:net";
import {
  ClientGone,
  drained,
  HttpError,
  onClientError,
  pathOf,
  readJsonBody,
  settleBody,
} from "../runtime/http-server.js";
import type { CorpusStore } from "./corpus-store.js";
import type { CorpusInfo } from "./open-retriever.js";
import type { Hit, Retriever } from "./retriever.js";
import { parseRetrieveRequest, type RequestLimits } from "./server-request.js";

export interface ServerLimits extends RequestLimits {
  /** Largest request body in bytes (more: 413). */
  maxBodyBytes: number;
}

export interface RetrievalServerOptions {
  retriever: Retriever;
  corpus: CorpusStore;
  corpusInfo: CorpusInfo;
  /** Documents per query when a request's topk is missing, null or 0. */
  defaultTopk: number;
  limits: ServerLimits;
  host: string;
  /** 0 = any free port (read it back from `port`). */
  port: number;
  /** Where unexpected failures are reported; default stderr. */
  log?: (line: string) => void;
}

/** Idle keep-alive connections are kept this long: longer than clients' pools keep them. */
const KEEP_ALIVE_MS = 65_000;
/** Documents read and written at a time: bounds the memory a big response takes. */
const WRITE_DOCS = 4096;

export class RetrievalServer {
  private readonly server: Server;
  private readonly log: (line: string) => void;
  private active = 0;
  private closing: Promise<void> | null = null;

  private constructor(private readonly options: RetrievalServerOptions) {
    this.log = options.log ?? ((line) => process.stderr.write(`${line}\n`));
    this.server = createServer({ noDelay: true, keepAlive: true }, (req, res) =>
      this.onRequest(req, res),
    );
    this.server.keepAliveTimeout = KEEP_ALIVE_MS;
    this.server.headersTimeout = 60_000;
    this.server.requestTimeout = 300_000;
    this.server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) =>
      onClientError(err, socket),
    );
  }

  /** Starts listening; rejects with the listen error (EADDRINUSE, EACCES, ...). */
  static async listen(options: RetrievalServerOptions): Promise<RetrievalServer> {
    const s = new RetrievalServer(options);
    await new Promise<void>((resolve, reject) => {
      s.server.once("error", reject);
      s.server.listen(options.port, options.host, () => {
        s.server.off("error", reject);
        resolve();
      });
    });
    return s;
  }

  get port(): number {
    return (this.server.address() as AddressInfo).port;
  }

  /** The `/retrieve` URL clients use (the bound host; IPv6 in brackets). */
  get url(): string {
    const host = this.options.host.includes(":") ? `[${this.options.host}]` : this.options.host;
    return `http://${host}:${this.port}/retrieve`;
  }

  /** Requests being answered now. */
  get inFlight(): number {
    return this.active;
  }

  /**
   * Stops accepting connections, lets requests in flight finish (their responses say
   * `Connection: close`), closes idle keep-alive connections, and resolves when every
   * connection is gone. After `graceMs` the remaining connections are cut.
   */
  close(graceMs = 30_000): Promise<void> {
    if (this.closing) return this.closing;
    this.closing = new Promise<void>((resolve) => {
      const timer = setTimeout(() => this.server.closeAllConnections(), graceMs);
      timer.unref();
      this.server.close(() => {
        clearTimeout(timer);
        resolve();
      });
      this.server.closeIdleConnections();
    });
    return this.closing;
  }

  /** Cuts every connection now (a second Ctrl-C). */
  closeNow(): Promise<void> {
    const closing = this.close();
    this.server.closeAllConnections();
    return closing;
  }

  private onRequest(req: IncomingMessage, res: ServerResponse): void {
    this.active++;
    res.once("close", () => {
      this.active--;
      // A connection that turned idle after its last response: close it while draining.
      if (this.closing) setImmediate(() => this.server.closeIdleConnections());
    });
    this.route(req, res)
      .catch((err: unknown) => this.fail(req, res, err))
      .catch((err: unknown) => {
        this.log(`searchr1 serve-retriever: ${(err as Error)?.stack ?? String(err)}`);
        res.destroy();
      });
  }

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = pathOf(req.url);
    if (path === "/retrieve") {
      if (req.method !== "POST") {
        throw new HttpError(405, `${req.method} /retrieve: use POST with a JSON body`, {
          Allow: "POST",
        });
      }
      return this.retrieve(req, res);
    }
    if (path === "/health") {
      if (req.method !== "GET" && req.method !== "HEAD") {
        throw new HttpError(405, `${req.method} /health: use GET`, { Allow: "GET, HEAD" });
      }
      return this.sendJson(res, 200, JSON.stringify(this.health()));
    }
    throw new HttpError(
      404,
      `no route ${req.method} ${path}; this server answers POST /retrieve and GET /health`,
    );
  }

  private health(): Record<string, unknown> {
    const { retriever, corpusInfo, defaultTopk, limits } = this.options;
    return {
      status: this.closing ? "closing" : "ok",
      ready: !this.closing,
      retriever: retriever.kind,
      documents: retriever.documents,
      index: retriever.describe(),
      corpus: corpusInfo,
      topk: defaultTopk,
      limits: {
        max_queries: limits.maxQueries,
        max_topk: limits.maxTopk,
        max_body_mb: limits.maxBodyBytes / 2 ** 20,
      },
    };
  }

  private async retrieve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const { limits, defaultTopk, retriever } = this.options;
    const body = await readJsonBody(req, limits.maxBodyBytes, "send fewer queries per request");
    const request = parseRetrieveRequest(body, defaultTopk, limits);
    const hits = request.queries.length
      ? await retriever.search(request.queries, request.topk)
      : [];
    await this.writeResult(res, hits, request.returnScores);
  }

  /**
   * `{"result": [[doc, ...], ...]}` or with scores `[[{"document": doc, "score": s}, ...]]`.
   * Small answers go out in one piece with a Content-Length; big ones are read from the
   * corpus and written a group of queries at a time, so memory stays bounded.
   */
  private async writeResult(
    res: ServerResponse,
    hits: readonly Hit[][],
    scores: boolean,
  ): Promise<void> {
    const groups = groupQueries(hits);
    if (groups.length === 1) {
      const text = `{"result":[${await this.renderGroup(hits, scores)}]}`;
      return this.sendJson(res, 200, text);
    }
    this.writeHead(res, 200, { "Content-Type": "application/json" });
    for (const [i, [from, to]] of groups.entries()) {
      const group = await this.renderGroup(hits.slice(from, to), scores);
      if (res.destroyed) return;
      if (!res.write(`${i === 0 ? '{"result":[' : ","}${group}`)) await drained(res);
    }
    res.end("]}");
  }

  private async renderGroup(hits: readonly Hit[][], scores: boolean): Promise<string> {
    const rows = [...new Set(hits.flatMap((list) => list.map((h) => h.row)))];
    const texts = await this.options.corpus.read(rows);
    const byRow = new Map<number, string>();
    for (let i = 0; i < rows.length; i++) byRow.set(rows[i] as number, texts[i] as string);
    return hits
      .map((list) => {
        const docs = list.map((h) => {
          const doc = byRow.get(h.row) as string;
          return scores ? `{"document":${doc},"score":${jsonNumber(h.score)}}` : doc;
        });
        return `[${docs.join(",")}]`;
      })
      .join(",");
  }

  private writeHead(res: ServerResponse, status: number, headers: OutgoingHttpHeaders): void {
    if (this.closing) headers.Connection = "close";
    res.writeHead(status, headers);
  }

  private sendJson(res: ServerResponse, status: number, text: string, extra = {}): void {
    this.writeHead(res, status, {
      ...extra,
      "Content-Type": "application/json",
      "Content-Length": Buffer.byteLength(text),
    });
    res.end(text);
  }

  private async fail(req: IncomingMessage, res: ServerResponse, err: unknown): Promise<void> {
    if (err instanceof ClientGone || res.destroyed) return;
    if (res.headersSent) {
      // Mid-way through a streamed answer: the client sees a truncated response.
      this.log(`searchr1 serve-retriever: error while answering: ${(err as Error)?.message}`);
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
      message = `internal error: ${(err as Error)?.message ?? String(err)}`;
      this.log(`searchr1 serve-retriever: ${(err as Error)?.stack ?? String(err)}`);
    }
    // A body this server will not read is dropped first (up to a limit), so that a client
    // still sending it gets to read the answer.
    if (!(await settleBody(req, res, headers))) return;
    this.sendJson(res, status, JSON.stringify({ error: message }), headers);
  }
}

/** [from, to) ranges of queries with about WRITE_DOCS documents each (at least one range). */
function groupQueries(hits: readonly Hit[][]): [number, number][] {
  const groups: [number, number][] = [];
  let from = 0;
  let docs = 0;
  for (let i = 0; i < hits.length; i++) {
    docs += (hits[i] as Hit[]).length;
    if (docs >= WRITE_DOCS && i + 1 < hits.length) {
      groups.push([from, i + 1]);
      from = i + 1;
      docs = 0;
    }
  }
  groups.push([from, hits.length]);
  return groups;
}

function jsonNumber(x: number): string {
  return Number.isFinite(x) ? String(x) : "null";
}
