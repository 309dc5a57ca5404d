/**
 * `serve-retriever --retriever serpapi|serper|google`: Search-R1's online search servers
 * (serp_search_server.py, google_search_server.py) behind the same `POST /retrieve` as the
 * index server, with the request checked as it checks it (server-request.ts): documents
 * `{"id": <link>, "contents": "\"<title>\"\n<snippet>"}`, and with `return_scores` a score
 * that is the reciprocal rank (the engines give none; Search-R1's servers sent no score).
 * A query the engine fails on fails its request with 502 (replay-only's miss: 404) naming
 * the query; the server keeps serving.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { HttpError, readJsonBody } from "../../runtime/http-server.js";
import type { ServerLimits } from "../server.js";
import { parseRetrieveRequest } from "../server-request.js";
import { type RetrieveListen, RetrieveServer } from "../server-routes.js";
import { type OnlineSearch, QueryFailure } from "./online-search.js";

export interface OnlineServerOptions extends RetrieveListen {
  search: OnlineSearch;
  /** What `GET /health` says about the engine and the cache. */
  describe: Record<string, unknown>;
  /** Documents per query when a request's topk is missing, null or 0. */
  defaultTopk: number;
  limits: ServerLimits;
}

export class OnlineRetrievalServer extends RetrieveServer {
  private constructor(private readonly options: OnlineServerOptions) {
    super(options);
  }

  /** Starts listening; rejects with the listen error (EADDRINUSE, EACCES, ...). */
  static async listen(options: OnlineServerOptions): Promise<OnlineRetrievalServer> {
    const s = new OnlineRetrievalServer(options);
    await s.start();
    return s;
  }

  protected health(): Record<string, unknown> {
    const { describe, defaultTopk, limits, search } = this.options;
    return {
      ...describe,
      in_flight: search.inFlight,
      topk: defaultTopk,
      limits: {
        max_queries: limits.maxQueries,
        max_topk: limits.maxTopk,
        max_body_mb: limits.maxBodyBytes / 2 ** 20,
      },
      counters: search.counters,
    };
  }

  protected async retrieve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const { limits, defaultTopk, search } = this.options;
    const body = await readJsonBody(req, limits.maxBodyBytes, "send fewer queries per request");
    const request = parseRetrieveRequest(body, defaultTopk, limits);
    let documents: Awaited<ReturnType<OnlineSearch["search"]>>;
    try {
      documents = await search.search(request.queries, request.topk);
    } catch (err) {
      if (!(err instanceof QueryFailure)) throw err;
      throw new HttpError(err.replayMiss ? 404 : 502, err.message);
    }
    const result = documents.map((docs) =>
      request.returnScores ? docs.map((document, k) => ({ document, score: 1 / (k + 1) })) : docs,
    );
    this.sendJson(res, 200, { result });
  }
}
