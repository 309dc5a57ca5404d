/**
 * Google's Custom Search JSON API (https://www.googleapis.com/customsearch/v1): `GET
 * ?key=...&cx=...&q=...`, what google_search_server.py asks through googleapiclient's
 * `cse().list(q, cx)`. As that server does in its `--snippet_only` mode (the only mode that
 * runs): the query's punctuation becomes spaces; each item's snippet keeps only its
 * "..."-separated pieces of more than five words; an item with neither title nor snippet
 * left is dropped; the first topk are kept. Google closed the API to new customers and
 * ends it on 2027-01-01.
 */
import {
  getRequest,
  listOf,
  objectOf,
  type Provider,
  type ProviderSettings,
  type SearchDocument,
  searchDocument,
} from "./provider.js";

export const GOOGLE_URL = "https://www.googleapis.com/customsearch/v1";
export const GOOGLE_KEY_ENV = ["GOOGLE_API_KEY", "GOOGLE_CSE_ID"] as const;

export function google(settings: ProviderSettings): Provider {
  const key = settings.keys.GOOGLE_API_KEY as string;
  const cx = settings.keys.GOOGLE_CSE_ID as string;
  return {
    cacheName: "google",
    prepare: sanitizeQuery,
    request: (query) => getRequest(settings.url, { key, cx, q: query }),
    documents: (answer, topk) => {
      const docs: SearchDocument[] = [];
      for (const item of listOf(objectOf(answer)?.items)) {
        const title = typeof item.title === "string" ? item.title : "";
        const snippet = typeof item.snippet === "string" ? keptSnippet(item.snippet) : "";
        if (title !== "" || snippet !== "") docs.push(searchDocument(title, snippet, item.link));
      }
      return docs.slice(0, topk);
    },
  };
}

/** google_search_server.py `sanitize_search_query`: non-word characters to spaces, collapsed. */
function sanitizeQuery(query: string): string {
  return query
    .replace(/[^\p{L}\p{N}_\s]/gu, " ")
    .replace(/\s+/g, " ")
    .trim();
}

/** google_search_server.py `parse_snippet`: the "..."-separated pieces of more than five words. */
function keptSnippet(snippet: string): string {
  return snippet
    .split("...")
    .map((s) => s.trim())
    .filter((s) => s.split(/\s+/).length > 5)
    .join(" ");
}
