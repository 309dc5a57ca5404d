import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  buildTestIndex,
  type RunningRetriever,
  retrieve,
  seededRandom,
  startRetrieverServer,
  type TestIndex,
} from "./helpers.js";

/** verl's search tool default: num_workers = 120 concurrent tool calls. */
const CLIENTS = 120;
const SECONDS = 10;

let ix: TestIndex;
let server: RunningRetriever;

beforeAll(async () => {
  ix = buildTestIndex({ rows: 3000 });
  server = await startRetrieverServer(["--index", ix.index, "--corpus", ix.corpus, "--port", "0"]);
}, 60_000);

afterAll(async () => {
  if (server) expect((await server.stop()).code).toBe(0);
  ix?.cleanup();
});

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number;
}

describe("serve-retriever under load", () => {
  it(`${CLIENTS} keep-alive clients for ${SECONDS} s: no errors`, async () => {
    const latencies: number[] = [];
    const failures: string[] = [];
    const deadline = performance.now() + SECONDS * 1000;
    const client = async (id: number) => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      const random = seededRandom(id + 1);
      const word = () => ix.vocabulary[Math.floor(random() * 200)] as string;
      try {
        while (performance.now() < deadline) {
          const query = `${word()} ${word()} ${word()}`;
          const t0 = performance.now();
          try {
            const r = await retrieve(
              server.base,
              { queries: [query], topk: 3, return_scores: true },
              { agent },
            );
            latencies.push(performance.now() - t0);
            if (r.status !== 200 || !Array.isArray(r.json?.result?.[0])) {
              failures.push(`HTTP ${r.status}: ${r.text.slice(0, 200)}`);
            } else if (r.json.result[0].length !== 3) {
              failures.push(`"${query}": ${r.json.result[0].length} documents, expected 3`);
            }
          } catch (err) {
            failures.push(String(err));
          }
        }
      } finally {
        agent.destroy();
      }
    };
    const started = performance.now();
    await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(i)));
    const elapsed = (performance.now() - started) / 1000;
    latencies.sort((a, b) => a - b);
    const line =
      `serve-retriever load: ${CLIENTS} clients, ${latencies.length} requests in ` +
      `${elapsed.toFixed(1)} s = ${Math.round(latencies.length / elapsed)} req/s; ` +
      `latency p50 ${percentile(latencies, 50).toFixed(1)} ms, ` +
      `p99 ${percentile(latencies, 99).toFixed(1)} ms, max ${(latencies.at(-1) ?? 0).toFixed(1)} ms; ` +
      `${failures.length} errors`;
    console.log(line);
    expect(failures.slice(0, 5)).toEqual([]);
    expect(latencies.length).toBeGreaterThan(CLIENTS);
  }, 60_000);
});
