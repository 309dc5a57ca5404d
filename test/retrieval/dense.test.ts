// Dense (e5) retrieval end to end with the real CLI, the native encoder and index: an
// index file built by faiss from transformers' embeddings is served unchanged and answers
// as Search-R1's server would (test/retrieval/make_dense_fixtures.py, committed), and
// `build-index --retriever e5` writes the same vectors, resumably.
import {
  copyFileSync,
  existsSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { runCli, startCli } from "../helpers/cli.js";
import { request } from "../helpers/http.js";
import { startRetrieverServer } from "./helpers.js";
import { runIndex } from "./index-tool.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/", import.meta.url));
const DENSE = join(FIXTURES, "dense");
const MODEL = join(FIXTURES, "bert", "model");
const CORPUS = join(DENSE, "corpus.jsonl");
const expected = JSON.parse(readFileSync(join(DENSE, "expected.json"), "utf8")) as {
  k: number;
  queries: string[];
  flat: { ids: number[][]; scores: number[][] };
  hnsw: { ids: number[][]; scores: number[][] };
};
const tmp = mkdtempSync(join(tmpdir(), "sr1-dense-"));
const ENV = { XDG_CACHE_HOME: join(tmp, "cache"), OMP_NUM_THREADS: "2" };
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** Bytes per vector of the fixture index (its d, at byte 4, times 4). */
const ROW_BYTES = readFileSync(join(DENSE, "e5_Flat.index")).readInt32LE(4) * 4;

/** The float vectors of a faiss IndexFlat file (data from byte 45). */
function flatVectors(file: string): Float32Array {
  const bytes = readFileSync(file);
  const copy = new Uint8Array(bytes.subarray(45));
  return new Float32Array(copy.buffer, 0, copy.length / 4);
}

function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs((a[i] as number) - (b[i] as number)));
  return m;
}

interface Scored {
  document: { id: string; contents: string };
  score: number;
}

/** Our flags for serving `index` with the fixture encoder. */
const serveArgs = (index: string) => [
  "--retriever",
  "e5",
  "--index",
  index,
  "--corpus",
  CORPUS,
  "--retriever-model",
  MODEL,
];

async function expectFaissAnswers(
  args: string[],
  want: { ids: number[][]; scores: number[][] },
  index: Record<string, unknown> = {},
): Promise<void> {
  const server = await startRetrieverServer([...args, "--port", "0"], 60_000);
  try {
    const lines = readFileSync(CORPUS, "utf8").trim().split("\n");
    const body = JSON.stringify({
      queries: expected.queries,
      topk: expected.k,
      return_scores: true,
    });
    const reply = await request(server.base, "POST", "/retrieve", body);
    expect(reply.status, reply.text).toBe(200);
    const result = reply.json.result as Scored[][];
    expect(result).toHaveLength(expected.queries.length);
    result.forEach((list, q) => {
      const rows = (want.ids[q] as number[]).filter((id) => id >= 0);
      expect(list.map((s) => s.document.id)).toEqual(rows.map((r) => `doc-${r}`));
      list.forEach((s, j) => {
        expect(s.document).toEqual(JSON.parse(lines[rows[j] as number] as string));
        expect(Math.abs(s.score - (want.scores[q]?.[j] as number))).toBeLessThan(1e-4);
      });
    });
    // Concurrent requests (batched into one native call) get the same answers.
    const singles = await Promise.all(
      expected.queries.map((q) =>
        request(server.base, "POST", "/retrieve", JSON.stringify({ queries: [q], topk: 2 })),
      ),
    );
    singles.forEach((r, q) => {
      expect(r.json.result[0].map((d: { id: string }) => d.id)).toEqual(
        result[q]?.slice(0, 2).map((s) => s.document.id),
      );
    });
    const health = await request(server.base, "GET", "/health");
    expect(health.json.retriever).toBe("e5");
    expect(health.json.documents).toBe(lines.length);
    expect(health.json.index.rss_bytes).toBeGreaterThan(0);
    expect(health.json.index).toMatchObject(index);
  } finally {
    const stopped = await server.stop();
    expect(stopped.code, stopped.stderr).toBe(0);
  }
}

describe("serve-retriever --retriever e5", () => {
  it("serves faiss's e5_Flat.index unchanged: faiss's ids, scores within 1e-4", async () => {
    await expectFaissAnswers(serveArgs(join(DENSE, "e5_Flat.index")), expected.flat, {
      rescore: null,
    });
  }, 120_000);

  it("serves faiss's HNSW file with faiss's search (Search-R1's flag spellings)", async () => {
    // as retrieval_launch.sh launches it
    const args = ["--retriever_name", "e5", "--index_path", join(DENSE, "e5_HNSW.index")];
    args.push("--corpus_path", CORPUS, "--retriever_model", MODEL, "--faiss_gpu");
    await expectFaissAnswers(args, expected.hnsw, { ef_search: 64, rescore: null });
  }, 120_000);

  it("--rescore-from: an SQ8 index answers with the Flat file's exact lists and scores", async () => {
    const flat = join(DENSE, "e5_Flat.index");
    const sq8 = join(tmp, "e5_SQ8.index");
    const built = runIndex(["build", "--from", flat, "--type", "SQ8", "--out", sq8]);
    expect(built.code, built.stderr).toBe(0);
    const args = [...serveArgs(sq8), "--rescore-from", flat, "--rescore-candidates", "2"];
    await expectFaissAnswers(args, expected.flat, {
      type: "IndexScalarQuantizer",
      rescore: { from: flat, candidates: 2 },
    });
    // With an explicit beam: the one /health reports.
    const hnsw = [...serveArgs(join(DENSE, "e5_HNSW.index")), "--ef-search", "20"];
    await expectFaissAnswers([...hnsw, "--rescore-from", flat], expected.flat, {
      ef_search: 20,
      rescore: { from: flat, candidates: 4 },
    });
  }, 120_000);

  it("refuses what it cannot serve, naming the flag or file", () => {
    const base = ["serve-retriever", "--retriever", "e5", "--corpus", CORPUS, "--port", "0"];
    const noModel = runCli([...base, "--index", join(DENSE, "e5_Flat.index")], { env: ENV });
    expect(noModel.code).toBe(2);
    expect(noModel.stderr).toContain("--retriever-model");
    const otherCorpus = runCli(
      [...base, "--index", join(FIXTURES, "faiss", "flat-ip.index"), "--retriever-model", MODEL],
      { env: ENV },
    );
    expect(otherCorpus.code).toBe(1);
    expect(otherCorpus.stderr).toMatch(
      /flat-ip\.index holds 1200 vectors but .*corpus\.jsonl has 60 rows/,
    );
    const missing = runCli(
      [...base, "--index", join(tmp, "nope.index"), "--retriever-model", MODEL],
      {
        env: ENV,
      },
    );
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain("nope.index: no such index file");
    // a truncated file: the native reader's one line, before any corpus scan
    const cut = join(tmp, "cut.index");
    writeFileSync(cut, readFileSync(join(DENSE, "e5_Flat.index")).subarray(0, 5000));
    const truncated = runCli([...base, "--index", cut, "--retriever-model", MODEL], { env: ENV });
    expect(truncated.code).toBe(1);
    expect(truncated.stderr.trim()).toMatch(
      /^searchr1: error: \S*cut\.index: truncated: 60 vectors/,
    );
    expect(truncated.stderr).not.toContain("indexing corpus rows");
    // a Flat file of other vectors to rescore from: named by its flag, before any corpus scan
    const flat = [...base, "--index", join(DENSE, "e5_Flat.index"), "--retriever-model", MODEL];
    const other = runCli([...flat, "--rescore-from", join(FIXTURES, "faiss", "flat-ip.index")], {
      env: ENV,
    });
    expect(other.code).toBe(1);
    expect(other.stderr.trim()).toMatch(
      /^searchr1: error: --rescore-from \S*flat-ip\.index: holds 1200 vectors of d = 64 but \S*e5_Flat\.index holds 60 of d = \d+ /,
    );
    const bm25 = runCli(
      [...base.map((x) => (x === "e5" ? "bm25" : x)), "--index", tmp, "--rescore-from", CORPUS],
      { env: ENV },
    );
    expect(bm25.code).toBe(2);
    expect(bm25.stderr).toContain(
      "--rescore-from applies to a dense index (e5, bge), not --retriever bm25",
    );
    const nprobe = runCli(
      [...base.map((x) => (x === "e5" ? "bm25" : x)), "--index", tmp, "--nprobe", "8"],
      { env: ENV },
    );
    expect(nprobe.code).toBe(2);
    expect(nprobe.stderr).toContain(
      "--nprobe applies to a dense index (e5, bge), not --retriever bm25",
    );
    const alone = runCli([...flat, "--rescore-candidates", "8"], { env: ENV });
    expect(alone.code).toBe(2);
    expect(alone.stderr).toContain(
      "--rescore-candidates (rescore_candidates) applies with --rescore-from",
    );
  }, 60_000);
});

describe("build-index --retriever e5", () => {
  const out = join(tmp, "built", "e5_Flat.index");
  const build = (extra: string[] = []) =>
    runCli(
      [
        "build-index",
        "--retriever",
        "e5",
        "--retriever-model",
        MODEL,
        "--corpus",
        CORPUS,
        "--out",
        out,
        "--batch-size",
        "8",
        ...extra,
      ],
      { env: ENV },
    );

  it("writes faiss's vectors (index_builder.py's recipe) as an IndexFlatIP file", () => {
    const r = build();
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/e5_Flat\.index: 60 passages \(IndexFlatIP/);
    expect(maxAbsDiff(flatVectors(out), flatVectors(join(DENSE, "e5_Flat.index")))).toBeLessThan(
      1e-5,
    );
    // the same header faiss writes for these vectors
    expect(readFileSync(out).subarray(0, 45)).toEqual(
      readFileSync(join(DENSE, "e5_Flat.index")).subarray(0, 45),
    );
    expect(existsSync(`${out}.partial`)).toBe(false);
    const again = build();
    expect(again.code).toBe(2);
    expect(again.stderr).toContain("pass --overwrite");
  }, 120_000);

  it("resumes an interrupted build: the result equals an uninterrupted build's", async () => {
    // a corpus long enough to interrupt: the fixture's rows 40 times over
    const rows = readFileSync(CORPUS, "utf8").trim().split("\n");
    const big = join(tmp, "big.jsonl");
    const lines = Array.from({ length: 40 }, (_, i) =>
      rows.map((l) => l.replace(/"doc-/, `"copy${i}-`)),
    ).flat();
    writeFileSync(big, `${lines.join("\n")}\n`);
    const args = (out: string) => [
      "build-index",
      "--retriever",
      "e5",
      "--retriever-model",
      MODEL,
      "--corpus",
      big,
      "--out",
      out,
      "--batch-size",
      "4",
    ];
    const whole = join(tmp, "whole.index");
    expect(runCli(args(whole), { env: ENV }).code).toBe(0);

    const resumed = join(tmp, "resumed.index");
    const run = startCli(args(resumed), { env: ENV });
    const partial = `${resumed}.partial`;
    // Ctrl-C once some batches are durable
    while (!existsSync(partial) || statSync(partial).size < 45 + 8 * ROW_BYTES) {
      expect(run.child.exitCode).toBe(null);
      await new Promise((r) => setTimeout(r, 10));
    }
    run.child.kill("SIGINT");
    const stopped = await run.result;
    expect(stopped.code, stopped.stderr).toBe(130);
    expect(stopped.stderr).toContain("run the same command again to resume");
    expect(existsSync(resumed)).toBe(false);
    const kept = Math.floor((statSync(partial).size - 45) / ROW_BYTES);
    expect(kept).toBeGreaterThanOrEqual(8);
    expect(kept).toBeLessThan(lines.length);

    const other = runCli([...args(resumed), "--pooling", "cls"], { env: ENV });
    expect(other.code).toBe(2);
    expect(other.stderr).toContain("an unfinished build with other settings (pooling");

    const r = runCli(args(resumed), { env: ENV });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(
      new RegExp(`${lines.length.toLocaleString("en-US")} passages.*resumed at \\d`),
    );
    expect(readFileSync(resumed).equals(readFileSync(whole))).toBe(true);
    expect(existsSync(partial)).toBe(false);
    expect(existsSync(`${partial}.json`)).toBe(false);
  }, 180_000);

  it("is served like faiss's file (a build of ours answers the fixture queries)", async () => {
    const copy = join(tmp, "ours.index");
    copyFileSync(out, copy);
    await expectFaissAnswers(serveArgs(copy), expected.flat);
  }, 120_000);

  it("--faiss-type HNSW8 and SQ8: the encoded vectors made into faiss's index types", () => {
    for (const [type, cls] of [
      ["HNSW8", "IndexHNSWFlat"],
      ["SQ8", "IndexScalarQuantizer"],
    ] as const) {
      const file = join(tmp, "built", `e5_${type}.index`);
      const r = runCli(
        [
          "build-index",
          "--retriever",
          "e5",
          "--retriever-model",
          MODEL,
          "--corpus",
          CORPUS,
          "--out",
          file,
          "--faiss-type",
          type,
          "--quiet",
        ],
        { env: ENV },
      );
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toContain(`60 passages (${cls}`);
      const info = JSON.parse(runIndex(["info", "--index", file]).stdout);
      expect(info).toMatchObject({ type: cls, ntotal: 60 });
      if (type === "HNSW8") {
        expect(info.hnsw).toMatchObject({ M: 8, ef_construction: 80 });
        // the graph's vectors are the flat build's, row for row
        const bytes = 60 * info.d * 4;
        expect(
          maxAbsDiff(
            new Float32Array(Uint8Array.from(readFileSync(file).subarray(-bytes)).buffer),
            flatVectors(join(DENSE, "e5_Flat.index")),
          ),
        ).toBeLessThan(1e-5);
      }
      expect(existsSync(`${file}.flat.partial`)).toBe(false);
      expect(existsSync(`${file}.partial.json`)).toBe(false);
    }
  }, 120_000);

  it("--faiss-type IVF2,PQ16x4: an IndexIVFPQ, served with --nprobe and rescored exactly", async () => {
    const file = join(tmp, "built", "e5_IVF.index");
    const ivf = (type: string) =>
      runCli(
        [
          "build-index",
          "--retriever",
          "e5",
          "--retriever-model",
          MODEL,
          "--corpus",
          CORPUS,
          "--out",
          file,
          "--faiss-type",
          type,
          "--quiet",
        ],
        { env: ENV },
      );
    // M must divide the encoder's size: refused before any passage is encoded
    const odd = ivf("IVF2,PQ7");
    expect(odd.code).toBe(2);
    expect(odd.stderr).toContain(
      "--faiss-type IVF2,PQ7: PQ7 does not divide the encoder's size d = 64",
    );
    expect(existsSync(`${file}.partial`)).toBe(false);
    // more lists than passages: refused by the builder after the encoding, which is kept
    const many = ivf("IVF100,PQ16x4");
    expect(many.code).toBe(2);
    expect(many.stderr).toContain("--faiss-type IVF100,PQ16x4: 100 lists for 60 vectors");
    expect(existsSync(`${file}.flat.partial`)).toBe(true);
    const r = ivf("IVF2,PQ16x4");
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/60 passages \(IndexIVFPQ.*resumed at 60/);
    expect(JSON.parse(runIndex(["info", "--index", file]).stdout)).toMatchObject({
      type: "IndexIVFPQ",
      ntotal: 60,
      ivf: { nlist: 2, nprobe: 1, quantizer: "IndexFlatIP" },
      pq: { M: 16, nbits: 4 },
    });
    expect(existsSync(`${file}.flat.partial`)).toBe(false);
    // 5 x 20 candidates of 60 rows: all of them, rescored from the Flat file, give its lists
    const flat = join(DENSE, "e5_Flat.index");
    const args = [...serveArgs(file), "--nprobe", "2", "--rescore-from", flat];
    await expectFaissAnswers([...args, "--rescore-candidates", "20"], expected.flat, {
      type: "IndexIVFPQ",
      nprobe: 2,
      rescore: { from: flat, candidates: 20 },
    });
  }, 180_000);

  it("refuses an unknown --faiss-type and a missing encoder, naming them", () => {
    const ivf = build(["--faiss-type", "IVF4096,Flat", "--overwrite"]);
    expect(ivf.code, ivf.stderr).toBe(2);
    expect(ivf.stderr).toContain("faiss-type");
    const noModel = runCli([
      "build-index",
      "--retriever",
      "e5",
      "--corpus",
      CORPUS,
      "--out",
      join(tmp, "x.index"),
    ]);
    expect(noModel.code, noModel.stderr).toBe(2);
    expect(noModel.stderr).toContain("--retriever-model");
  });
});
