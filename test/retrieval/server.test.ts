import { mkdirSync, writeFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Bm25Engine, loadShared } from "../../src/retrieval/bm25/engine.js";
import { readMeta } from "../../src/retrieval/bm25/format.js";
import { runCli } from "../helpers/cli.js";
import { expectJsonError } from "../helpers/http.js";
import {
  buildTestIndex,
  DUPLICATE_CONTENTS,
  KNOWN_ROWS,
  PAUL_WALKER_CONTENTS,
  type Reply,
  type RunningRetriever,
  request,
  retrieve,
  startRetrieverServer,
  type TestIndex,
  writeTestCorpus,
  ZURICH_CONTENTS,
} from "./helpers.js";

interface Doc {
  id: string;
  contents: string;
}
interface Scored {
  document: Doc;
  score: number;
}

let ix: TestIndex;
let server: RunningRetriever;
let engine: Bm25Engine;

// Small limits so that the limit errors are cheap to provoke.
const LIMITS = ["--max-queries", "64", "--max-topk", "50", "--max-body-mb", "1"];

beforeAll(async () => {
  ix = buildTestIndex({ rows: 3000 });
  server = await startRetrieverServer([
    "--retriever",
    "bm25",
    "--index",
    ix.index,
    "--corpus",
    ix.corpus,
    "--topk",
    "3",
    "--port",
    "0",
    "--threads",
    "2",
    ...LIMITS,
  ]);
  engine = new Bm25Engine(loadShared(ix.index, await readMeta(ix.index)));
}, 60_000);

afterAll(async () => {
  engine?.close();
  if (server) {
    const r = await server.stop();
    expect(r.code).toBe(0);
  }
  ix?.cleanup();
});

/** Queries with several hits each: common generated words, two or three per query. */
function queries(n: number): string[] {
  return Array.from({ length: n }, (_, i) =>
    [ix.vocabulary[i % 7], ix.vocabulary[(i * 5 + 3) % 11], ix.vocabulary[20 + i]].join(" "),
  );
}

/** The document must be the corpus row it names, exactly (parsed). */
function expectCorpusRow(doc: Doc): number {
  const row = Number(doc.id);
  expect(Number.isInteger(row)).toBe(true);
  expect(doc).toEqual(JSON.parse(ix.lines[row] as string));
  return row;
}

/** Scores descending, ties by ascending row; rows and scores exactly the index's. */
function expectIndexRanking(query: string, topk: number, list: Scored[]): void {
  const expected = engine.search([query], topk)[0] ?? [];
  const rows = list.map((h) => expectCorpusRow(h.document));
  expect(rows).toEqual(expected.map((h) => h.row));
  expect(list.map((h) => h.score)).toEqual(expected.map((h) => h.score));
  for (let i = 1; i < list.length; i++) {
    const a = list[i - 1] as Scored;
    const b = list[i] as Scored;
    expect(a.score >= b.score).toBe(true);
    if (a.score === b.score) expect(rows[i - 1] as number).toBeLessThan(rows[i] as number);
  }
}

/** A good request right after a bad one: the server is still serving. */
async function expectAlive(agent?: http.Agent): Promise<void> {
  const r = await retrieve(server.base, { queries: ["walker"], topk: 1 }, { agent });
  expect(r.status).toBe(200);
  expect(r.json.result[0][0].id).toBe("0");
}

describe("POST /retrieve", () => {
  it.each([1, 2, 5])(
    "return_scores true with %i queries: scored corpus rows, index order",
    async (n) => {
      const qs = queries(n);
      const r = await retrieve(server.base, { queries: qs, topk: 3, return_scores: true });
      expect(r.status).toBe(200);
      expect(r.headers["content-type"]).toBe("application/json");
      expect(r.json.result).toHaveLength(n);
      qs.forEach((q, i) => {
        const list = r.json.result[i] as Scored[];
        expect(list).toHaveLength(3);
        for (const h of list) expect(typeof h.score).toBe("number");
        expectIndexRanking(q, 3, list);
      });
    },
  );

  it.each([1, 2, 5])("return_scores false (and missing) with %i queries: bare rows", async (n) => {
    const qs = queries(n);
    for (const body of [
      { queries: qs, topk: 3, return_scores: false },
      { queries: qs, topk: 3 },
    ]) {
      const r = await retrieve(server.base, body);
      expect(r.status).toBe(200);
      expect(r.json.result).toHaveLength(n);
      qs.forEach((q, i) => {
        const docs = r.json.result[i] as Doc[];
        expect(Object.keys(docs[0] as Doc).sort()).toEqual(["contents", "id"]);
        expect(docs.map(expectCorpusRow)).toEqual(engine.search([q], 3)[0]?.map((h) => h.row));
      });
    }
  });

  it("topk missing, null or 0 means the server's --topk (3); an explicit topk 5 gives 5", async () => {
    const q = queries(1);
    for (const topk of [undefined, null, 0]) {
      const r = await retrieve(server.base, { queries: q, topk, return_scores: true });
      expect(r.status).toBe(200);
      expect(r.json.result[0]).toHaveLength(3);
    }
    const r = await retrieve(server.base, { queries: q, topk: 5, return_scores: true });
    expect(r.json.result[0]).toHaveLength(5);
    expectIndexRanking(q[0] as string, 5, r.json.result[0]);
  });

  it("accepts SkyRL's {query: string} form as one query", async () => {
    const r = await retrieve(server.base, { query: "Paul Walker", topk: 3, return_scores: true });
    expect(r.status).toBe(200);
    expect(r.json.result).toHaveLength(1);
    expect(r.json.result[0][0].document).toEqual({ id: "0", contents: PAUL_WALKER_CONTENTS });
  });

  it("no queries → empty result; an empty or unmatched query → an empty list", async () => {
    expect((await retrieve(server.base, { queries: [] })).json).toEqual({ result: [] });
    const r = await retrieve(server.base, {
      queries: ["", "qqqxxyzzy", "walker"],
      return_scores: true,
    });
    expect(r.status).toBe(200);
    expect(r.json.result[0]).toEqual([]);
    expect(r.json.result[1]).toEqual([]);
    expect(r.json.result[2]).toHaveLength(1);
  });

  it("equal scores rank by ascending row (duplicated passages)", async () => {
    const r = await retrieve(server.base, {
      queries: ["duplicatum"],
      topk: 10,
      return_scores: true,
    });
    const list = r.json.result[0] as Scored[];
    expect(list.map((h) => Number(h.document.id))).toEqual([...KNOWN_ROWS.duplicates]);
    expect(new Set(list.map((h) => h.score)).size).toBe(1);
    expect(list[0]?.document.contents).toBe(DUPLICATE_CONTENTS);
    expectIndexRanking("duplicatum", 10, list);
  });

  it("documents are the corpus rows verbatim: non-ASCII and newlines survive", async () => {
    const r = await retrieve(server.base, { queries: ["Zürich Switzerland"], topk: 1 });
    expect(r.json.result[0][0]).toEqual({ id: "1", contents: ZURICH_CONTENTS });
    expect(r.text).toContain(ix.lines[KNOWN_ROWS.zurich] as string);
  });

  it("serves many concurrent requests on one keep-alive connection pool", async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });
    try {
      const qs = queries(40);
      const replies = await Promise.all(
        qs.map((q) =>
          retrieve(server.base, { queries: [q], topk: 4, return_scores: true }, { agent }),
        ),
      );
      replies.forEach((r, i) => {
        expect(r.status).toBe(200);
        expectIndexRanking(qs[i] as string, 4, r.json.result[0]);
      });
    } finally {
      agent.destroy();
    }
  });
});

describe("clients read the answer as Search-R1 and verl do", () => {
  /** Search-R1 generation.py `_passages2string`: title = first line, no space before "(". */
  function searchR1Passages(result: Scored[]): string {
    let out = "";
    result.forEach((item, idx) => {
      const content = item.document.contents;
      const title = content.split("\n")[0];
      const text = content.split("\n").slice(1).join("\n");
      out += `Doc ${idx + 1}(Title: ${title}) ${text}\n`;
    });
    return out;
  }

  /** verl search tool `_passages2string`, per query, blocks joined by "\n---\n". */
  function verlPassages(results: Scored[][]): string {
    return results
      .map((result) => {
        let out = "";
        result.forEach((item, idx) => {
          const content = item.document.contents;
          const title = content.split("\n")[0];
          const text = content.split("\n").slice(1).join("\n");
          out += `Doc ${idx + 1} (Title: ${title})\n${text}\n\n`;
        });
        return out.trim();
      })
      .join("\n---\n");
  }

  it("Search-R1's information block for a known passage", async () => {
    // generation.py: {"queries": [...], "topk": 3, "return_scores": True}, reads ["result"].
    const r = await retrieve(server.base, {
      queries: ["Walker", "Zürich"],
      topk: 3,
      return_scores: true,
    });
    const [walker, zurich] = (r.json.result as Scored[][]).map(searchR1Passages);
    expect(walker).toBe(
      `Doc 1(Title: "Paul Walker") Paul William Walker IV was an American actor best known for his ` +
        "role as Brian O'Conner in The Fast and the Furious franchise.\n",
    );
    expect(`\n\n<information>${(walker as string).trim()}</information>\n\n`).toContain(
      '<information>Doc 1(Title: "Paul Walker") Paul William',
    );
    expect(zurich).toBe(
      'Doc 1(Title: "Zürich") Zürich is the largest city in Switzerland.\nIt lies at the north end of Lake Zürich.\n',
    );
  });

  it("verl's tool text for a known passage", async () => {
    const r = await retrieve(server.base, {
      queries: ["walker", "zurich switzerland"],
      topk: 3,
      return_scores: true,
    });
    expect(verlPassages(r.json.result)).toBe(
      'Doc 1 (Title: "Paul Walker")\nPaul William Walker IV was an American actor best known for ' +
        "his role as Brian O'Conner in The Fast and the Furious franchise.\n---\n" +
        'Doc 1 (Title: "Zürich")\nZürich is the largest city in Switzerland.\nIt lies at the north end of Lake Zürich.',
    );
  });
});

describe("bad requests: a JSON error naming the field, and the server keeps serving", () => {
  async function expectError(reply: Promise<Reply>, status: number, mention: string) {
    const r = await expectJsonError(reply, status, mention);
    await expectAlive();
    return r;
  }

  it("400 on malformed JSON", async () => {
    await expectError(retrieve(server.base, '{"queries": ["a"'), 400, "not valid JSON");
    await expectError(retrieve(server.base, ""), 400, "not valid JSON");
  });

  it.each([
    [{ queries: "walker" }, '"queries"'],
    [{ queries: ["walker", 7] }, '"queries[1]"'],
    [{ queries: [null] }, '"queries[0]"'],
    [{}, '"queries"'],
    [{ query: 5 }, '"query"'],
    [{ queries: ["a"], query: "b" }, '"query"'],
    [{ queries: ["a"], topk: "3" }, '"topk"'],
    [{ queries: ["a"], topk: -1 }, '"topk"'],
    [{ queries: ["a"], topk: 2.5 }, '"topk"'],
    [{ queries: ["a"], return_scores: "yes" }, '"return_scores"'],
    [{ queries: ["a"], return_scores: null }, '"return_scores"'],
    [["walker"], "JSON object"],
  ])("400 on bad field types: %j", async (body, mention) => {
    await expectError(retrieve(server.base, body), 400, mention);
  });

  it("400 when topk is above --max-topk", async () => {
    await expectError(retrieve(server.base, { queries: ["a"], topk: 51 }), 400, '"topk"');
    const r = await retrieve(server.base, { queries: ["walker"], topk: 50 });
    expect(r.status).toBe(200);
  });

  it("413 when there are more queries than --max-queries", async () => {
    const r = await expectError(retrieve(server.base, { queries: queries(65) }), 413, '"queries"');
    expect(r.json.error).toContain("64");
    expect((await retrieve(server.base, { queries: queries(64) })).status).toBe(200);
  });

  it("413 when the body passes --max-body-mb (Content-Length), on a connection that lives on", async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const big = JSON.stringify({ queries: ["x".repeat(1_500_000)] });
      await expectError(retrieve(server.base, big, { agent }), 413, "body");
      await expectAlive(agent);
    } finally {
      agent.destroy();
    }
  });

  it("413 reaches a client that sends its whole body before reading (Connection: close)", async () => {
    // Like Python's http.client / urllib: sendall() the request, then read the answer. An
    // early close by the server would fail the send with EPIPE/ECONNRESET (20 MB: more
    // than the kernel buffers on loopback take).
    const body = JSON.stringify({ queries: ["x".repeat(20_000_000)] });
    const { hostname, port } = new URL(server.base);
    const text = await new Promise<string>((resolve, reject) => {
      const socket = net.connect(Number(port), hostname);
      socket.pause();
      socket.on("error", reject);
      const head =
        `POST /retrieve HTTP/1.1\r\nHost: ${hostname}:${port}\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n`;
      socket.write(head + body, (err) => {
        if (err) return reject(err);
        let answer = "";
        socket.setEncoding("utf8").on("data", (d: string) => {
          answer += d;
        });
        socket.on("end", () => resolve(answer));
        socket.resume();
      });
    });
    expect(text).toMatch(/^HTTP\/1\.1 413 /);
    expect(text).toContain('"error":"request body');
    await expectAlive();
  });

  it("413 when a chunked body (no Content-Length) passes --max-body-mb", async () => {
    const pieces = [
      '{"queries": ["',
      ...Array.from({ length: 24 }, () => "y".repeat(100_000)),
      '"]}',
    ];
    await expectError(request(server.base, "POST", "/retrieve", pieces), 413, "body");
  });

  it("404 on unknown routes", async () => {
    await expectError(request(server.base, "GET", "/nope"), 404, "/nope");
    await expectError(request(server.base, "POST", "/retrieve/more", "{}"), 404, "/retrieve/more");
  });

  it("405 with Allow on a wrong method", async () => {
    const a = await expectError(request(server.base, "GET", "/retrieve"), 405, "POST");
    expect(a.headers.allow).toBe("POST");
    const b = await expectError(request(server.base, "POST", "/health", "{}"), 405, "GET");
    expect(b.headers.allow).toBe("GET, HEAD");
    const c = await expectError(request(server.base, "DELETE", "/retrieve"), 405, "POST");
    expect(c.headers.allow).toBe("POST");
  });
});

describe("GET /health", () => {
  it("says ready, with the index and corpus facts", async () => {
    const r = await request(server.base, "GET", "/health");
    expect(r.status).toBe(200);
    expect(r.json).toMatchObject({
      status: "ok",
      ready: true,
      retriever: "bm25",
      documents: 3000,
      index: { index: ix.index, documents: 3000, k1: 0.9, b: 0.4, threads: 2 },
      corpus: { path: ix.corpus, rows: 3000, bytes: Buffer.byteLength(`${ix.lines.join("\n")}\n`) },
      topk: 3,
      limits: { max_queries: 64, max_topk: 50, max_body_mb: 1 },
    });
    expect(r.json.index.terms).toBeGreaterThan(100);
  });
});

describe("serve-retriever start-up and shutdown", () => {
  it("starts with Search-R1's flag spellings (retrieval_launch_bm25.sh)", async () => {
    const s = await startRetrieverServer([
      "--index_path",
      ix.index,
      "--corpus_path",
      ix.corpus,
      "--topk",
      "2",
      "--retriever_name",
      "bm25",
      "--port",
      "0",
    ]);
    try {
      expect(s.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/retrieve$/);
      expect(s.cli.output.stderr).toMatch(
        /serving bm25 retrieval over 3,000 passages at .* \(loaded in [\d.]+ s\)/,
      );
      const r = await retrieve(s.base, { queries: queries(2), return_scores: true });
      expect(r.json.result.map((l: unknown[]) => l.length)).toEqual([2, 2]);
      // Search-R1's retrieval_request.py sends 400 queries with topk 5; 1000 × 10 documents
      // are more than one write group, so the answer is streamed (chunked).
      for (const [n, topk] of [
        [400, 5],
        [1000, 10],
      ] as const) {
        const qs = Array.from(
          { length: n },
          (_, i) => `${ix.vocabulary[i % 50]} ${ix.vocabulary[i % 13]}`,
        );
        const big = await retrieve(s.base, { queries: qs, topk, return_scores: true });
        expect(big.status).toBe(200);
        expect(big.headers["transfer-encoding"]).toBe(n === 1000 ? "chunked" : undefined);
        expect(big.json.result).toHaveLength(n);
        const expected = engine.search(qs, topk);
        (big.json.result as Scored[][]).forEach((list, i) => {
          expect(list.map((h) => Number(h.document.id))).toEqual(expected[i]?.map((h) => h.row));
          expect(list.map((h) => h.score)).toEqual(expected[i]?.map((h) => h.score));
        });
      }
    } finally {
      expect((await s.stop()).code).toBe(0);
    }
  });

  it("fails with a one-line error naming a missing index folder", () => {
    const missing = path.join(ix.dir, "no-such-index");
    const r = runCli(["serve-retriever", "--index", missing, "--corpus", ix.corpus, "--port", "0"]);
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).toContain(`${missing}: no such index folder`);
    expect(r.stderr).toContain("searchr1 build-index");
  });

  it("says a Lucene/Pyserini index cannot be read and how to build one", () => {
    const lucene = path.join(ix.dir, "pyserini-bm25");
    mkdirSync(lucene, { recursive: true });
    for (const f of ["segments_2", "_0.cfe", "_0.cfs", "_0.si", "write.lock"]) {
      writeFileSync(path.join(lucene, f), "");
    }
    const r = runCli([
      "serve-retriever",
      "--index_path",
      lucene,
      "--corpus_path",
      ix.corpus,
      "--port",
      "0",
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`${lucene}: a Lucene/Pyserini index`);
    expect(r.stderr).toContain("searchr1 build-index --retriever bm25");
  });

  it("refuses a corpus that is not the one indexed, naming both", () => {
    const other = path.join(ix.dir, "other.jsonl");
    writeTestCorpus(other, 3000, 99);
    const r = runCli(["serve-retriever", "--index", ix.index, "--corpus", other, "--port", "0"]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(
      `${other} is not the corpus the index in ${ix.index} was built from`,
    );
  });

  it("tells a BM25 folder from a faiss file, naming the right --retriever (exit 2)", () => {
    const model = path.join(ix.dir, "encoder");
    mkdirSync(model, { recursive: true });
    writeFileSync(path.join(model, "config.json"), "{}");
    const args = ["serve-retriever", "--index", ix.index, "--corpus", ix.corpus];
    const dense = runCli([...args, "--retriever", "e5", "--retriever-model", model]);
    expect(dense.code).toBe(2);
    expect(dense.stderr).toContain(
      `${ix.index}: a folder, not a faiss index file (a BM25 index: serve it with --retriever bm25)`,
    );
    const meta = path.join(ix.index, "meta.json");
    const bm25 = runCli(["serve-retriever", "--index", meta, "--corpus", ix.corpus]);
    expect(bm25.code).toBe(2);
    expect(bm25.stderr).toContain(`${meta}: a file, not a BM25 index folder`);
  });

  it("a port in use is a clear error", async () => {
    const port = new URL(server.base).port;
    const r = runCli([
      "serve-retriever",
      "--index",
      ix.index,
      "--corpus",
      ix.corpus,
      "--port",
      port,
    ]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`cannot listen on 127.0.0.1:${port}: the address is in use`);
  });

  it("warns when bound to every interface", async () => {
    const s = await startRetrieverServer([
      "--index",
      ix.index,
      "--corpus",
      ix.corpus,
      "--host",
      "0.0.0.0",
      "--port",
      "0",
      "--threads",
      "1",
    ]);
    try {
      expect(s.cli.output.stderr).toContain("warning: listening on 0.0.0.0");
      const port = new URL(s.base).port;
      const r = await request(`http://127.0.0.1:${port}`, "GET", "/health");
      expect(r.json.ready).toBe(true);
    } finally {
      expect((await s.stop()).code).toBe(0);
    }
  });

  it("SIGTERM lets a request in flight finish, refuses new connections, exits 0", async () => {
    const s = await startRetrieverServer([
      "--index",
      ix.index,
      "--corpus",
      ix.corpus,
      "--port",
      "0",
    ]);
    // A request whose body is half sent when the signal arrives: it is in flight.
    const answer = new Promise<Reply>((resolve, reject) => {
      const req = http.request(
        `${s.base}/retrieve`,
        { method: "POST", headers: { "Content-Type": "application/json" }, agent: false },
        (res) => {
          let text = "";
          res.setEncoding("utf8").on("data", (d: string) => {
            text += d;
          });
          res.on("end", () =>
            resolve({
              status: res.statusCode ?? 0,
              headers: res.headers,
              text,
              json: JSON.parse(text),
            }),
          );
        },
      );
      req.on("error", reject);
      req.write('{"queries": ["Paul Walker", ');
      setTimeout(() => {
        s.cli.child.kill("SIGTERM");
        const wait = setInterval(() => {
          if (!s.cli.output.stderr.includes("SIGTERM: stopping")) return;
          clearInterval(wait);
          req.end('"duplicatum"], "topk": 3, "return_scores": true}');
        }, 20);
      }, 300);
    });
    const r = await answer;
    expect(s.cli.output.stderr).toContain("SIGTERM: stopping; 1 request in flight to finish");
    expect(r.status).toBe(200);
    expect(r.headers.connection).toBe("close");
    expect(r.json.result[0][0].document.contents).toBe(PAUL_WALKER_CONTENTS);
    expect(r.json.result[1]).toHaveLength(3);
    const done = await s.cli.result;
    expect(done.code).toBe(0);
    expect(done.stderr).toContain("retriever stopped");
    await expect(
      request(s.base, "GET", "/health", undefined, { agent: undefined }),
    ).rejects.toThrow(/ECONNREFUSED/);
  });
});
