/**
 * What the retrieval server needs from an index, whatever its kind. BM25 is the first
 * kind; the dense e5 index plugs in by implementing the same interface.
 */
export interface Hit {
  /** Corpus row number (0-based line of the corpus file): the document's identity. */
  row: number;
  score: number;
}

export interface Retriever {
  readonly kind: "bm25" | "e5";
  /** Number of documents the index covers (= corpus rows). */
  readonly documents: number;
  /**
   * Top-`topk` hits per query, best first, ties broken by ascending row number.
   * Many queries are evaluated together; the result has one list per query, in order.
   */
  search(queries: readonly string[], topk: number): Promise<Hit[][]>;
  /** Facts for `GET /health` (index path, sizes, parameters). */
  describe(): Record<string, unknown>;
  close(): Promise<void>;
}
