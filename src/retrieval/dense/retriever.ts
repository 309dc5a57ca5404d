import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import type { ServiceError } from "../../runtime/errors.js";
import { loadEncoderTokenizer } from "../../text/encoder-tokenizer.js";
import type { TextTokenizer } from "../../text/tokenizer.js";
import type { Hit, Retriever, RetrieverKind } from "../retriever.js";
import {
  type EncoderInfo,
  type EncoderProcessOptions,
  type IndexInfo,
  IndexProcess,
} from "./index-process.js";
import type { DenseRecipe } from "./recipe.js";

export interface DenseOpenOptions
  extends Omit<EncoderProcessOptions, "pooling" | "normalize" | "index"> {
  kind: Exclude<RetrieverKind, "bm25">;
  index: string;
  recipe: DenseRecipe;
  /** HNSW beam width; null: serve's default (64). */
  efSearch: number | null;
  /** IVF lists probed; null: serve's default (64). */
  nprobe: number | null;
}

interface Pending {
  queries: readonly string[];
  topk: number;
  resolve: (hits: Hit[][]) => void;
  reject: (err: Error) => void;
}

/**
 * Dense retrieval as Search-R1 serves it: each query gets the recipe's prefix, is cut to
 * its max length by the model's own tokenizer, encoded by the native BERT encoder and
 * searched in the faiss index (exact for Flat, faiss's HNSW for HNSW files, faiss's IVF-PQ
 * for IVF files); a hit's row is the corpus row, as in Search-R1.
 *
 * Requests that arrive while a search is running wait and then go to the native process
 * together: one encoder call and one scan of the index for all of them (one call per
 * distinct topk, since HNSW's beam depends on k).
 */
export class DenseRetriever implements Retriever {
  private queue: Pending[] = [];
  private running = false;

  private constructor(
    readonly kind: RetrieverKind,
    private readonly process: IndexProcess,
    private readonly tokenizer: TextTokenizer,
    private readonly recipe: DenseRecipe,
    private readonly index: IndexInfo,
    private readonly encoder: EncoderInfo,
    private readonly searching: Pick<
      IndexProcess["info"],
      "fp16" | "ef_search" | "nprobe" | "rescore"
    >,
    private readonly pid: number | undefined,
  ) {}

  static async open(options: DenseOpenOptions): Promise<DenseRetriever> {
    const { recipe } = options;
    const process = await IndexProcess.start({
      ...options,
      pooling: recipe.pooling,
      normalize: recipe.normalize,
    });
    try {
      const { info } = process;
      if (info.index === null) throw new Error("searchr1-index serve opened no index");
      const maxLength = Math.min(recipe.maxLength, info.encoder.max_position_embeddings);
      const tokenizer = loadEncoderTokenizer(options.model, {
        maxLength,
        missing:
          "a dense retriever needs the encoder's tokenizer.json, or a BERT vocab.txt (--retriever-model)",
      });
      return new DenseRetriever(
        options.kind,
        process,
        tokenizer,
        { ...recipe, maxLength },
        info.index,
        info.encoder,
        info,
        process.pid,
      );
    } catch (err) {
      await process.shutdown();
      throw err;
    }
  }

  get documents(): number {
    return this.index.ntotal;
  }

  /** Told if the native process dies while serving. */
  onDeath(listener: (err: ServiceError) => void): void {
    this.process.onDeath(listener);
  }

  search(queries: readonly string[], topk: number): Promise<Hit[][]> {
    return new Promise((resolve, reject) => {
      this.queue.push({ queries, topk, resolve, reject });
      if (!this.running) void this.drain();
    });
  }

  private async drain(): Promise<void> {
    this.running = true;
    while (this.queue.length > 0) {
      const batch = this.queue;
      this.queue = [];
      const byTopk = new Map<number, Pending[]>();
      for (const p of batch) {
        const group = byTopk.get(p.topk);
        if (group) group.push(p);
        else byTopk.set(p.topk, [p]);
      }
      await Promise.all([...byTopk].map(([topk, group]) => this.searchGroup(group, topk)));
    }
    this.running = false;
  }

  private async searchGroup(group: Pending[], topk: number): Promise<void> {
    try {
      const texts = group.flatMap((p) => p.queries.map((q) => this.recipe.queryPrefix + q));
      const ids = await this.tokenizer.encodeBatch(texts, { addSpecialTokens: true });
      const reply = await this.process.search(ids, topk);
      let at = 0;
      for (const p of group) {
        const hits = p.queries.map((_, i) => {
          const rows = reply.ids[at + i] as number[];
          const scores = reply.scores[at + i] as number[];
          return rows.map((row, j) => ({ row, score: scores[j] as number }));
        });
        at += p.queries.length;
        p.resolve(hits);
      }
    } catch (err) {
      for (const p of group) p.reject(err as Error);
    }
  }

  describe(): Record<string, unknown> {
    const { path, type, metric, d, ntotal, bytes } = this.index;
    const { fp16, ef_search, nprobe, rescore } = this.searching;
    return {
      index: resolve(path),
      type,
      metric,
      d,
      ntotal,
      bytes,
      // The beam searches use (serve's default, or --ef-search), where a graph is searched.
      ...(ef_search !== null ? { ef_search } : {}),
      // The IVF lists each search probes (serve's default, or --nprobe), for an IVF index.
      ...(nprobe !== null ? { nprobe } : {}),
      rescore: rescore ? { from: resolve(rescore.path), candidates: rescore.candidates } : null,
      fp16,
      encoder: { ...this.encoder, max_length: this.recipe.maxLength },
      query_prefix: this.recipe.queryPrefix,
      rss_bytes: rssBytes(this.pid),
    };
  }

  close(): Promise<void> {
    return this.process.shutdown();
  }
}

/** Resident memory of a process (Linux /proc), or null where it cannot be read. */
export function rssBytes(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const kb = /^VmRSS:\s+(\d+) kB/m.exec(status)?.[1];
    return kb === undefined ? null : Number(kb) * 1024;
  } catch {
    return null;
  }
}
