/**
 * Serper (https://google.serper.dev/search): `POST {"q": ...}` with the key in `X-API-KEY`.
 * Search-R1 has no Serper server; its answer is mapped as serp_search_server.py maps
 * SerpAPI's, section for section: `answerBox`, then `organic`, then `peopleAlsoAsk` (the
 * question as the title), each result's title and snippet, the first topk kept.
 */
import { objectOf, type Provider, type ProviderSettings, sectionDocuments } from "./provider.js";

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
      return sectionDocuments(a.answerBox, a.organic, a.peopleAlsoAsk).slice(0, topk);
    },
  };
}
