/**
 * Serper (https://google.serper.dev/search): `POST {"q": ...}` with the key in `X-API-KEY`.
 * Search-R1 has no Serper server; its answer is mapped as serp_search_server.py maps
 * SerpAPI's, section for section: `answerBox`, then `organic`, then `peopleAlsoAsk` (the
 * question as the title), each result's title and snippet, the first topk kept.
 */
import {
  listOf,
  objectOf,
  type Provider,
  type ProviderSettings,
  type SearchDocument,
  searchDocument,
} from "./provider.js";

export const SERPER_URL = "https://google.serper.dev/search";
export const SERPER_KEY_ENV = ["SERPER_API_KEY"] as const;

export function serper(settings: ProviderSettings): Provider {
  const key = settings.keys.SERPER_API_KEY as string;
  return {
    cacheName: "serper",
    prepare: (query) => query,
    request: (query) => ({ url: settings.url, body: { q: query }, headers: { "X-API-KEY": key } }),
    documents: (answer, topk) => {
      const a = objectOf(answer) ?? {};
      const docs: SearchDocument[] = [];
      const box = objectOf(a.answerBox);
      if (box && Object.keys(box).length > 0) {
        docs.push(searchDocument(box.title, box.snippet, box.link));
      }
      for (const r of listOf(a.organic)) docs.push(searchDocument(r.title, r.snippet, r.link));
      for (const r of listOf(a.peopleAlsoAsk)) {
        docs.push(searchDocument(r.question, r.snippet, r.link));
      }
      return docs.slice(0, topk);
    },
  };
}
