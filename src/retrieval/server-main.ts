import {
  type OnlineRetrieverKind,
  onlineRetrieverKinds,
  type ServeRetrieverConfig,
} from "../config/schemas/serve-retriever.js";
import { type ServiceError, UsageError } from "../runtime/errors.js";
import {
  drainOnSignal,
  listenError,
  onStopSignals,
  WILDCARD_HOSTS,
} from "../runtime/http-server.js";
import { createProgress } from "../runtime/progress.js";
import { defaultCorpusCache } from "./corpus-cache.js";
import { openOnlineSearch } from "./online/open-search.js";
import { OnlineRetrievalServer } from "./online/server.js";
import { openRetriever } from "./open-retriever.js";
import { CrossEncoder } from "./rerank/cross-encoder.js";
import { RerankingRetriever } from "./rerank/reranking-retriever.js";
import { RetrievalServer, type ServerLimits } from "./server.js";
import type { RetrieveServer } from "./server-routes.js";

/** A server listening, and what its serving line says. */
interface Serving {
  server: RetrieveServer;
  /** "bm25 retrieval over 21,015,324 passages" */
  what: string;
  /** After the URL, in parentheses. */
  detail: string;
  close(): Promise<void>;
  onDeath?(listener: (err: ServiceError) => void): void;
}

/**
 * `searchr1 serve-retriever`: opens the index and corpus (or the web search engine), serves
 * until SIGINT/SIGTERM, then drains (requests in flight finish) and closes everything.
 * Resolves on a clean stop.
 */
export async function serveRetriever(
  config: ServeRetrieverConfig,
  err: (line: string) => void = (line) => process.stderr.write(`${line}\n`),
): Promise<void> {
  const kind = config.retriever;
  checkRerankKeys(config);
  checkRescoreKeys(config);
  const serving = isOnline(kind)
    ? await serveOnline(kind, config, err)
    : await serveIndex(config, err);
  const { server } = serving;
  if (WILDCARD_HOSTS.has(config.host)) {
    err(
      `warning: listening on ${config.host}: the retriever is reachable from other machines ` +
        "and has no authentication; use --host 127.0.0.1 unless that is what you want",
    );
  }
  // A signal drains the server (30 s for requests in flight); a second cuts them. The
  // death of a process the retriever needs stops the server at once, as a failure.
  const stopped = new Promise<ServiceError | null>((resolve) => {
    const removeSignals = onStopSignals(
      drainOnSignal(server, err, () => {
        removeSignals();
        resolve(null);
      }),
    );
    serving.onDeath?.((e) => {
      removeSignals();
      void server.closeNow();
      resolve(e);
    });
  });
  // Announced only once the handlers are in place: a signal sent on seeing this line drains
  // the server instead of killing the process.
  err(`serving ${serving.what} at ${server.url} (${serving.detail})`);
  const died = await stopped;
  await serving.close();
  if (died) throw died;
  err("retriever stopped");
}

/** The reranker's keys do something only with a reranker, which needs corpus rows. */
function checkRerankKeys(config: ServeRetrieverConfig): void {
  if (config.reranker !== null && isOnline(config.retriever)) {
    throw new UsageError(
      `--reranker applies to bm25, e5 and bge (a corpus and its index), not --retriever ${config.retriever}`,
    );
  }
  if (config.reranker !== null) return;
  const set = [
    ["retrieval_topk", "--retrieval-topk", config.retrieval_topk !== 10],
    ["rerank_topk", "--rerank-topk", config.rerank_topk !== null],
    ["reranker_batch_size", "--reranker_batch_size", config.reranker_batch_size !== 32],
  ].find(([, , given]) => given);
  if (set) {
    throw new UsageError(
      `${set[1]} (${set[0]}) applies with a reranker: set --reranker <cross-encoder folder>`,
    );
  }
}

/**
 * Rescoring reads a dense index's vectors from a Flat file, named by --rescore-from; the
 * search beams (--ef-search, --nprobe) are a dense index's too.
 */
function checkRescoreKeys(config: ServeRetrieverConfig): void {
  if (config.rescore_candidates !== null && config.rescore_from === null) {
    throw new UsageError(
      "--rescore-candidates (rescore_candidates) applies with --rescore-from <Flat index file>",
    );
  }
  const given = (
    [
      ["--rescore-from", config.rescore_from],
      ["--ef-search", config.ef_search],
      ["--nprobe", config.nprobe],
    ] as const
  ).find(([, value]) => value !== null);
  if (given && (config.retriever === "bm25" || isOnline(config.retriever))) {
    throw new UsageError(
      `${given[0]} applies to a dense index (e5, bge), not --retriever ${config.retriever}`,
    );
  }
}

function isOnline(kind: ServeRetrieverConfig["retriever"]): kind is OnlineRetrieverKind {
  return (onlineRetrieverKinds as readonly string[]).includes(kind);
}

function limitsOf(config: ServeRetrieverConfig): ServerLimits {
  return {
    maxQueries: config.max_queries,
    maxTopk: config.max_topk,
    maxBodyBytes: Math.floor(config.max_body_mb * 2 ** 20),
  };
}

/** A BM25 index or a dense faiss file over its corpus. */
async function serveIndex(
  config: ServeRetrieverConfig,
  err: (line: string) => void,
): Promise<Serving> {
  const started = performance.now();
  for (const key of ["index", "corpus"] as const) {
    if (config[key] === null) {
      throw new UsageError(
        `missing required key "${key}": set it with --${key} (or serve a web search engine: ` +
          `--retriever ${onlineRetrieverKinds.join("|")})`,
      );
    }
  }
  const opened = await openRetriever({
    kind: config.retriever as "bm25" | "e5" | "bge",
    index: config.index as string,
    corpus: config.corpus as string,
    threads: config.threads,
    dense: {
      model: config.retriever_model,
      pooling: config.pooling,
      maxLength: config.max_length,
      device: config.device,
      efSearch: config.ef_search,
      nprobe: config.nprobe,
      rescoreFrom: config.rescore_from,
      rescoreCandidates: config.rescore_candidates,
      fp16: config.fp16,
      faissGpu: config.faiss_gpu,
      gpus: config.gpus,
      log: err,
      corpusCache: config.corpus_cache ?? defaultCorpusCache(),
      progress: createProgress(),
    },
  });
  let encoder: CrossEncoder | null = null;
  if (config.reranker !== null) {
    try {
      encoder = await CrossEncoder.open({
        model: config.reranker,
        device: config.device,
        threads: config.threads,
        batchSize: config.reranker_batch_size,
      });
    } catch (e) {
      await opened.close();
      throw e;
    }
  }
  const close = async () => {
    await Promise.all([opened.close(), encoder?.close()]);
  };
  const server = await listening(
    config,
    () =>
      RetrievalServer.listen({
        retriever: encoder
          ? new RerankingRetriever(opened.retriever, opened.corpus, encoder, config.retrieval_topk)
          : opened.retriever,
        corpus: opened.corpus,
        corpusInfo: opened.corpusInfo,
        defaultTopk: encoder ? (config.rerank_topk ?? config.topk) : config.topk,
        limits: limitsOf(config),
        host: config.host,
        port: config.port,
        log: err,
      }),
    close,
  );
  const seconds = (performance.now() - started) / 1000;
  return {
    server,
    what:
      `${opened.retriever.kind} retrieval over ` +
      `${opened.retriever.documents.toLocaleString("en-US")} passages` +
      (encoder ? `, reranked by ${config.reranker}` : ""),
    detail: `loaded in ${seconds.toFixed(1)} s`,
    close,
    onDeath: (listener) => {
      opened.onDeath?.(listener);
      encoder?.onDeath(listener);
    },
  };
}

/** A web search engine (src/retrieval/online/). */
async function serveOnline(
  kind: OnlineRetrieverKind,
  config: ServeRetrieverConfig,
  err: (line: string) => void,
): Promise<Serving> {
  const opened = openOnlineSearch(kind, config, err);
  const server = await listening(config, () =>
    OnlineRetrievalServer.listen({
      search: opened.search,
      describe: opened.describe,
      defaultTopk: config.topk,
      limits: limitsOf(config),
      host: config.host,
      port: config.port,
      log: err,
    }),
  );
  return {
    server,
    what: `${kind} web search`,
    detail: opened.summary,
    close: async () => {},
  };
}

/** `listen()`, or when it cannot listen, `close()` what was opened for it and say why. */
async function listening<S>(
  config: ServeRetrieverConfig,
  listen: () => Promise<S>,
  close: () => Promise<void> = async () => {},
): Promise<S> {
  try {
    return await listen();
  } catch (e) {
    await close();
    throw listenError(e as NodeJS.ErrnoException, config.host, config.port, "another retriever");
  }
}
