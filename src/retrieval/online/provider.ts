/**
 * What one web search engine is to the online retriever: how one query is asked (the HTTP
 * request), and how its answer becomes Search-R1's documents. One file per engine
 * (serpapi.ts, serper.ts, google.ts) holds its request and response mapping.
 */

/** A document as Search-R1's online servers build it, with the result's link as its id. */
export interface SearchDocument {
  /** The result's URL; null where the engine gives none (an answer box without a link). */
  id: string | null;
  /** `"<title>"\n<snippet>`, as a wiki-18 corpus row's contents. */
  contents: string;
}

/** One call to the engine. */
export interface UpstreamRequest {
  /** With the query string (and the key, for engines that take it there). */
  url: string;
  /** A JSON body: POST; none: GET. */
  body?: unknown;
  headers?: Record<string, string>;
}

export interface Provider {
  /** Names the cache's folder: the engine and whatever changes its answers (SerpAPI's engine). */
  readonly cacheName: string;
  /** The query as sent: what the cache is keyed by; blank = no call, no documents. */
  prepare(query: string): string;
  /** The request for one prepared query. */
  request(query: string): UpstreamRequest;
  /** The documents of one answer, best first, at most `topk`; throws on an answer that holds an error. */
  documents(answer: unknown, topk: number): SearchDocument[];
}

/** The endpoint and the secrets a provider is built with. */
export interface ProviderSettings {
  url: string;
  /** Values of the provider's environment variables (`keyEnv`), by name. */
  keys: Record<string, string>;
}

/** The engine answered, but with an error instead of results (HTTP 200 with an error field). */
export class AnswerError extends Error {}

/**
 * Search-R1's document text (serp_search_server.py `_process_result`, google_search_server.py
 * `_retrieve_context`): the title in double quotes, a newline, the snippet, with its
 * stand-ins for a missing title or snippet.
 */
export function searchDocument(title: unknown, snippet: unknown, link: unknown): SearchDocument {
  const t = typeof title === "string" && title !== "" ? title : "No title.";
  const s = typeof snippet === "string" && snippet !== "" ? snippet : "No snippet available.";
  return { id: typeof link === "string" && link !== "" ? link : null, contents: `"${t}"\n${s}` };
}

/** `value` when it is a list, else none: engines leave out sections that have no results. */
export function listOf(value: unknown): Record<string, unknown>[] {
  return Array.isArray(value)
    ? value.filter((v): v is Record<string, unknown> => v !== null && typeof v === "object")
    : [];
}

/** `value` when it is a JSON object, else null. */
export function objectOf(value: unknown): Record<string, unknown> | null {
  return value !== null && typeof value === "object" && !Array.isArray(value)
    ? (value as Record<string, unknown>)
    : null;
}

/** A GET of `base` with `params` added to its query string. */
export function getRequest(base: string, params: Record<string, string>): UpstreamRequest {
  const url = new URL(base);
  for (const [name, value] of Object.entries(params)) url.searchParams.set(name, value);
  return { url: url.href };
}

/**
 * serp_search_server.py's order of an answer's sections: the answer box (when it has any
 * field), then the results, then the related questions (the question as the title).
 */
export function sectionDocuments(
  box: unknown,
  results: unknown,
  questions: unknown,
): SearchDocument[] {
  const docs: SearchDocument[] = [];
  const b = objectOf(box);
  if (b && Object.keys(b).length > 0) docs.push(searchDocument(b.title, b.snippet, b.link));
  for (const r of listOf(results)) docs.push(searchDocument(r.title, r.snippet, r.link));
  for (const r of listOf(questions)) docs.push(searchDocument(r.question, r.snippet, r.link));
  return docs;
}
