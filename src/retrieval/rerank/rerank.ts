/**
 * Reranking as Search-R1's rerank servers do it (search_r1/search/rerank_server.py
 * `BaseCrossEncoder.rerank`, retrieval_rerank_server.py): each (query, passage) pair scored by
 * the cross-encoder, the passages sorted by that score alone (the retriever's is dropped),
 * best first, the top k kept. Two of upstream's bugs are not copied: a query is scored
 * against its own candidates only (upstream pairs every query with every query's
 * documents), and every query gets its list, in order (upstream leaves out a query without
 * documents, shifting the lists after it).
 */
import type { CrossEncoder } from "./cross-encoder.js";

/** A document to rerank: what comes back (`doc`) and the text it is scored on. */
export interface Candidate<D> {
  doc: D;
  /** The corpus's `contents`: `"Title"\ntext`. */
  contents: string;
}

export interface Scored<D> {
  doc: D;
  score: number;
}

/**
 * rerank_server.py `_passage_to_string`: the first line is the title (its quotes kept),
 * the rest the text: `(Title: "Paris") Paris is ...`.
 */
export function passageText(contents: string): string {
  const lines = contents.split("\n");
  return `(Title: ${lines[0]}) ${lines.slice(1).join("\n")}`;
}

/**
 * The candidates of each query, scored against that query, best first (equal scores keep
 * their order, as Python's sorted does), at most `topk` per query. One call of the model
 * for all pairs.
 */
export async function rerankLists<D>(
  encoder: CrossEncoder,
  queries: readonly string[],
  candidates: readonly (readonly Candidate<D>[])[],
  topk: number,
): Promise<Scored<D>[][]> {
  const pairs = queries.flatMap((q, i) =>
    (candidates[i] ?? []).map((c) => [q, passageText(c.contents)] as const),
  );
  const scores = await encoder.score(pairs);
  let at = 0;
  return candidates.map((list) =>
    list
      .map((c) => ({ doc: c.doc, score: scores[at++] as number }))
      .sort((a, b) => b.score - a.score)
      .slice(0, topk),
  );
}
