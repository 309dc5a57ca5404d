/**
 * The `POST /rerank` request of Search-R1's rerank_server.py (`RerankRequest`: `queries:
 * list[str]`, `documents: list[list[dict]]`, `rerank_topk: Optional[int]`, `return_scores:
 * bool = False`), checked field by field. A document is a corpus row `{"id", "contents"}` or
 * what `/retrieve` returns with scores, `{"document": {"id", "contents"}, "score"}` (upstream's
 * `_passage_to_string` reads both); the row object is what comes back.
 */
import { HttpError, typeOf } from "../../runtime/http-server.js";
import { type RequestLimits, readQueries, readReturnScores, readTopk } from "../server-request.js";
import type { Candidate } from "./rerank.js";

export interface RerankRequest {
  queries: string[];
  /** Each query's own documents: the row object (returned) and its contents (scored). */
  documents: Candidate<Record<string, unknown>>[][];
  topk: number;
  returnScores: boolean;
}

/** Reads the parsed JSON body; throws HttpError 400/413 naming the field at fault. */
export function parseRerankRequest(
  body: unknown,
  defaultTopk: number,
  limits: RequestLimits,
): RerankRequest {
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new HttpError(
      400,
      `request body must be a JSON object like {"queries": ["..."], "documents": [[{"id": "0", "contents": "..."}]], "rerank_topk": 3, "return_scores": true}, got ${typeOf(body)}`,
    );
  }
  const b = body as Record<string, unknown>;
  const queries = readQueries(b, limits.maxQueries);
  const lists = b.documents;
  if (!Array.isArray(lists)) {
    throw new HttpError(
      400,
      `"documents" must be a list with one list of documents per query, got ${typeOf(lists)}`,
    );
  }
  if (lists.length !== queries.length) {
    throw new HttpError(
      400,
      `"documents" has ${lists.length} lists for ${queries.length} queries: give each query its own list`,
    );
  }
  const documents = lists.map((list, i) => {
    if (!Array.isArray(list)) {
      throw new HttpError(
        400,
        `"documents[${i}]" must be a list of documents, got ${typeOf(list)}`,
      );
    }
    if (list.length > limits.maxTopk) {
      throw new HttpError(
        400,
        `"documents[${i}]" has ${list.length} documents, more than this server's limit of ${limits.maxTopk} (--max-topk)`,
      );
    }
    return list.map((item, j) => candidate(item, `documents[${i}][${j}]`));
  });
  return {
    queries,
    documents,
    topk: readTopk(b.rerank_topk, defaultTopk, limits.maxTopk, "rerank_topk"),
    returnScores: readReturnScores(b.return_scores),
  };
}

function candidate(item: unknown, where: string): Candidate<Record<string, unknown>> {
  const isObject = (v: unknown): v is Record<string, unknown> =>
    v !== null && typeof v === "object" && !Array.isArray(v);
  const doc = isObject(item) && "document" in item ? item.document : item;
  if (!isObject(doc) || typeof doc.contents !== "string") {
    throw new HttpError(
      400,
      `"${where}" must be a document {"id", "contents": "\\"Title\\"\\ntext"} (or {"document": {...}, "score"}), got ${JSON.stringify(item)?.slice(0, 200)}`,
    );
  }
  return { doc, contents: doc.contents };
}
