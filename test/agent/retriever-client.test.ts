// The retriever client's retries end with the session: a retriever that died (or Ctrl-C)
// must not keep a run waiting through a minute of back-off against a server that is gone.
import { createServer } from "node:net";
import { expect, it } from "vitest";
import { RetrieverClient } from "../../src/agent/retriever-client.js";

/** A loopback port nothing listens on (connections are refused). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
}

it("retries a refused retriever, and stops retrying at once when its signal aborts", async () => {
  const stop = new AbortController();
  const retries: string[] = [];
  const client = new RetrieverClient({
    url: `http://127.0.0.1:${await closedPort()}/retrieve`,
    topk: 3,
    timeoutMs: 5_000,
    maxRetries: 10,
    backoffMs: 400,
    onRetry: (line) => retries.push(line),
    signal: stop.signal,
  });
  const started = performance.now();
  const search = client.search("who is paul walker");
  setTimeout(() => stop.abort(new Error("the retriever died")), 600);
  await expect(search).rejects.toThrow("the retriever died");
  // Back-off alone (0.4 + 0.8 + 1.6 + ... s over 10 retries) would take over a minute.
  expect(performance.now() - started).toBeLessThan(3_000);
  expect(retries.length).toBeGreaterThanOrEqual(1);
  expect(retries[0]).toMatch(/retry 1\/10 in 0\.4 s/);
});
