import { parentPort, workerData } from "node:worker_threads";
import type { Hit } from "../retriever.js";
import { Bm25Engine, type Bm25Shared } from "./engine.js";

/** A search thread: one engine over the shared index, answering query batches in order. */
export interface SearchRequest {
  id: number;
  queries: string[];
  topk: number;
}

export type SearchReply = { id: number; hits: Hit[][] } | { id: number; error: string };

const port = parentPort;
if (!port) throw new Error("search-worker must run as a worker thread");
const engine = new Bm25Engine(workerData as Bm25Shared);

port.on("message", (req: SearchRequest) => {
  let reply: SearchReply;
  try {
    reply = { id: req.id, hits: engine.search(req.queries, req.topk) };
  } catch (err) {
    reply = { id: req.id, error: (err as Error).message };
  }
  port.postMessage(reply);
});
