// serve-retriever --retriever serpapi|serper|google against stand-ins that speak each
// engine's format on the loopback: Search-R1's documents, topk, the cache, replay-only,
// retries, the concurrency cap, errors that name the query and never the key, /health.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { RetrieverClient } from "../../src/agent/retriever-client.js";
import {
  type ServeRetrieverConfig,
  serveRetrieverSchema,
} from "../../src/config/schemas/serve-retriever.js";
import { openOnlineSearch } from "../../src/retrieval/online/open-search.js";
import { OnlineRetrievalServer } from "../../src/retrieval/online/server.js";
import { retrieverMetrics } from "../../src/train/rollout-metrics.js";
import { runCli, startServing } from "../helpers/cli.js";
import { expectJsonError, request } from "../helpers/http.js";
import { retrieve } from "./helpers.js";
import {
  googleAnswer,
  SearchStandIn,
  type StandInReply,
  serpapiAnswer,
  serperAnswer,
} from "./search-standins.js";

const KEY = "sk-test-0123456789abcdef";
const KEYS = {
  SERPAPI_API_KEY: KEY,
  SERPER_API_KEY: KEY,
  GOOGLE_API_KEY: KEY,
  GOOGLE_CSE_ID: "cse-test-id",
};

let dir: string;
const saved: Record<string, string | undefined> = {};
beforeAll(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-online-"));
  for (const [name, value] of Object.entries(KEYS)) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
});
afterAll(() => {
  for (const [name, value] of Object.entries(saved)) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
  rmSync(dir, { recursive: true, force: true });
});

interface Running {
  base: string;
  standIn: SearchStandIn;
  /** What the server logged (retry notices, warnings). */
  log: string[];
  cache: string;
}

const open: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of open.splice(0)) await close();
});

let caches = 0;
/**
 * The online server in this process over a stand-in that answers with `reply`; a fresh
 * cache folder unless one is given. Retries wait about a millisecond.
 */
async function serve(
  values: Partial<Record<keyof ServeRetrieverConfig, unknown>>,
  reply: (req: Parameters<SearchStandIn["reply"]>[0]) => StandInReply,
  existing?: { standIn: SearchStandIn; cache: string },
): Promise<Running> {
  const standIn = existing?.standIn ?? (await SearchStandIn.start(reply));
  const cache = existing?.cache ?? path.join(dir, `cache-${++caches}`);
  const config = serveRetrieverSchema.parse({
    search_url: standIn.url,
    search_cache: cache,
    search_backoff_s: 0.001,
    port: 0,
    ...values,
  });
  const log: string[] = [];
  const opened = openOnlineSearch(config.retriever as "serpapi", config, (l) => log.push(l));
  const server = await OnlineRetrievalServer.listen({
    search: opened.search,
    describe: opened.describe,
    defaultTopk: config.topk,
    limits: { maxQueries: 64, maxTopk: 50, maxBodyBytes: 1 << 20 },
    host: "127.0.0.1",
    port: 0,
    log: (l) => log.push(l),
  });
  open.push(async () => {
    await server.close(100);
    if (!existing) await standIn.close();
  });
  return { base: server.url.replace(/\/retrieve$/, ""), standIn, log, cache };
}

const ok = (body: unknown): StandInReply => ({ status: 200, body });
const contentsOf = (docs: { contents: string }[]) => docs.map((d) => d.contents);

describe("each engine's answer becomes Search-R1's documents", () => {
  it("serpapi: answer box, organic results, related questions; the first topk kept", async () => {
    const s = await serve({ retriever: "serpapi" }, (r) =>
      ok(serpapiAnswer(r.url.searchParams.get("q") as string)),
    );
    const r = await retrieve(s.base, {
      queries: ["who won", "zurich"],
      topk: 3,
      return_scores: true,
    });
    expect(r.status).toBe(200);
    expect(r.json.result[0]).toEqual([
      {
        document: {
          id: "https://example.org/who%20won/box/0",
          contents: '"Answer to who won"\nthe answer box of who won',
        },
        score: 1,
      },
      {
        document: {
          id: "https://example.org/who%20won/organic/0",
          contents: '"who won result 0"\nsnippet 0 of who won',
        },
        score: 0.5,
      },
      {
        document: {
          id: "https://example.org/who%20won/organic/1",
          contents: '"who won result 1"\nsnippet 1 of who won',
        },
        score: 1 / 3,
      },
    ]);
    expect(r.json.result[1]).toHaveLength(3);
    // Search-R1's request: GET engine, q, api_key.
    const asked = s.standIn.requests.find((q) => q.url.searchParams.get("q") === "who won");
    expect(asked?.method).toBe("GET");
    expect(Object.fromEntries(asked?.url.searchParams ?? [])).toEqual({
      engine: "google",
      q: "who won",
      api_key: KEY,
    });
    // topk beyond the organic results: the related questions follow, question as the title.
    const wide = await retrieve(s.base, { queries: ["who won"], topk: 20 });
    expect(contentsOf(wide.json.result[0])).toEqual([
      '"Answer to who won"\nthe answer box of who won',
      ...[0, 1, 2, 3, 4].map((i) => `"who won result ${i}"\nsnippet ${i} of who won`),
      ...[0, 1, 2].map((i) => `"related question ${i} about who won?"\nrelated snippet ${i}`),
    ]);
  });

  it("serpapi: its engine is --serp_engine; a search with no results is []", async () => {
    const s = await serve({ retriever: "serpapi", serp_engine: "bing" }, () =>
      ok({
        search_metadata: { status: "Success" },
        error: "Google hasn't returned any results for this query.",
      }),
    );
    const r = await retrieve(s.base, { queries: ["xyzzy"], return_scores: true });
    expect(r.json).toEqual({ result: [[]] });
    expect(s.standIn.requests[0]?.url.searchParams.get("engine")).toBe("bing");
  });

  it("serpapi: a missing title or snippet gets Search-R1's stand-in text", async () => {
    const s = await serve({ retriever: "serpapi" }, () =>
      ok({ organic_results: [{ link: "https://x" }, { title: "T" }] }),
    );
    const r = await retrieve(s.base, { queries: ["q"] });
    expect(r.json.result[0]).toEqual([
      { id: "https://x", contents: '"No title."\nNo snippet available.' },
      { id: null, contents: '"T"\nNo snippet available.' },
    ]);
  });

  it("serper: POST {q} with X-API-KEY; answerBox, organic, peopleAlsoAsk", async () => {
    const s = await serve({ retriever: "serper", topk: 2 }, (r) =>
      ok(serperAnswer((r.body as { q: string }).q, 2, 2)),
    );
    const r = await retrieve(s.base, { queries: ["paris"] });
    expect(contentsOf(r.json.result[0])).toEqual([
      '"Answer to paris"\nthe answer box of paris',
      '"paris result 0"\nsnippet 0 of paris',
    ]);
    const asked = s.standIn.requests[0];
    expect(asked?.method).toBe("POST");
    expect(asked?.body).toEqual({ q: "paris" });
    expect(asked?.headers["x-api-key"]).toBe(KEY);
    expect(asked?.url.search).toBe("");
    const all = await retrieve(s.base, { queries: ["paris"], topk: 9 });
    expect(contentsOf(all.json.result[0])).toEqual([
      '"Answer to paris"\nthe answer box of paris',
      '"paris result 0"\nsnippet 0 of paris',
      '"paris result 1"\nsnippet 1 of paris',
      '"related question 0 about paris?"\nrelated snippet 0',
      '"related question 1 about paris?"\nrelated snippet 1',
    ]);
  });

  it("google: key and cx; the query without punctuation; snippets as --snippet_only keeps them", async () => {
    const s = await serve({ retriever: "google" }, (r) =>
      ok(
        googleAnswer(r.url.searchParams.get("q") as string, [
          {
            title: "Kept",
            snippet: "short ... this piece of the snippet has enough words ... tail",
          },
          { title: "", snippet: "too short" },
          { title: "Only a title", snippet: "" },
          { title: "Third", snippet: "one two three four five six" },
          { title: "Fourth", snippet: "one two three four five six seven" },
        ]),
      ),
    );
    const r = await retrieve(s.base, { queries: ["who's the   president?"], return_scores: true });
    expect(
      r.json.result[0].map((h: { document: { contents: string } }) => h.document.contents),
    ).toEqual([
      '"Kept"\nthis piece of the snippet has enough words',
      '"Only a title"\nNo snippet available.',
      '"Third"\none two three four five six',
    ]);
    expect(Object.fromEntries(s.standIn.requests[0]?.url.searchParams ?? [])).toEqual({
      key: KEY,
      cx: "cse-test-id",
      q: "who s the president",
    });
    // Nothing left to ask: no call, no documents.
    const blank = await retrieve(s.base, { queries: ["?!", "   "] });
    expect(blank.json).toEqual({ result: [[], []] });
    expect(s.standIn.requests).toHaveLength(1);
  });
});

describe("the cache", () => {
  it("answers a repeated query (same engine and topk) without calling the engine", async () => {
    const s = await serve({ retriever: "serper" }, (r) =>
      ok(serperAnswer((r.body as { q: string }).q)),
    );
    const first = await retrieve(s.base, {
      queries: ["tokyo", "lima"],
      topk: 3,
      return_scores: true,
    });
    const again = await retrieve(s.base, {
      queries: ["lima", "tokyo"],
      topk: 3,
      return_scores: true,
    });
    expect(again.json.result).toEqual([first.json.result[1], first.json.result[0]]);
    expect(s.standIn.queries.sort()).toEqual(["lima", "tokyo"]);
    // Another topk is another entry.
    await retrieve(s.base, { queries: ["tokyo"], topk: 5 });
    expect(s.standIn.requests).toHaveLength(3);
    const health = await request(s.base, "GET", "/health");
    expect(health.json.counters).toMatchObject({ queries: 5, cache_hits: 2, sent: 3, failures: 0 });
  });

  it("asks once for identical queries in flight together", async () => {
    const s = await serve({ retriever: "serper" }, (r) => ({
      status: 200,
      body: serperAnswer((r.body as { q: string }).q),
      delayMs: 30,
    }));
    const replies = await Promise.all([
      retrieve(s.base, { queries: ["same", "same", "same"] }),
      retrieve(s.base, { queries: ["same"] }),
    ]);
    expect(replies.map((r) => r.status)).toEqual([200, 200]);
    expect(replies[0]?.json.result[2]).toEqual(replies[1]?.json.result[0]);
    expect(s.standIn.requests).toHaveLength(1);
  });

  it("asks again once an entry is older than search_cache_days (0: always)", async () => {
    const s = await serve({ retriever: "serpapi", search_cache_days: 0 }, (r) =>
      ok(serpapiAnswer(r.url.searchParams.get("q") as string)),
    );
    await retrieve(s.base, { queries: ["fresh"] });
    await new Promise((r) => setTimeout(r, 5));
    await retrieve(s.base, { queries: ["fresh"] });
    expect(s.standIn.requests).toHaveLength(2);
  });

  it("replay-only answers from the cache, never calls the engine, and refuses a miss", async () => {
    const live = await serve({ retriever: "google" }, (r) =>
      ok(
        googleAnswer(r.url.searchParams.get("q") as string, [
          { title: "T", snippet: "one two three four five six" },
        ]),
      ),
    );
    const recorded = await retrieve(live.base, { queries: ["recorded query"], topk: 2 });
    expect(live.standIn.requests).toHaveLength(1);
    // Replay, with no keys at all and a cache older than any expiry allows.
    const keys = { api: process.env.GOOGLE_API_KEY, cse: process.env.GOOGLE_CSE_ID };
    delete process.env.GOOGLE_API_KEY;
    delete process.env.GOOGLE_CSE_ID;
    let replay: Running;
    try {
      replay = await serve(
        { retriever: "google", replay_only: true, search_cache_days: 0 },
        () => ok({}),
        { standIn: live.standIn, cache: live.cache },
      );
    } finally {
      process.env.GOOGLE_API_KEY = keys.api;
      process.env.GOOGLE_CSE_ID = keys.cse;
    }
    const again = await retrieve(replay.base, { queries: ["recorded query"], topk: 2 });
    expect(again.json).toEqual(recorded.json);
    await expectJsonError(
      retrieve(replay.base, { queries: ["recorded query", "never asked"], topk: 2 }),
      404,
      'queries[1] "never asked": replay-only: not in the search cache',
    );
    // The topk is part of the entry.
    await expectJsonError(
      retrieve(replay.base, { queries: ["recorded query"], topk: 3 }),
      404,
      "topk 3",
    );
    expect(live.standIn.requests).toHaveLength(1);
    const health = await request(replay.base, "GET", "/health");
    expect(health.json).toMatchObject({ replay_only: true, retriever: "google" });
    expect(health.json.counters).toMatchObject({
      cache_hits: 2,
      replay_misses: 2,
      sent: 0,
      upstream_requests: 0,
    });
  });
});

describe("calls to the engine", () => {
  it("retries 429 and 5xx with back-off, then succeeds", async () => {
    let calls = 0;
    const s = await serve({ retriever: "serpapi", search_retries: 3 }, (r) => {
      calls++;
      if (calls === 1)
        return { status: 429, body: { error: "Your searches per hour are exhausted" } };
      if (calls === 2) return { status: 503, body: { error: "try later" } };
      return ok(serpapiAnswer(r.url.searchParams.get("q") as string));
    });
    const r = await retrieve(s.base, { queries: ["retry me"], topk: 1 });
    expect(r.status).toBe(200);
    expect(contentsOf(r.json.result[0])).toEqual([
      '"Answer to retry me"\nthe answer box of retry me',
    ]);
    expect(s.log).toEqual([
      expect.stringMatching(
        /^serpapi \(http:\/\/127\.0\.0\.1:\d+\/search\) answered 429: Your searches per hour are exhausted; retry 1\/3 in /,
      ),
      expect.stringMatching(/answered 503: try later; retry 2\/3 in /),
    ]);
    const health = await request(s.base, "GET", "/health");
    expect(health.json.counters).toMatchObject({
      sent: 1,
      upstream_requests: 3,
      retries: 2,
      failures: 0,
    });
  });

  it("an engine failing for good fails that request with 502; the server keeps serving", async () => {
    const s = await serve({ retriever: "serper", search_retries: 2 }, (r) => {
      const q = (r.body as { q: string }).q;
      return q === "broken"
        ? { status: 500, body: { message: "upstream exploded" } }
        : ok(serperAnswer(q));
    });
    const failed = await expectJsonError(
      retrieve(s.base, { queries: ["fine", "broken"] }),
      502,
      'queries[1] "broken": serper (http://127.0.0.1:',
    );
    expect(failed.json.error).toMatch(/answered 500: upstream exploded \(after 3 attempts\)$/);
    expect(s.standIn.queries.filter((q) => q === "broken")).toHaveLength(3);
    // The query that succeeded was kept; the next request is served.
    const next = await retrieve(s.base, { queries: ["fine", "other"] });
    expect(next.status).toBe(200);
    expect(s.standIn.queries.filter((q) => q === "fine")).toHaveLength(1);
    const health = await request(s.base, "GET", "/health");
    expect(health.json.counters).toMatchObject({ failures: 1, retries: 2, cache_hits: 1 });
  });

  it("a refusal (4xx) is not retried, and an answer with an error is an error", async () => {
    const s = await serve({ retriever: "serpapi" }, (r) =>
      r.url.searchParams.get("q") === "out of credits"
        ? ok({ error: "Your account has run out of searches." })
        : { status: 400, body: { error: "Unsupported `xx` location" } },
    );
    await expectJsonError(
      retrieve(s.base, { queries: ["bad"] }),
      502,
      "answered 400: Unsupported `xx` location",
    );
    await expectJsonError(
      retrieve(s.base, { queries: ["out of credits"] }),
      502,
      "answered with an error: Your account has run out of searches.",
    );
    expect(s.standIn.requests).toHaveLength(2);
  });

  it("gives up on an engine that does not answer within search_timeout_s", async () => {
    const s = await serve(
      { retriever: "serpapi", search_timeout_s: 0.2, search_retries: 1 },
      () => "hang",
    );
    const r = await expectJsonError(
      retrieve(s.base, { queries: ["slow"] }),
      502,
      "no answer within 0.2 s",
    );
    expect(r.json.error).toContain("(after 2 attempts)");
  });

  it("never has more than search_concurrency calls in flight", async () => {
    const s = await serve({ retriever: "serper", search_concurrency: 3 }, (r) => ({
      status: 200,
      body: serperAnswer((r.body as { q: string }).q, 1, 0),
      delayMs: 40,
    }));
    const queries = Array.from({ length: 12 }, (_, i) => `query ${i}`);
    const [a, b] = await Promise.all([
      retrieve(s.base, { queries: queries.slice(0, 6) }),
      retrieve(s.base, { queries: queries.slice(6) }),
    ]);
    expect([a?.status, b?.status]).toEqual([200, 200]);
    expect(s.standIn.requests).toHaveLength(12);
    expect(s.standIn.maxActive).toBe(3);
  });

  it("never puts the API key in an error or a log line", async () => {
    // An engine that echoes the key back, in the body and in the message.
    const s = await serve({ retriever: "google", search_retries: 1 }, (r) => ({
      status: r.url.searchParams.get("q") === "denied" ? 403 : 500,
      body: { error: { code: 403, message: `API key ${KEY} not valid (${r.url.href})` } },
    }));
    for (const q of ["denied", "crash"]) {
      const r = await retrieve(s.base, { queries: [q] });
      expect(r.status).toBe(502);
      expect(r.text).not.toContain(KEY);
      expect(r.text).toContain("API key *** not valid");
    }
    expect(s.log.length).toBeGreaterThan(0);
    for (const line of s.log) expect(line).not.toContain(KEY);
    const health = await request(s.base, "GET", "/health");
    expect(health.text).not.toContain(KEY);
  });
});

describe("train's metrics", () => {
  it("are the /health counters' growth over a step's searches (retriever/*)", async () => {
    const s = await serve({ retriever: "serper" }, (r) =>
      ok(serperAnswer((r.body as { q: string }).q)),
    );
    const client = new RetrieverClient({
      url: `${s.base}/retrieve`,
      topk: 3,
      timeoutMs: 5_000,
      maxRetries: 0,
    });
    await client.search("before the step");
    const before = await client.counters();
    await Promise.all(["a", "b", "a", "before the step"].map((q) => client.search(q)));
    const after = await client.counters();
    expect(retrieverMetrics(before, after)).toEqual({
      "retriever/queries": 4,
      "retriever/cache_hits": 2,
      "retriever/sent": 2,
      "retriever/upstream_requests": 2,
      "retriever/retries": 0,
      "retriever/failures": 0,
      "retriever/replay_misses": 0,
    });
    // A retriever without counters (an index server, Search-R1's FastAPI one) adds no metrics.
    const fastapi = await SearchStandIn.start(() => ({
      status: 404,
      body: { detail: "Not Found" },
    }));
    open.push(() => fastapi.close());
    const other = new RetrieverClient({
      url: `${fastapi.url.replace(/\/search$/, "")}/retrieve`,
      topk: 3,
      timeoutMs: 5_000,
      maxRetries: 0,
    });
    expect(await other.counters()).toBeNull();
    expect(retrieverMetrics(null, null)).toEqual({});
  });
});

describe("searchr1 serve-retriever --retriever serpapi|serper|google (the CLI)", () => {
  it("serves, logs retries without the key, counts on /health, and stops on SIGTERM", async () => {
    let calls = 0;
    const standIn = await SearchStandIn.start((r) => {
      calls++;
      return calls === 1
        ? { status: 502, body: { message: "bad gateway" } }
        : ok(serpapiAnswer(r.url.searchParams.get("q") as string));
    });
    try {
      const cache = path.join(dir, "cli-cache");
      const server = await startServing(
        [
          "serve-retriever",
          "--retriever",
          "serpapi",
          "--search_url",
          standIn.url,
          "--search-cache",
          cache,
          "--port",
          "0",
          "--topk",
          "2",
          "search_backoff_s=0.001",
        ],
        /serving serpapi web search at (http:\/\/\S+\/retrieve) \(/,
        { env: { SERPAPI_API_KEY: KEY }, timeoutMs: 20_000 },
      );
      const base = server.url.replace(/\/retrieve$/, "");
      const r = await retrieve(base, { queries: ["who wrote hamlet"], return_scores: true });
      expect(r.json.result[0]).toHaveLength(2);
      await retrieve(base, { queries: ["who wrote hamlet"], return_scores: true });
      const health = await request(base, "GET", "/health");
      expect(health.json).toMatchObject({
        status: "ok",
        retriever: "serpapi",
        search_url: standIn.url,
        topk: 2,
        cache: { path: cache, max_age_days: 7 },
        counters: { queries: 2, cache_hits: 1, sent: 1, upstream_requests: 2, retries: 1 },
      });
      const stopped = await server.stop();
      expect(stopped.code).toBe(0);
      expect(stopped.stderr).toMatch(/answered 502: bad gateway; retry 1\/3/);
      expect(stopped.stderr).not.toContain(KEY);
      expect(existsSync(path.join(cache, "serpapi-google"))).toBe(true);
    } finally {
      await standIn.close();
    }
  }, 30_000);

  it("refuses to start without the engine's key, naming the variables", () => {
    const r = runCli(["serve-retriever", "--retriever", "google", "--port", "0"], {
      env: { GOOGLE_API_KEY: "", GOOGLE_CSE_ID: "" },
    });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(
      "--retriever google needs GOOGLE_API_KEY and GOOGLE_CSE_ID in the environment",
    );
  });

  it("refuses replay-only without a cache, and an index retriever without --index", () => {
    const missing = path.join(dir, "no-such-cache");
    const replay = runCli([
      "serve-retriever",
      "--retriever",
      "serper",
      "--replay-only",
      "--search-cache",
      missing,
      "--port",
      "0",
    ]);
    expect(replay.code).toBe(1);
    expect(replay.stderr).toContain(`${missing}: no search cache to replay`);
    const bm25 = runCli(["serve-retriever", "--port", "0"]);
    expect(bm25.code).toBe(2);
    expect(bm25.stderr).toContain('missing required key "index": set it with --index');
  });
});
