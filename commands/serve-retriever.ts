import type { Command } from "commander";
import { defineCommand } from "../src/command/define.js";
import { serveRetrieverSpec } from "../src/config/schemas/serve-retriever.js";
import { serveRetriever } from "../src/retrieval/server-main.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: serveRetrieverSpec,
    description:
      "serve POST /retrieve exactly as Search-R1's retrieval servers do (BM25, or e5/bge over a faiss index file, optionally reranked by a cross-encoder with POST /rerank; or web search through SerpAPI, Serper or Google, cached)",
    flags: [
      { flags: "--retriever <kind>", key: "retriever" },
      { flags: "--index <path>", key: "index" },
      { flags: "--corpus <file>", key: "corpus" },
      { flags: "--topk <n>", key: "topk" },
      { flags: "--host <host>", key: "host" },
      { flags: "--port <port>", key: "port" },
      { flags: "--threads <n>", key: "threads" },
      { flags: "--max-queries <n>", key: "max_queries" },
      { flags: "--max-topk <n>", key: "max_topk" },
      { flags: "--max-body-mb <n>", key: "max_body_mb" },
      { flags: "--retriever-model <dir>", key: "retriever_model" },
      { flags: "--pooling <mean|cls>", key: "pooling" },
      { flags: "--max-length <n>", key: "max_length" },
      { flags: "--device <device>", key: "device" },
      { flags: "--ef-search <n>", key: "ef_search" },
      { flags: "--nprobe <n>", key: "nprobe" },
      { flags: "--rescore-from <file>", key: "rescore_from" },
      { flags: "--rescore-candidates <n>", key: "rescore_candidates" },
      { flags: "--fp16", key: "fp16" },
      { flags: "--corpus-cache <dir>", key: "corpus_cache" },
      { flags: "--gpus <n>", key: "gpus" },
      { flags: "--reranker <dir>", key: "reranker" },
      { flags: "--retrieval-topk <n>", key: "retrieval_topk" },
      { flags: "--rerank-topk <n>", key: "rerank_topk" },
      { flags: "--search-url <url>", key: "search_url" },
      { flags: "--search-cache <dir>", key: "search_cache" },
      { flags: "--replay-only", key: "replay_only" },
      // Search-R1's retrieval_server.py spellings, so its launch lines work unchanged.
      {
        flags: "--retriever_name <kind>",
        key: "retriever",
        description: "Search-R1's spelling of --retriever",
      },
      {
        flags: "--index_path <path>",
        key: "index",
        description: "Search-R1's spelling of --index",
      },
      {
        flags: "--corpus_path <file>",
        key: "corpus",
        description: "Search-R1's spelling of --corpus",
      },
      {
        flags: "--retriever_model <dir>",
        key: "retriever_model",
        description: "Search-R1's spelling of --retriever-model",
      },
      {
        flags: "--reranker_model <dir>",
        key: "reranker",
        description: "Search-R1's spelling of --reranker (retrieval_rerank_server.py)",
      },
      {
        flags: "--retrieval_topk <n>",
        key: "retrieval_topk",
        description: "Search-R1's spelling of --retrieval-topk",
      },
      {
        flags: "--reranking_topk <n>",
        key: "rerank_topk",
        description: "Search-R1's spelling of --rerank-topk",
      },
      {
        flags: "--reranker_batch_size <n>",
        key: "reranker_batch_size",
        description: "Search-R1's flag: pairs per forward pass of the reranker",
      },
      {
        flags: "--search_url <url>",
        key: "search_url",
        description: "Search-R1's spelling of --search-url",
      },
      {
        flags: "--serp_engine <engine>",
        key: "serp_engine",
        description: "Search-R1's flag: SerpAPI's engine (google)",
      },
      {
        flags: "--faiss_gpu",
        key: "faiss_gpu",
        description: "Search-R1's flag: the flat index on the GPU (fp16, sharded over --gpus)",
      },
    ],
    examples: [
      "searchr1 serve-retriever --retriever bm25 --index /data/bm25 --corpus /data/wiki-18.jsonl --port 8000",
      "searchr1 serve-retriever --index_path /data/bm25 --corpus_path /data/wiki-18.jsonl --topk 3 --retriever_name bm25",
      "searchr1 serve-retriever --index idx --corpus corpus.jsonl --host 0.0.0.0 --threads 8 max_queries=8192",
      "searchr1 serve-retriever --retriever e5 --index /data/e5_Flat.index --corpus /data/wiki-18.jsonl --retriever-model /models/e5-base-v2",
      "searchr1 serve-retriever --index_path /data/e5_HNSW64.index --corpus_path /data/wiki-18.jsonl --retriever_name e5 --retriever_model /models/e5-base-v2 --topk 3 --ef-search 256",
      "searchr1 serve-retriever --retriever e5 --index /data/e5_Flat.index --corpus /data/wiki-18.jsonl --retriever-model /models/e5-base-v2 --reranker /models/ms-marco-MiniLM-L12-v2 --retrieval-topk 10 --rerank-topk 3",
      "searchr1 serve-retriever --retriever serpapi --search_url https://serpapi.com/search --topk 3",
      "searchr1 serve-retriever --retriever serper --search-cache /data/search-cache search_concurrency=32",
      "searchr1 serve-retriever --retriever serper --search-cache /data/search-cache --replay-only",
    ],
    run: (config) => serveRetriever(config),
  });
}
