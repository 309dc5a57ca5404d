import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import { denseFields, retrieverKind } from "./dense.js";
import { listenFields, maxBodyField } from "./server-fields.js";
import { threadsField } from "./shared.js";

/** The web search engines' keys (serpapi, serper, google); their API keys are env-only. */
const onlineFields = {
  search_url: z
    .string()
    .url()
    .nullable()
    .default(null)
    .describe(
      "the search engine's endpoint (Search-R1's --search_url); null = the provider's own; a proxy or stand-in that speaks the provider's format works",
    ),
  serp_engine: z
    .string()
    .min(1)
    .default("google")
    .describe("SerpAPI's engine parameter (Search-R1's --serp_engine)"),
  search_cache: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "folder of the web search cache (by engine, query and topk); null = ~/.cache/searchr1/search",
    ),
  search_cache_days: z
    .number()
    .min(0)
    .nullable()
    .default(7)
    .describe(
      "days a cached search answers before it is asked again (0 = always ask, still recorded; null = never expires)",
    ),
  replay_only: z
    .boolean()
    .default(false)
    .describe(
      "answer web searches from the cache only, never calling the engine (a miss is an error): reproducible evals",
    ),
  search_timeout_s: z
    .number()
    .positive()
    .default(30)
    .describe("seconds one call to the search engine may take"),
  search_retries: z
    .number()
    .int()
    .min(0)
    .default(3)
    .describe("retries of a search call that got 429, 5xx, a timeout or a dropped connection"),
  search_backoff_s: z
    .number()
    .positive()
    .default(1)
    .describe("first wait before a retry; doubles each retry (capped at 30 s), with jitter"),
  search_concurrency: z
    .number()
    .int()
    .positive()
    .default(16)
    .describe("most calls to the search engine at once (verl's rate_limit)"),
};

/** Web search engines served behind `POST /retrieve` (src/retrieval/online/). */
export const onlineRetrieverKinds = ["serpapi", "serper", "google"] as const;
export type OnlineRetrieverKind = (typeof onlineRetrieverKinds)[number];

export const serveRetrieverSchema = z.strictObject({
  retriever: z
    .enum([...retrieverKind.unwrap().options, ...onlineRetrieverKinds])
    .default("bm25")
    .describe(
      `${retrieverKind.description}; or a web search engine: serpapi, serper or google (Custom Search), with the key in SERPAPI_API_KEY, SERPER_API_KEY, or GOOGLE_API_KEY and GOOGLE_CSE_ID`,
    ),
  index: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "index folder (bm25, from build-index) or faiss index file (e5_Flat.index, e5_HNSW64.index, an IVF-PQ file); required for bm25, e5, bge",
    ),
  corpus: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe("corpus jsonl the index was built from; required for bm25, e5, bge"),
  ...denseFields,
  ef_search: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe(
      "HNSW beam width; null = 64 (recall@10 about 0.99), not the efSearch stored in the file (16 in faiss's and Search-R1's)",
    ),
  nprobe: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe(
      "IVF-PQ lists probed per query; null = the larger of 64 and nlist/8 (rescored recall@3 0.958 at 1M vectors, IVF1024,PQ96), not the nprobe stored in the file (1 in faiss's)",
    ),
  rescore_from: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "Flat faiss file of the index's vectors (e5_Flat.index): each query's top candidates are rescored exactly from it (memory-mapped) and re-sorted",
    ),
  rescore_candidates: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe(
      "with rescore_from: candidates rescored per result, the index's top k*N (null = 4; 16 for an IVF-PQ index, whose PQ codes rank coarsely)",
    ),
  fp16: z
    .boolean()
    .default(false)
    .describe("keep the flat vectors in memory as fp16: half the RAM, scores rounded to fp16"),
  faiss_gpu: z
    .boolean()
    .default(false)
    .describe(
      "Search-R1's flag: a flat index on the GPU(s) in fp16 (HNSW graphs and IVF-PQ lists stay on the CPU); without a usable GPU, the CPU after a note",
    ),
  gpus: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe("GPUs a --faiss_gpu index is sharded over (null = one)"),
  corpus_cache: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "folder for the row store of a dense index's corpus; null = ~/.cache/searchr1/corpus",
    ),
  topk: z
    .number()
    .int()
    .positive()
    .default(3)
    .describe("documents per query when a request omits topk"),
  reranker: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "cross-encoder folder (BertForSequenceClassification, one label: cross-encoder/ms-marco-MiniLM-L12-v2): /retrieve returns the best of retrieval_topk passages by its scores, and POST /rerank serves (Search-R1's retrieval_rerank_server.py, rerank_server.py); bm25, e5, bge",
    ),
  retrieval_topk: z
    .number()
    .int()
    .positive()
    .default(10)
    .describe(
      "with a reranker: passages retrieved per query and reranked (a request's larger topk retrieves that many)",
    ),
  rerank_topk: z
    .number()
    .int()
    .positive()
    .nullable()
    .default(null)
    .describe(
      "with a reranker: documents per query after reranking when a request names none (/retrieve's topk, /rerank's rerank_topk); null = topk",
    ),
  reranker_batch_size: z
    .number()
    .int()
    .positive()
    .default(32)
    .describe("with a reranker: (query, passage) pairs per forward pass of the cross-encoder"),
  ...listenFields(8000),
  threads: threadsField("search threads"),
  max_queries: z
    .number()
    .int()
    .positive()
    .default(4096)
    .describe("most queries in one request (more: 413)"),
  max_topk: z
    .number()
    .int()
    .positive()
    .default(1000)
    .describe("largest topk a request may ask for (more: 400)"),
  max_body_mb: maxBodyField(16),
  ...onlineFields,
});

export type ServeRetrieverConfig = z.infer<typeof serveRetrieverSchema>;

export const serveRetrieverSpec: CommandConfigSpec<typeof serveRetrieverSchema> = {
  command: "serve-retriever",
  schema: serveRetrieverSchema,
  env: { SEARCHR1_RETRIEVER_PORT: "port" },
};
