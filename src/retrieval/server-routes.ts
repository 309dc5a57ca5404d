import type { IncomingMessage, ServerResponse } from "node:http";
import { HttpError, JsonHttpServer } from "../runtime/http-server.js";

/** Where a retrieval server listens; the rest of its HTTP shell is the same for every kind. */
export interface RetrieveListen {
  host: string;
  /** 0 = any free port (read it back from `port`). */
  port: number;
  /** Where unexpected failures are reported; default stderr. */
  log?: (line: string) => void;
}

/**
 * The routes of every `serve-retriever` server, over an index (server.ts) or a web search
 * engine (online/server.ts): `POST /retrieve`, `GET /health`, JSON 404/405 for the rest.
 * `url` is the `/retrieve` URL clients use; `close()` gives requests in flight 30 s.
 */
export abstract class RetrieveServer extends JsonHttpServer {
  protected constructor(listen: RetrieveListen) {
    super({
      name: "serve-retriever",
      host: listen.host,
      port: listen.port,
      urlPath: "/retrieve",
      requestTimeoutMs: 300_000,
      graceMs: 30_000,
      log: listen.log,
    });
  }

  /** Answers `POST /retrieve`. */
  protected abstract retrieve(req: IncomingMessage, res: ServerResponse): Promise<void>;

  /** The routes a 404 names. */
  protected routes(): string {
    return "POST /retrieve and GET /health";
  }

  /** The body of `GET /health`, after its `status` and `ready`. */
  protected abstract health(): Record<string, unknown>;

  protected async route(req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
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
      return this.sendJson(res, 200, {
        status: this.closing ? "closing" : "ok",
        ready: !this.closing,
        ...this.health(),
      });
    }
    throw new HttpError(
      404,
      `no route ${req.method} ${path}; this server answers ${this.routes()}`,
    );
  }
}
