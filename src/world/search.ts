/**
 * BM25 search over a `searchr1 build-index` folder in this thread, returning passages as
 * serve-retriever returns them. The demonstrations are built from real retrieval results;
 * the retriever's thread pool (openRetriever) is not used because its workers are compiled
 * files, and this runs from sources under the test runner too.
 */
import type { Passage } from "../agent/observation.js";
import { Bm25Engine, loadShared } from "../retrieval/bm25/engine.js";
import { readMeta } from "../retrieval/bm25/format.js";
import { openCorpusStore } from "../retrieval/corpus-store.js";

export interface PassageSearch {
  /** The top `topk` passages of each query, best first (ties by row, as the server). */
  search(queries: readonly string[], topk: number): Promise<Passage[][]>;
  close(): Promise<void>;
}

/** Opens the BM25 index in `indexDir`, checking that `corpus` is the file it was built from. */
export async function openIndexSearch(indexDir: string, corpus: string): Promise<PassageSearch> {
  const meta = await readMeta(indexDir);
  const store = await openCorpusStore(indexDir, corpus, meta.corpus);
  const engine = new Bm25Engine(loadShared(indexDir, meta));
  return {
    async search(queries, topk) {
      const hits = engine.search(queries, topk);
      const texts = await store.read(hits.flat().map((h) => h.row));
      let next = 0;
      return hits.map((list) =>
        list.map(() => {
          const row = JSON.parse(texts[next++] as string) as { id: unknown; contents: string };
          return { id: String(row.id), contents: row.contents };
        }),
      );
    },
    async close() {
      engine.close();
      await store.close();
    },
  };
}
