import { availableParallelism } from "node:os";
import { resolve } from "node:path";
import { Worker } from "node:worker_threads";
import type { Hit, Retriever } from "../retriever.js";
import { type Bm25Shared, loadShared } from "./engine.js";
import type { IndexMeta } from "./format.js";
import type { SearchReply, SearchRequest } from "./search-worker.js";

/** Queries a search thread takes at once: big requests are spread over the threads. */
const SLICE = 32;

interface Pending {
  queries: string[];
  topk: number;
  resolve: (hits: Hit[][]) => void;
  reject: (err: Error) => void;
}

interface Thread {
  worker: Worker;
  busy: Map<number, Pending>;
}

/**
 * BM25 retrieval over a pool of search threads. Queries from concurrent requests share
 * one queue: an idle thread takes the next slice of it, so under load each thread
 * works through several requests' queries per message instead of one query each.
 */
export class Bm25Retriever implements Retriever {
  readonly kind = "bm25";
  private readonly queue: Pending[] = [];
  private nextId = 0;
  closed = false;

  private constructor(
    private readonly shared: Bm25Shared,
    private readonly threads: Thread[],
  ) {}

  /** Starts the search threads over the index in `dir`, whose `meta.json` the caller has read. */
  static async open(dir: string, meta: IndexMeta, threads: number | null): Promise<Bm25Retriever> {
    const shared = loadShared(resolve(dir), meta);
    const n = Math.max(1, threads ?? availableParallelism());
    const url = new URL("./search-worker.js", import.meta.url);
    const pool: Thread[] = [];
    const retriever = new Bm25Retriever(shared, pool);
    for (let i = 0; i < n; i++) {
      const thread: Thread = { worker: new Worker(url, { workerData: shared }), busy: new Map() };
      thread.worker.on("message", (reply: SearchReply) => retriever.onReply(thread, reply));
      thread.worker.on("error", (err) => retriever.onCrash(thread, err));
      thread.worker.on("exit", (code) => {
        if (!retriever.closed)
          retriever.onCrash(thread, new Error(`search thread exited (${code})`));
      });
      pool.push(thread);
    }
    return retriever;
  }

  get documents(): number {
    return this.shared.meta.counts.documents;
  }

  search(queries: readonly string[], topk: number): Promise<Hit[][]> {
    if (this.closed) return Promise.reject(new Error("retriever is closed"));
    if (queries.length === 0) return Promise.resolve([]);
    const parts: Promise<Hit[][]>[] = [];
    for (let i = 0; i < queries.length; i += SLICE) {
      parts.push(
        new Promise((resolve, reject) => {
          this.queue.push({ queries: queries.slice(i, i + SLICE), topk, resolve, reject });
        }),
      );
    }
    this.dispatch();
    return Promise.all(parts).then((lists) => lists.flat());
  }

  private dispatch(): void {
    let idle = this.threads.filter((t) => t.busy.size === 0).length;
    for (const thread of this.threads) {
      if (this.queue.length === 0) return;
      if (thread.busy.size > 0) continue;
      idle--;
      // When slices outnumber the idle threads, one message carries several of them (same
      // topk); otherwise each idle thread gets its own, so one big request uses every core.
      const first = this.queue.shift() as Pending;
      const group = [first];
      let count = first.queries.length;
      while (this.queue.length > idle && count < SLICE * 2) {
        const next = this.queue[0] as Pending;
        if (next.topk !== first.topk) break;
        group.push(this.queue.shift() as Pending);
        count += next.queries.length;
      }
      const id = this.nextId++;
      const merged: Pending = {
        queries: group.flatMap((p) => p.queries),
        topk: first.topk,
        resolve: (hits) => {
          let at = 0;
          for (const p of group) {
            p.resolve(hits.slice(at, at + p.queries.length));
            at += p.queries.length;
          }
        },
        reject: (err) => {
          for (const p of group) p.reject(err);
        },
      };
      thread.busy.set(id, merged);
      const req: SearchRequest = { id, queries: merged.queries, topk: merged.topk };
      thread.worker.postMessage(req);
    }
  }

  private onReply(thread: Thread, reply: SearchReply): void {
    const pending = thread.busy.get(reply.id);
    thread.busy.delete(reply.id);
    if (pending) {
      if ("error" in reply) pending.reject(new Error(reply.error));
      else pending.resolve(reply.hits);
    }
    this.dispatch();
  }

  private onCrash(thread: Thread, err: Error): void {
    for (const p of thread.busy.values()) p.reject(err);
    thread.busy.clear();
    const i = this.threads.indexOf(thread);
    if (i >= 0) this.threads.splice(i, 1);
    if (this.threads.length === 0) {
      this.closed = true;
      for (const p of this.queue.splice(0)) p.reject(err);
    } else this.dispatch();
  }

  describe(): Record<string, unknown> {
    const { meta, dir } = this.shared;
    return {
      index: dir,
      documents: meta.counts.documents,
      terms: meta.counts.terms,
      postings: meta.counts.postings,
      k1: meta.bm25.k1,
      b: meta.bm25.b,
      threads: this.threads.length,
    };
  }

  /** Stops the threads; searches still queued or running are rejected. */
  async close(): Promise<void> {
    this.closed = true;
    const gone = new Error("retriever is closed");
    for (const p of this.queue.splice(0)) p.reject(gone);
    for (const t of this.threads) {
      for (const p of t.busy.values()) p.reject(gone);
      t.busy.clear();
    }
    await Promise.all(this.threads.map((t) => t.worker.terminate()));
  }
}
