/**
 * How Search-R1 turns text into a dense vector (search_r1/search/retrieval_server.py
 * `Encoder` and `pooling`; search_r1/search/index_builder.py `Index_Builder.encode_all` and
 * `MODEL2POOLING`), chosen from the
 * retriever's name as the original chooses it, by substring:
 *   - e5: "query: " before a query, "passage: " before a passage (the index builder adds
 *     it only when the method is exactly "e5");
 *   - bge: the instruction "Represent this sentence for searching relevant passages: "
 *     before a query, nothing before a passage, [CLS] pooling;
 *   - otherwise no prefix; mean pooling over the attention mask (e5, contriever, jina);
 *   - embeddings L2-normalised unless the name contains "dpr".
 * Texts are cut to `maxLength` tokens (special tokens included), as the tokenizer's
 * `truncation=True, max_length=256` does.
 */
export type Pooling = "mean" | "cls";

export interface DenseRecipe {
  /** The retriever's name, as given (Search-R1's `retriever_name` / `retrieval_method`). */
  name: string;
  queryPrefix: string;
  passagePrefix: string;
  pooling: Pooling;
  normalize: boolean;
  maxLength: number;
}

export const BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: ";
/** Search-R1's `retrieval_query_max_length` and build_index.sh's `--max_length`. */
export const DEFAULT_MAX_LENGTH = 256;

export function denseRecipe(
  name: string,
  options: { pooling?: Pooling | null; maxLength?: number | null } = {},
): DenseRecipe {
  const lower = name.toLowerCase();
  const bge = lower.includes("bge");
  return {
    name,
    queryPrefix: lower.includes("e5") ? "query: " : bge ? BGE_QUERY_INSTRUCTION : "",
    passagePrefix: name === "e5" ? "passage: " : "",
    pooling: options.pooling ?? (bge ? "cls" : "mean"),
    normalize: !lower.includes("dpr"),
    maxLength: options.maxLength ?? DEFAULT_MAX_LENGTH,
  };
}
