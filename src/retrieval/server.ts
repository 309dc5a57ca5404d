/**
 * The retrieval server: a drop-in for Search-R1's `retrieval_server.py` (`POST /retrieve`)
 * with `GET /health`.
 *
 * Built on `node:http` directly, not a framework: there are only two routes, and the
 * server needs full control over what frameworks hide or decide for it: where a body
 * stops being read (`max_body_mb`: answer 413 and keep serving), keep-alive (trainers
 * hold ~120 pooled connections; an idle timeout shorter than theirs makes requests race
 * a closing socket), and draining on SIGTERM (stop accepting, let in-flight requests
 * finish, close idle keep-alive connections). The server shell that does all of this is
 * shared with serve-engine: JsonHttpServer in src/runtime/http-server.ts; the routes are
 * shared with the web search server (server-routes.ts, online/server.ts).
 *
 * Documents are the corpus rows' JSON text, embedded verbatim: the response carries the
 * row object exactly as it is in the corpus file, as Search-R1's dense path returns it.
 *
 * With a reranker (rerank/), `/retrieve` retrieves then reranks (the retriever given is a
 * RerankingRetriever) and `POST /rerank` reranks the documents a client sends, as
 * Search-R1's retrieval_rerank_server.py and rerank_server.py do.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { drained, HttpError, readJsonBody } from "../runtime/http-server.js";
import type { CorpusStore } from "./corpus-store.js";
import type { CorpusInfo } from "./open-retriever.js";
import { rerankLists } from "./rerank/rerank.js";
import { parseRerankRequest } from "./rerank/rerank-request.js";
import { RerankingRetriever } from "./rerank/reranking-retriever.js";
import type { Hit, Retriever } from "./retriever.js";
import { parseRetrieveRequest, type RequestLimits } from "./server-request.js";
import { type RetrieveListen, RetrieveServer } from "./server-routes.js";

export interface ServerLimits extends RequestLimits {
  /** Largest request body in bytes (more: 413). */
  maxBodyBytes: number;
}

export interface RetrievalServerOptions extends RetrieveListen {
  /** A RerankingRetriever serves `/rerank` too. */
  retriever: Retriever;
  corpus: CorpusStore;
  corpusInfo: CorpusInfo;
  /** Documents per query when a request's topk (/rerank: rerank_topk) is missing, null or 0. */
  defaultTopk: number;
  limits: ServerLimits;
}

/** Documents read and written at a time: bounds the memory a big response takes. */
const WRITE_DOCS = 4096;

/** `url` is the `/retrieve` URL clients use; `close()` gives requests in flight 30 s. */
export class RetrievalServer extends RetrieveServer {
  private constructor(private readonly options: RetrievalServerOptions) {
    super(options);
  }

  /** Starts listening; rejects with the listen error (EADDRINUSE, EACCES, ...). */
  static async listen(options: RetrievalServerOptions): Promise<RetrievalServer> {
    const s = new RetrievalServer(options);
    await s.start();
    return s;
  }

  private get reranking(): RerankingRetriever | null {
    const r = this.options.retriever;
    return r instanceof RerankingRetriever ? r : null;
  }

  protected override routes(): string {
    return this.reranking
      ? "POST /retrieve, POST /rerank and GET /health"
      : "POST /retrieve and GET /health (POST /rerank with --reranker)";
  }

  protected override async route(
    req: IncomingMessage,
    res: ServerResponse,
    path: string,
  ): Promise<void> {
    if (path !== "/rerank" || !this.reranking) return super.route(req, res, path);
    if (req.method !== "POST") {
      throw new HttpError(405, `${req.method} /rerank: use POST with a JSON body`, {
        Allow: "POST",
      });
    }
    return this.rerank(req, res, this.reranking);
  }

  protected health(): Record<string, unknown> {
    const { retriever, corpusInfo, defaultTopk, limits } = this.options;
    const reranking = this.reranking;
    return {
      retriever: retriever.kind,
      documents: retriever.documents,
      index: retriever.describe(),
      ...(reranking
        ? {
            reranker: {
              ...reranking.encoder.describe(),
              retrieval_topk: reranking.retrievalTopk,
            },
          }
        : {}),
      corpus: corpusInfo,
      topk: defaultTopk,
      limits: {
        max_queries: limits.maxQueries,
        max_topk: limits.maxTopk,
        max_body_mb: limits.maxBodyBytes / 2 ** 20,
      },
    };
  }

  protected async retrieve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const { limits, defaultTopk, retriever } = this.options;
    const body = await readJsonBody(req, limits.maxBodyBytes, "send fewer queries per request");
    const request = parseRetrieveRequest(body, defaultTopk, limits);
    const hits = request.queries.length
      ? await retriever.search(request.queries, request.topk)
      : [];
    await this.writeResult(res, hits, request.returnScores);
  }

  /** `{"result": [[doc, ...], ...]}` or with scores `[[{"document": doc, "score": s}]]`. */
  private async rerank(
    req: IncomingMessage,
    res: ServerResponse,
    reranking: RerankingRetriever,
  ): Promise<void> {
    const { limits, defaultTopk } = this.options;
    const body = await readJsonBody(req, limits.maxBodyBytes, "send fewer documents per request");
    const request = parseRerankRequest(body, defaultTopk, limits);
    const lists = await rerankLists(
      reranking.encoder,
      request.queries,
      request.documents,
      request.topk,
    );
    const result = lists.map((list) =>
      list.map(({ doc, score }) => (request.returnScores ? { document: doc, score } : doc)),
    );
    this.sendJson(res, 200, { result });
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
      return this.sendJsonText(res, 200, text);
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
