import type { ServeRetrieverConfig } from "../config/schemas/serve-retriever.js";
import type { ServiceError } from "../runtime/errors.js";
import {
  drainOnSignal,
  listenError,
  onStopSignals,
  WILDCARD_HOSTS,
} from "../runtime/http-server.js";
import { createProgress } from "../runtime/progress.js";
import { defaultCorpusCache } from "./corpus-cache.js";
import { openRetriever } from "./open-retriever.js";
import { RetrievalServer } from "./server.js";

/**
 * `searchr1 serve-retriever`: opens the index and corpus, serves until SIGINT/SIGTERM,
 * then drains (requests in flight finish) and closes everything. Resolves on a clean stop.
 */
export async function serveRetriever(
  config: ServeRetrieverConfig,
  err: (line: string) => void = (line) => process.stderr.write(`${line}\n`),
): Promise<void> {
  const started = performance.now();
  const opened = await openRetriever({
    kind: config.retriever,
    index: config.index,
    corpus: config.corpus,
    threads: config.threads,
    dense: {
      model: config.retriever_model,
      pooling: config.pooling,
      maxLength: config.max_length,
      device: config.device,
      efSearch: config.ef_search,
      fp16: config.fp16,
      faissGpu: config.faiss_gpu,
      gpus: config.gpus,
      log: err,
      corpusCache: config.corpus_cache ?? defaultCorpusCache(),
      progress: createProgress(),
    },
  });
  let server: RetrievalServer;
  try {
    server = await RetrievalServer.listen({
      retriever: opened.retriever,
      corpus: opened.corpus,
      corpusInfo: opened.corpusInfo,
      defaultTopk: config.topk,
      limits: {
        maxQueries: config.max_queries,
        maxTopk: config.max_topk,
        maxBodyBytes: Math.floor(config.max_body_mb * 2 ** 20),
      },
      host: config.host,
      port: config.port,
      log: err,
    });
  } catch (e) {
    await opened.close();
    throw listenError(e as NodeJS.ErrnoException, config.host, config.port, "another retriever");
  }

  const seconds = (performance.now() - started) / 1000;
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
    opened.onDeath?.((e) => {
      removeSignals();
      void server.closeNow();
      resolve(e);
    });
  });
  // Announced only once the handlers are in place: a signal sent on seeing this line drains
  // the server instead of killing the process.
  err(
    `serving ${opened.retriever.kind} retrieval over ` +
      `${opened.retriever.documents.toLocaleString("en-US")} passages at ${server.url} ` +
      `(loaded in ${seconds.toFixed(1)} s)`,
  );
  const died = await stopped;
  await opened.close();
  if (died) throw died;
  err("retriever stopped");
}
