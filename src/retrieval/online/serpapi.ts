/**
 * SerpAPI (https://serpapi.com/search): `GET ?engine=google&q=...&api_key=...`, as Search-R1's
 * serp_search_server.py asks it. Its documents are built as that server builds them: the
 * answer box (title, snippet), then `organic_results`, then `related_questions` (the question
 * as the title); Search-R1 keeps topk of each (up to 2·topk+1 documents), here the first
 * topk of that list are kept, so a request's topk is honoured.
 */
import {
  AnswerError,
  getRequest,
  objectOf,
  type Provider,
  type ProviderSettings,
  sectionDocuments,
} from "./provider.js";

export const SERPAPI_URL = "https://serpapi.com/search";
export const SERPAPI_KEY_ENV = ["SERPAPI_API_KEY"] as const;

export function serpapi(settings: ProviderSettings, engine: string): Provider {
  const key = settings.keys.SERPAPI_API_KEY as string;
  return {
    cacheName: `serpapi-${engine}`,
    prepare: (query) => query,
    request: (query) => getRequest(settings.url, { engine, q: query, api_key: key }),
    documents: (answer, topk) => {
      const a = objectOf(answer) ?? {};
      const docs = sectionDocuments(a.answer_box, a.organic_results, a.related_questions);
      // SerpAPI answers a search that found nothing with 200, `"error": "Google hasn't
      // returned any results for this query."` and a search_metadata status of Success.
      const status = objectOf(a.search_metadata)?.status;
      if (docs.length === 0 && typeof a.error === "string" && status !== "Success") {
        throw new AnswerError(a.error);
      }
      return docs.slice(0, topk);
    },
  };
}
