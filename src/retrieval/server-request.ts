/**
 * The `POST /retrieve` request, checked field by field the way Search-R1's pydantic model
 * reads it (`queries: List[str]`, `topk: Optional[int]`, `return_scores: bool = False`),
 * plus SkyRL's single-string `query`. Unknown fields are ignored, as pydantic does.
 */
import { HttpError, typeOf } from "../runtime/http-server.js";

export interface RequestLimits {
  /** Most queries in one request (more: 413). */
  maxQueries: number;
  /** Largest topk a request may ask for (more: 400). */
  maxTopk: number;
}

export interface RetrieveRequest {
  queries: string[];
  topk: number;
  returnScores: boolean;
}

/** Reads the parsed JSON body; throws HttpError 400/413 naming the field at fault. */
export function parseRetrieveRequest(
  body: unknown,
  defaultTopk: number,
  limits: RequestLimits,
): RetrieveRequest {
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new HttpError(
      400,
      `request body must be a JSON object like {"queries": ["..."], "topk": 3, "return_scores": true}, got ${typeOf(body)}`,
    );
  }
  const b = body as Record<string, unknown>;
  return {
    queries: readQueries(b, limits.maxQueries),
    topk: readTopk(b.topk, defaultTopk, limits.maxTopk),
    returnScores: readReturnScores(b.return_scores),
  };
}

export function readQueries(b: Record<string, unknown>, maxQueries: number): string[] {
  const hasList = b.queries !== undefined;
  const hasOne = b.query !== undefined;
  if (hasList && hasOne) {
    throw new HttpError(
      400,
      `give either "queries" (a list of strings) or "query" (a string), not both`,
    );
  }
  if (hasOne) {
    if (typeof b.query !== "string") {
      throw new HttpError(400, `"query" must be a string, got ${typeOf(b.query)}`);
    }
    return [b.query];
  }
  if (!hasList) {
    throw new HttpError(400, `"queries" is required: a list of strings (or "query": a string)`);
  }
  const queries = b.queries;
  if (!Array.isArray(queries)) {
    throw new HttpError(400, `"queries" must be a list of strings, got ${typeOf(queries)}`);
  }
  if (queries.length > maxQueries) {
    throw new HttpError(
      413,
      `"queries" has ${queries.length} queries, more than this server's limit of ${maxQueries} ` +
        "per request (send several requests, or restart the server with a larger --max-queries)",
    );
  }
  for (let i = 0; i < queries.length; i++) {
    if (typeof queries[i] !== "string") {
      throw new HttpError(400, `"queries[${i}]" must be a string, got ${typeOf(queries[i])}`);
    }
  }
  return queries as string[];
}

/** `field` ("topk", or /rerank's "rerank_topk"): missing, null or 0 mean `defaultTopk`. */
export function readTopk(
  value: unknown,
  defaultTopk: number,
  maxTopk: number,
  field = "topk",
): number {
  // Search-R1: a missing, null or 0 topk means the server's --topk.
  if (value === undefined || value === null || value === 0) return defaultTopk;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0) {
    throw new HttpError(400, `"${field}" must be a non-negative integer, got ${typeOf(value)}`);
  }
  if (value > maxTopk) {
    throw new HttpError(
      400,
      `"${field}" = ${value} is more than this server's limit of ${maxTopk} (--max-topk)`,
    );
  }
  return value;
}

export function readReturnScores(value: unknown): boolean {
  if (value === undefined) return false;
  if (typeof value !== "boolean") {
    throw new HttpError(400, `"return_scores" must be true or false, got ${typeOf(value)}`);
  }
  return value;
}
