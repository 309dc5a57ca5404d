import { stat } from "node:fs/promises";
import { join } from "node:path";
import { InputError, type ServiceError, UsageError } from "../../runtime/errors.js";
import { JsonLinesService } from "../../runtime/json-lines-service.js";
import { nativeExecutable } from "../../runtime/native-executable.js";
import type { Pooling } from "./recipe.js";

/** What `info` says of the index file (searchr1-index info's object). */
export interface IndexInfo {
  path: string;
  type:
    | "IndexFlatIP"
    | "IndexFlatL2"
    | "IndexScalarQuantizer"
    | "IndexHNSWFlat"
    | "IndexHNSWSQ"
    | "IndexIVFPQ";
  metric: "inner_product" | "l2";
  d: number;
  ntotal: number;
  bytes: number;
  hnsw?: { M: number; ef_search: number; ef_construction: number; levels: number };
  ivf?: { nlist: number; nprobe: number; quantizer: string; by_residual: boolean };
  pq?: { M: number; nbits: number; code_size: number };
}

export interface EncoderInfo {
  dim: number;
  vocab_size: number;
  max_position_embeddings: number;
  pooling: Pooling;
  normalize: boolean;
}

/** What `info` says of the reranker (`--reranker`). */
export interface RerankerInfo {
  dim: number;
  layers: number;
  vocab_size: number;
  type_vocab_size: number;
  max_position_embeddings: number;
}

export interface SearchReply {
  /** Corpus row numbers, best first, one list per query. */
  ids: number[][];
  scores: number[][];
  encode_seconds: number;
  search_seconds: number;
}

/** The encoder of a dense index: its folder and how its embeddings are made. */
interface EncoderOptions {
  /** Encoder (BERT) Hugging Face folder. */
  model: string;
  pooling: Pooling;
  normalize: boolean;
}

/** A process with the encoder (and an index), or one with only the reranker. */
export type IndexProcessOptions = EncoderProcessOptions | ({ reranker: string } & ProcessOptions);
export type EncoderProcessOptions = EncoderOptions & ProcessOptions;

interface ProcessOptions {
  /** faiss index file to search; absent when only building. */
  index?: string;
  /** HNSW beam width; null: serve's default (64). */
  efSearch?: number | null;
  /** IVF lists probed; null: serve's default (64). */
  nprobe?: number | null;
  /** Flat file whose exact vectors rescore the candidates (--rescore-from); null: none. */
  rescoreFrom?: string | null;
  /** Candidates per result rescored (--rescore-candidates); null: serve's default. */
  rescoreCandidates?: number | null;
  /** Keep an fp16 copy of the flat vectors in memory (half the RAM). */
  fp16?: boolean;
  /** Where the encoder runs; "cuda" puts a flat index on the GPU too (fp16, sharded). */
  device: "auto" | "cpu" | "cuda";
  /** GPUs the index is sharded over with device "cuda"; null: one. */
  gpus?: number | null;
  /** CPU threads; null: all cores. */
  threads: number | null;
  onLine?: (line: string) => void;
  signal?: AbortSignal;
}

/** Fails clearly, before any process starts, when `dir` is not a Hugging Face folder. */
export async function checkEncoderFolder(dir: string): Promise<void> {
  if (!(await stat(join(dir, "config.json")).catch(() => null))) {
    throw new InputError(`${dir}: no config.json (expected the encoder's Hugging Face folder)`);
  }
}

/**
 * `searchr1-index serve` (native/src/index/SERVE.md) as a child process: the BERT encoder
 * and the memory-mapped faiss index in one native process, so a batch of queries is
 * encoded and searched in one call, and an index is built by streaming token ids to it; or
 * a BERT cross-encoder alone (`reranker`), scoring (query, passage) pairs.
 */
export class IndexProcess {
  private constructor(
    private readonly service: JsonLinesService,
    /** What the process opened: the index (or null), the encoder, the reranker. */
    readonly info: {
      index: IndexInfo | null;
      encoder: EncoderInfo;
      /** Only with `reranker`. */
      reranker?: RerankerInfo;
      fp16: boolean;
      /** The HNSW beam searches use; null where no graph is searched. */
      ef_search: number | null;
      /** The IVF lists each search probes; null where the index is not IVF. */
      nprobe: number | null;
      /** The Flat file rescoring the candidates (`--rescore-from`), or null. */
      rescore: { path: string; type: string; candidates: number } | null;
    },
  ) {}

  static async start(options: IndexProcessOptions): Promise<IndexProcess> {
    const args =
      "reranker" in options
        ? ["serve", "--reranker", options.reranker]
        : ["serve", "--model", options.model, "--pooling", options.pooling];
    if (!("reranker" in options) && !options.normalize) args.push("--no-normalize");
    args.push("--device", options.device);
    if (options.index !== undefined) args.push("--index", options.index);
    if (options.efSearch != null) args.push("--ef-search", String(options.efSearch));
    if (options.nprobe != null) args.push("--nprobe", String(options.nprobe));
    if (options.rescoreFrom != null) args.push("--rescore-from", options.rescoreFrom);
    if (options.rescoreCandidates != null) {
      args.push("--rescore-candidates", String(options.rescoreCandidates));
    }
    if (options.fp16) args.push("--fp16");
    if (options.gpus != null) args.push("--gpus", String(options.gpus));
    if (options.threads != null) args.push("--threads", String(options.threads));
    const service = await JsonLinesService.start({
      executable: nativeExecutable("searchr1-index"),
      args,
      what: `the ${"reranker" in options ? "reranker" : "dense index"} (searchr1-index serve)`,
      who: `the ${"reranker" in options ? "reranker" : "dense index"}`,
      onLine: options.onLine,
      signal: options.signal,
    });
    try {
      return new IndexProcess(service, (await service.send("info", {})) as never);
    } catch (err) {
      // A file or option it refused at start-up: its own one-line message (exit 1, or 2
      // for a usage error) says it better than "died".
      const last = service.stderrTail().at(-1) ?? "";
      const m = /^searchr1-index: (error: )?(.*)$/.exec(last);
      if (service.ended && m) {
        throw m[1] ? new InputError(m[2] as string) : new UsageError(m[2] as string);
      }
      throw err;
    }
  }

  get pid(): number | undefined {
    return this.service.pid;
  }

  /** Why calls fail: the process died or was shut down; else null. */
  get ended(): ServiceError | null {
    return this.service.ended;
  }

  onDeath(listener: (err: ServiceError) => void): void {
    this.service.onDeath(listener);
  }

  /** Encodes the token-id lists and returns each one's top k rows. */
  async search(inputIds: readonly (readonly number[])[], k: number): Promise<SearchReply> {
    return (await this.service.send("search", { input_ids: inputIds, k })) as never;
  }

  /**
   * The reranker's score (its one logit) of each pair: the token ids and types of
   * `[CLS] query [SEP] passage [SEP]`, as the tokenizer makes them.
   */
  async rerank(
    inputIds: readonly (readonly number[])[],
    tokenTypeIds: readonly (readonly number[])[],
  ): Promise<number[]> {
    const reply = await this.service.send("rerank", {
      input_ids: inputIds,
      token_type_ids: tokenTypeIds,
    });
    return reply.scores as number[];
  }

  /** Opens (or resumes) a partial flat index file; resolves with the rows it holds. */
  async buildOpen(path: string): Promise<number> {
    const reply = await this.service.send("build_open", { path, metric: "ip" });
    return reply.rows as number;
  }

  /** Encodes the token-id lists and appends them, durably; resolves with the rows now held. */
  async buildAppend(inputIds: readonly (readonly number[])[]): Promise<number> {
    const reply = await this.service.send("build_append", { input_ids: inputIds });
    return reply.rows as number;
  }

  /** Completes the partial file and renames it to `out`. */
  async buildCommit(out: string): Promise<{ rows: number; bytes: number }> {
    return (await this.service.send("build_commit", { out })) as never;
  }

  shutdown(): Promise<void> {
    return this.service.shutdown();
  }
}
