// The reranker end to end: the model's tokenizer (pairs, longest_first truncation), the
// native cross-encoder (searchr1-index serve --reranker) against a plain-torch
// BertForSequenceClassification (test/retrieval/make_cross_encoder_fixtures.py, committed),
// and `serve-retriever --reranker` on the loopback: POST /rerank and retrieve-then-rerank
// behind POST /retrieve, with Search-R1's two reranker bugs fixed; `download` of the model.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { activationOf, CrossEncoder } from "../../src/retrieval/rerank/cross-encoder.js";
import { passageText } from "../../src/retrieval/rerank/rerank.js";
import { loadEncoderTokenizer } from "../../src/text/encoder-tokenizer.js";
import { runCli, startCli } from "../helpers/cli.js";
import { expectJsonError, request } from "../helpers/http.js";
import { createHubServer } from "../helpers/hub-server.js";
import { type RunningRetriever, startRetrieverServer } from "./helpers.js";
import { runIndex } from "./index-tool.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/cross-encoder/", import.meta.url));
const MODEL = join(FIXTURES, "model");
const CORPUS = join(FIXTURES, "corpus.jsonl");
/**
 * |native - torch| of a score. The issue asks for 1e-5; measured 6.9e-6 on two threads,
 * where torch's own scores of a pair alone and inside the padded batch differ by 4.1e-6 and
 * torch's float32 scores differ from float64 ones by 4.2e-6 (the script prints it).
 */
const TOL = 1e-5;

interface Pair {
  query: string;
  passage: string;
  input_ids: number[];
  token_type_ids: number[];
  score: number;
}
const expected = JSON.parse(readFileSync(join(FIXTURES, "expected.json"), "utf8")) as {
  max_length: number;
  queries: string[];
  pairs: Pair[];
};
const rows = readFileSync(CORPUS, "utf8")
  .trim()
  .split("\n")
  .map((line) => JSON.parse(line) as { id: string; contents: string });
/** The fixture's score of a query with a corpus row. */
const scoreOf = (query: string, row: number): number => {
  const pair = expected.pairs.find(
    (p) =>
      p.query === query && p.passage === passageText((rows[row] as { contents: string }).contents),
  );
  if (!pair) throw new Error(`no fixture pair for ${query} / row ${row}`);
  return pair.score;
};

const tmp = mkdtempSync(join(tmpdir(), "sr1-rerank-"));
const ENV = { XDG_CACHE_HOME: join(tmp, "cache"), OMP_NUM_THREADS: "2" };
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe("the cross-encoder against plain-torch BertForSequenceClassification", () => {
  it("builds Search-R1's passage text: (Title: <first line>) <rest>", () => {
    expect(passageText('"Paris"\nParis is big.\nIt is old.')).toBe(
      '(Title: "Paris") Paris is big.\nIt is old.',
    );
    expect(passageText("no title line")).toBe("(Title: no title line) ");
  });

  it("tokenizes pairs as the fixture's BertTokenizer with longest_first truncation", async () => {
    const tokenizer = loadEncoderTokenizer(MODEL, { maxLength: expected.max_length });
    const encoded = await tokenizer.encodePairBatch(
      expected.pairs.map((p) => [p.query, p.passage]),
    );
    encoded.forEach((e, i) => {
      const p = expected.pairs[i] as Pair;
      expect(e.ids, p.passage).toEqual(p.input_ids);
      expect(e.typeIds).toEqual(p.token_type_ids);
    });
    // the truncated pairs are there: one with both texts cut (48 = 1 + 22 + 1 + 23 + 1), one
    // with only the passage cut
    const long = expected.pairs.slice(-2).map((p) => p.token_type_ids);
    expect(long.map((t) => t.length)).toEqual([48, 48]);
    expect(long[0]?.filter((t) => t === 0).length).toBe(24);
    expect(long[1]?.filter((t) => t === 0).length).toBe(5);
  });

  it("scores every pair within 1e-5 (searchr1-index serve --reranker, CPU)", async () => {
    const encoder = await CrossEncoder.open({
      model: MODEL,
      device: "cpu",
      threads: 2,
      batchSize: 7,
    });
    try {
      expect(encoder.maxLength).toBe(expected.max_length);
      expect(encoder.activation).toBe("identity");
      const scores = await encoder.score(expected.pairs.map((p) => [p.query, p.passage]));
      let worst = 0;
      scores.forEach((s, i) => {
        worst = Math.max(worst, Math.abs(s - (expected.pairs[i] as Pair).score));
      });
      console.log(`cross-encoder: max |native - torch| = ${worst.toExponential(2)}`);
      expect(worst).toBeLessThan(TOL);
      // a pair alone scores as in the batch
      const alone = await encoder.score([
        [expected.pairs[5]?.query ?? "", expected.pairs[5]?.passage ?? ""],
      ]);
      expect(Math.abs((alone[0] as number) - (scores[5] as number))).toBeLessThan(TOL);
    } finally {
      await encoder.close();
    }
  }, 60_000);

  it("applies the activation config.json names, as sentence-transformers' CrossEncoder", async () => {
    // none named: sentence-transformers' default for one label, Sigmoid
    const dir = join(tmp, "sigmoid");
    cpSync(MODEL, dir, { recursive: true });
    const config = JSON.parse(readFileSync(join(MODEL, "config.json"), "utf8"));
    delete config.sentence_transformers;
    writeFileSync(join(dir, "config.json"), JSON.stringify(config));
    expect(activationOf(dir)).toBe("sigmoid");
    const encoder = await CrossEncoder.open({
      model: dir,
      device: "cpu",
      threads: 2,
      batchSize: 32,
    });
    try {
      const p = expected.pairs[0] as Pair;
      const [s] = await encoder.score([[p.query, p.passage]]);
      expect(Math.abs((s as number) - 1 / (1 + Math.exp(-p.score)))).toBeLessThan(TOL);
    } finally {
      await encoder.close();
    }
    // sentence-transformers before v4 named it sbert_ce_default_activation_function
    config.sbert_ce_default_activation_function = "torch.nn.modules.linear.Identity";
    writeFileSync(join(dir, "config.json"), JSON.stringify(config));
    expect(activationOf(dir)).toBe("identity");
    config.sentence_transformers = { activation_fn: "torch.nn.modules.activation.Tanh" };
    writeFileSync(join(dir, "config.json"), JSON.stringify(config));
    expect(() => activationOf(dir)).toThrow(
      /config\.json: the activation "torch\.nn\.modules\.activation\.Tanh" is not supported/,
    );
  }, 60_000);

  it("refuses a checkpoint without the classification head, naming the tensor", () => {
    const r = runIndex(["serve", "--reranker", join(FIXTURES, "..", "bert", "model")]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /tensor 'classifier\.weight' is missing: not a sequence classification checkpoint/,
    );
  });
});

describe("serve-retriever --reranker (BM25 over the fixture corpus)", () => {
  let server: RunningRetriever;
  let index: string;

  beforeAll(async () => {
    index = join(tmp, "bm25");
    const built = runCli(["build-index", "--corpus", CORPUS, "--out", index, "--quiet"], {
      env: ENV,
    });
    expect(built.code, built.stderr).toBe(0);
    // Search-R1's retrieval_launch_hierarchical.sh flags (but the retriever)
    server = await startRetrieverServer(
      [
        "--index_path",
        index,
        "--corpus_path",
        CORPUS,
        "--retriever_name",
        "bm25",
        "--reranker_model",
        MODEL,
        "--retrieval_topk",
        "6",
        "--reranking_topk",
        "3",
        "--reranker_batch_size",
        "4",
        "--device",
        "cpu",
        "--threads",
        "2",
        "--port",
        "0",
      ],
      60_000,
    );
  }, 120_000);
  afterAll(async () => {
    const stopped = await server?.stop();
    expect(stopped?.code, stopped?.stderr).toBe(0);
  });

  const post = (path: string, body: unknown) =>
    request(server.base, "POST", path, JSON.stringify(body));

  interface Scored {
    document: { id: string; contents: string };
    score: number;
  }

  /** Each document is a corpus row as the corpus holds it, scored with the fixture's score. */
  function expectReranked(list: Scored[], query: string) {
    list.forEach((s, j) => {
      const row = Number(s.document.id);
      expect(s.document).toEqual(rows[row]);
      expect(Math.abs(s.score - scoreOf(query, row))).toBeLessThan(TOL);
      if (j > 0) expect(s.score).toBeLessThanOrEqual((list[j - 1] as Scored).score);
    });
  }

  it("POST /retrieve retrieves, reranks, and returns the retriever's document shape", async () => {
    const all = await post("/retrieve", {
      queries: expected.queries,
      topk: 6,
      return_scores: true,
    });
    expect(all.status, all.text).toBe(200);
    const lists = all.json.result as Scored[][];
    expect(lists).toHaveLength(expected.queries.length);
    lists.forEach((list, q) => {
      expect(list.length).toBeGreaterThan(0);
      expectReranked(list, expected.queries[q] as string);
    });
    // BM25 ranks "Paris" (row 0) above "Tokyo" (row 1) for the first query (the test of a
    // server without --reranker below); the cross-encoder's scores put Tokyo first
    expect(lists[0]?.map((s) => s.document.id)).toEqual(["1", "0"]);
    // the trainer's topk is respected: the best of the same candidates
    const two = await post("/retrieve", {
      queries: expected.queries,
      topk: 2,
      return_scores: true,
    });
    (two.json.result as Scored[][]).forEach((list, q) => {
      expect(list).toEqual(lists[q]?.slice(0, 2));
    });
    // no topk: --reranking_topk; no scores: bare rows (generation.py reads doc["contents"])
    const bare = await post("/retrieve", { queries: [expected.queries[0]] });
    expect(bare.json.result[0]).toEqual(lists[0]?.slice(0, 3).map((s) => s.document));
  });

  it("POST /rerank scores each query against its own documents only (Search-R1's bug 1 fixed)", async () => {
    const [q0, q1, q2] = expected.queries as [string, string, string];
    const reply = await post("/rerank", {
      queries: [q0, q1, q2],
      // q0: rows 0..3 as bare corpus rows; q1: row 4 in /retrieve's scored shape; q2: none
      documents: [[0, 1, 2, 3].map((r) => rows[r]), [{ document: rows[4], score: 12.5 }], []],
      rerank_topk: 2,
      return_scores: true,
    });
    expect(reply.status, reply.text).toBe(200);
    const [a, b, c] = reply.json.result as Scored[][];
    expect(a).toHaveLength(2);
    expectReranked(a as Scored[], q0);
    const best = [0, 1, 2, 3].sort((x, y) => scoreOf(q0, y) - scoreOf(q0, x)).slice(0, 2);
    expect(a?.map((s) => Number(s.document.id))).toEqual(best);
    // upstream would rank q0's four documents for q1 too, and drop q2's empty list
    expect(b).toEqual([{ document: rows[4], score: expect.any(Number) }]);
    expect(Math.abs((b?.[0]?.score as number) - scoreOf(q1, 4))).toBeLessThan(TOL);
    expect(c).toEqual([]);
    // without scores: the documents (objects, not upstream's strings); default rerank_topk 3
    const bare = await post("/rerank", { queries: [q0], documents: [rows] });
    expect(bare.json.result[0]).toHaveLength(3);
    for (const doc of bare.json.result[0]) expect(rows).toContainEqual(doc);
  });

  it("answers bad /rerank requests with 400 naming the field, and keeps serving", async () => {
    await expectJsonError(
      post("/rerank", { queries: ["a", "b"], documents: [[]] }),
      400,
      '"documents" has 1 lists for 2 queries',
    );
    await expectJsonError(
      post("/rerank", { queries: ["a"], documents: [[{ id: "0" }]] }),
      400,
      '"documents[0][0]"',
    );
    await expectJsonError(
      post("/rerank", { queries: ["a"], documents: [[]], rerank_topk: -1 }),
      400,
      '"rerank_topk"',
    );
    await expectJsonError(request(server.base, "GET", "/rerank"), 405, "use POST");
    const health = await request(server.base, "GET", "/health");
    expect(health.status).toBe(200);
    expect(health.json.reranker).toMatchObject({
      model: MODEL,
      max_length: expected.max_length,
      activation: "identity",
      retrieval_topk: 6,
      batch_size: 4,
    });
    expect(health.json.topk).toBe(3);
  });
});

describe("serve-retriever: the reranker's flags", () => {
  it("refuses reranker keys without --reranker, and --reranker with web search", () => {
    const base = ["serve-retriever", "--index", "idx", "--corpus", CORPUS, "--port", "0"];
    const topk = runCli([...base, "--rerank-topk", "2"], { env: ENV });
    expect(topk.code).toBe(2);
    expect(topk.stderr).toContain("--rerank-topk (rerank_topk) applies with a reranker");
    const online = runCli(["serve-retriever", "--retriever", "serper", "--reranker", MODEL], {
      env: { ...ENV, SERPER_API_KEY: "k" },
    });
    expect(online.code).toBe(2);
    expect(online.stderr).toContain("--reranker applies to bm25, e5 and bge");
  });

  it("a server without --reranker has no /rerank and says so", async () => {
    const index = join(tmp, "bm25-plain");
    expect(
      runCli(["build-index", "--corpus", CORPUS, "--out", index, "--quiet"], { env: ENV }).code,
    ).toBe(0);
    const server = await startRetrieverServer([
      "--index",
      index,
      "--corpus",
      CORPUS,
      "--port",
      "0",
    ]);
    try {
      await expectJsonError(
        request(server.base, "POST", "/rerank", "{}"),
        404,
        "(POST /rerank with --reranker)",
      );
      const bm25 = await request(
        server.base,
        "POST",
        "/retrieve",
        JSON.stringify({ queries: [expected.queries[0]], topk: 6 }),
      );
      expect(bm25.json.result[0].map((d: { id: string }) => d.id)).toEqual(["0", "1"]);
    } finally {
      await server.stop();
    }
  }, 60_000);
});

describe("download model:cross-encoder/ms-marco-MiniLM-L12-v2", () => {
  it("fetches what the reranker loads, and serve-retriever --reranker loads it", async () => {
    // the files of the hub's repository (its ONNX/OpenVINO exports and PyTorch weights are
    // left out), with the fixture model's bytes
    const file = (name: string) => readFileSync(join(MODEL, name));
    const hub = await createHubServer({
      repos: [
        {
          id: "cross-encoder/ms-marco-MiniLM-L12-v2",
          type: "model",
          files: [
            { path: ".gitattributes", content: Buffer.from("*.bin filter=lfs\n") },
            { path: "README.md", content: Buffer.from("# ms-marco-MiniLM-L12-v2\n") },
            { path: "config.json", content: file("config.json") },
            { path: "model.safetensors", content: file("model.safetensors"), lfs: true },
            { path: "pytorch_model.bin", content: Buffer.alloc(1000, 1), lfs: true },
            { path: "onnx/model.onnx", content: Buffer.alloc(1000, 2), lfs: true },
            { path: "openvino/openvino_model.bin", content: Buffer.alloc(1000, 3), lfs: true },
            { path: "special_tokens_map.json", content: Buffer.from("{}") },
            { path: "tokenizer.json", content: file("tokenizer.json") },
            { path: "tokenizer_config.json", content: file("tokenizer_config.json") },
          ],
        },
      ],
    });
    try {
      const dir = join(tmp, "download");
      const r = await startCli(
        ["download", "--save-path", dir, "--what", "model:cross-encoder/ms-marco-MiniLM-L12-v2"],
        { env: { ...ENV, HF_ENDPOINT: hub.url, HF_TOKEN: "" } },
      ).result;
      expect(r.code, r.stderr).toBe(0);
      const model = join(dir, "ms-marco-MiniLM-L12-v2");
      const encoder = await CrossEncoder.open({ model, device: "cpu", threads: 2, batchSize: 32 });
      try {
        const p = expected.pairs[3] as Pair;
        const [s] = await encoder.score([[p.query, p.passage]]);
        expect(Math.abs((s as number) - p.score)).toBeLessThan(TOL);
      } finally {
        await encoder.close();
      }
    } finally {
      await hub.close();
    }
  }, 60_000);
});
