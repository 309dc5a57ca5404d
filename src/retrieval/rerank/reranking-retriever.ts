import { InputError } from "../../runtime/errors.js";
import type { CorpusStore } from "../corpus-store.js";
import type { Hit, Retriever } from "../retriever.js";
import type { CrossEncoder } from "./cross-encoder.js";
import { rerankLists } from "./rerank.js";

/**
 * Retrieve, then rerank (Search-R1's retrieval_rerank_server.py `/retrieve`): the retriever's
 * top `retrievalTopk` passages of each query (more when a request asks for more), scored by
 * the cross-encoder against that query, the best `topk` kept with the cross-encoder's scores.
 * The hits stay corpus rows, so documents come back as the retriever serves them
 * (`{"document": {"id", "contents"}, "score"}`, what Search-R1's generation.py reads), not as
 * upstream's reformatted string.
 */
export class RerankingRetriever implements Retriever {
  constructor(
    private readonly retriever: Retriever,
    private readonly corpus: CorpusStore,
    readonly encoder: CrossEncoder,
    readonly retrievalTopk: number,
  ) {}

  get kind() {
    return this.retriever.kind;
  }

  get documents(): number {
    return this.retriever.documents;
  }

  async search(queries: readonly string[], topk: number): Promise<Hit[][]> {
    const hits = await this.retriever.search(queries, Math.max(this.retrievalTopk, topk));
    const rows = [...new Set(hits.flat().map((h) => h.row))];
    const texts = await this.corpus.read(rows);
    const contents = new Map<number, string>();
    rows.forEach((row, i) => {
      contents.set(row, contentsOf(texts[i] as string, row));
    });
    const lists = await rerankLists(
      this.encoder,
      queries,
      hits.map((list) =>
        list.map((h) => ({ doc: h.row, contents: contents.get(h.row) as string })),
      ),
      topk,
    );
    return lists.map((list) => list.map(({ doc, score }) => ({ row: doc, score })));
  }

  describe(): Record<string, unknown> {
    return this.retriever.describe();
  }

  /** Closes the cross-encoder; the retriever wrapped is closed by whoever opened it. */
  close(): Promise<void> {
    return this.encoder.close();
  }
}

/** A corpus row's `contents` (the text the passage is scored on). */
function contentsOf(json: string, row: number): string {
  const value = (JSON.parse(json) as { contents?: unknown }).contents;
  if (typeof value !== "string") {
    throw new InputError(
      `corpus row ${row}: no "contents" string to rerank (expected {"id", "contents"})`,
    );
  }
  return value;
}
