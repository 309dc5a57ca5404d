/**
 * What the retrieval server needs from an index, whatever its kind. BM25 is the first
 * kind; the dense e5 index plugs in by implementing the same interface.
 */
export interface Hit {
  /** Corpus row number (0-based line of the corpus file): the document's identity. */
  row: number;
  score: number;
}

/** BM25, or a dense retriever named by its encoder recipe (dense/recipe.ts). */
export type RetrieverKind = "bm25" | "e5" | "bge";

export interface Retriever {
  readonly kind: RetrieverKind;
  /** Number of documents the index covers (= corpus rows). */
  readonly documents: number;
  /**
   * Top-`topk` hits per query, best first (BM25 breaks ties by ascending row number;
   * dense retrievers return faiss's order).
   * Many queries are evaluated together; the result has one list per query, in order.
   */
  search(queries: readonly string[], topk: number): Promise<Hit[][]>;
  /** Facts for `GET /health` (index path, sizes, parameters). */
  describe(): Record<string, unknown>;
  close(): Promise<void>;
}
