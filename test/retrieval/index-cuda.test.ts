// searchr1-index search and serve with --device cuda (native/src/index/flat_search_cuda.h):
// exact flat search on the GPU with the vectors in fp16, as faiss's GPU index with
// useFloat16 in Search-R1's --faiss_gpu mode. On a GPU it checks, on the committed faiss
// fixtures (faiss-index.test.ts's), that the GPU finds faiss's exact neighbours (recall@k
// >= 0.99) with every rank's score within 2e-3 of faiss's: fp16 keeps 11 significant bits,
// so for these unit vectors (d <= 64) a score moves by at most about 2 x 2^-11 x |q||x|
// (1e-3, L2 twice that at worst; a few 1e-4 in practice). k 1, 10 and 64 are checked
// against faiss's own results, k 100 and 2048 (more than ntotal: empty places) against
// the CPU search, which equals faiss's. Each runs once as a single shard in one block and
// once cut into 3 shards (all on GPU 0: the host's merge) of 256-row blocks of 96-row
// tiles, fewer rows than k (the tiles' padding and the running lists' merge).
// Without a usable GPU those are skipped with the reason, as in test/native/cuda.test.ts;
// what runs here is the refusal of --device cuda and of the GPU options without it.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { nativeDir } from "../../src/runtime/native-executable.js";
import {
  readSafetensors,
  readSafetensorsHeader,
  type Tensor,
} from "../../src/tensors/safetensors.js";
import { ServeProcess } from "../helpers/serve-process.js";
import { gpuStatus } from "../native/helpers.js";

const { cuda, gpu: GPU } = gpuStatus("retrieval/index-cuda.test.ts");

const FIXTURES = fileURLToPath(new URL("./fixtures/faiss/", import.meta.url));
const fixture = (name: string): string => join(FIXTURES, name);
const EXE = join(nativeDir(), "searchr1-index");
const ENV = { ...process.env, OMP_NUM_THREADS: "2" };
const tmp = mkdtempSync(join(tmpdir(), "sr1-index-cuda-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** fp16 rounding of vectors and queries (see the top of the file). */
const SCORE_TOL = 2e-3;
const MIN_RECALL = 0.99;
/** Cut into shards, blocks and tiles: every merge path runs on the 1000-1200-row fixtures. */
const SHARDED = ["--gpus", "0,0,0", "--block-rows", "256", "--tile-rows", "96"];

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function index(args: string[]): Run {
  const r = spawnSync(EXE, args, { encoding: "utf8", timeout: 120_000, env: ENV });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

interface Result {
  nq: number;
  k: number;
  ids: BigInt64Array;
  scores: Float32Array;
}

let outputs = 0;
/** `searchr1-index search` on a fixture's queries. */
async function search(name: string, k: number, extra: string[] = []): Promise<Result> {
  const out = join(tmp, `out-${outputs++}.safetensors`);
  const args = ["search", "--index", fixture(`${name}.index`), "--queries"];
  args.push(fixture(`${name}.expected.safetensors`), "--k", String(k), "--out", out, ...extra);
  const r = index(args);
  if (r.code !== 0)
    throw new Error(`searchr1-index ${args.join(" ")} exited ${r.code}: ${r.stderr}`);
  const t = await readSafetensors(out);
  const ids = t.get("ids") as Tensor;
  return {
    nq: ids.shape[0] as number,
    k,
    ids: ids.data as BigInt64Array,
    scores: (t.get("scores") as Tensor).data as Float32Array,
  };
}

/** faiss's results for `k` from a fixture (k one of its metadata's). */
async function faissResult(name: string, k: number): Promise<Result> {
  const path = fixture(`${name}.expected.safetensors`);
  const meta = (await readSafetensorsHeader(path)).metadata;
  expect((meta.k ?? "").split(",")).toContain(String(k));
  const t = await readSafetensors(path);
  const ids = t.get(`k${k}.ids`) as Tensor;
  return {
    nq: ids.shape[0] as number,
    k,
    ids: ids.data as BigInt64Array,
    scores: (t.get(`k${k}.scores`) as Tensor).data as Float32Array,
  };
}

/**
 * Checks a GPU result against an exact one: recall of the exact ids over all queries, each
 * rank's score within SCORE_TOL (a score moved by at most e moves every rank's by at most
 * e), and the empty places (id -1) identical, worst score included.
 */
function expectClose(got: Result, exact: Result, what: string): void {
  expect(got.ids.length, what).toBe(exact.ids.length);
  let found = 0;
  let total = 0;
  let worst = 0;
  for (let q = 0; q < exact.nq; q++) {
    const row = (a: BigInt64Array) => [...a.subarray(q * exact.k, (q + 1) * exact.k)];
    const mine = new Set(row(got.ids));
    for (let j = 0; j < exact.k; j++) {
      const at = q * exact.k + j;
      const id = exact.ids[at] as bigint;
      if (id < 0n) {
        expect(got.ids[at], `${what}: query ${q} place ${j} is empty`).toBe(-1n);
        expect(got.scores[at], `${what}: query ${q} place ${j}`).toBe(exact.scores[at]);
        continue;
      }
      total++;
      if (mine.has(id)) found++;
      worst = Math.max(worst, Math.abs((got.scores[at] as number) - (exact.scores[at] as number)));
    }
  }
  expect(found / total, `${what}: recall`).toBeGreaterThanOrEqual(MIN_RECALL);
  expect(worst, `${what}: largest score difference`).toBeLessThan(SCORE_TOL);
}

describe("--device cuda where CUDA is unusable, and the GPU options without it", () => {
  const queries = fixture("flat-ip.expected.safetensors");
  const base = ["search", "--index", fixture("flat-ip.index"), "--queries", queries];
  const out = ["--out", join(tmp, "refused.safetensors")];

  it.skipIf(GPU)("search and serve exit 2 with one line saying why", () => {
    const reason = cuda?.reason ?? "";
    expect(reason).not.toBe("");
    const expectRefusal = (r: Run) => {
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr.trim().split("\n")).toEqual([`searchr1-index: --device cuda: ${reason}`]);
    };
    expectRefusal(index([...base, ...out, "--device", "cuda"]));
    expectRefusal(index(["serve", "--index", fixture("flat-l2.index"), "--device", "cuda"]));
  });

  it("--gpus, --block-rows, --tile-rows need --device cuda; k is at most 2048 there", () => {
    for (const extra of [
      ["--gpus", "2"],
      ["--block-rows", "256"],
      ["--tile-rows", "96"],
    ]) {
      const r = index([...base, ...out, ...extra]);
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toContain(`${extra[0]} applies to an exhaustive search with --device cuda`);
    }
    const big = index([...base, ...out, "--device", "cuda", "--k", "3000"]);
    expect(big.code).toBe(2);
    expect(big.stderr.trim()).toBe(
      "searchr1-index: --k 3000: --device cuda returns at most 2048 neighbours per query",
    );
    const bad = index([...base, ...out, "--device", "cuda", "--gpus", "one"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--gpus: 'one' is neither a count");
    const device = index([...base, ...out, "--device", "gpu"]);
    expect(device.code).toBe(2);
    expect(device.stderr).toContain("--device: unknown device 'gpu'");
    const serve = index(["serve", "--index", fixture("flat-l2.index"), "--gpus", "2"]);
    expect(serve.code).toBe(2);
    expect(serve.stderr).toContain("--gpus applies to an exhaustive search with --device cuda");
  });
});

describe.skipIf(!GPU)("flat search on the GPU finds faiss's exact neighbours", () => {
  for (const name of ["flat-ip", "flat-l2"]) {
    for (const [layout, extra] of [
      ["one shard", [] as string[]],
      ["3 shards of 256-row blocks, 96-row tiles", SHARDED],
    ] as const) {
      it(`${name}, ${layout}: recall >= ${MIN_RECALL}, scores within ${SCORE_TOL}`, async () => {
        const gpu = ["--device", "cuda", ...extra];
        for (const k of [1, 10, 64]) {
          expectClose(await search(name, k, gpu), await faissResult(name, k), `k=${k}`);
        }
        for (const k of [100, 2048]) {
          expectClose(await search(name, k, gpu), await search(name, k), `k=${k} vs the CPU`);
        }
      });
    }
  }

  it("a query that is a database row finds it first; a duplicated row ties as on the CPU", async () => {
    for (const extra of [[], SHARDED]) {
      const r = await search("flat-ip", 2, ["--device", "cuda", ...extra]);
      // queries 0 and 1 are rows 7 and 600; row 1100 is row 7's copy
      expect(new Set([...r.ids.subarray(0, 2)])).toEqual(new Set([7n, 1100n]));
      // bitwise-equal scores (one matmul computes both the same way) list the higher id first
      if (r.scores[0] === r.scores[1]) expect([...r.ids.subarray(0, 2)]).toEqual([1100n, 7n]);
      expect(r.ids[2]).toBe(600n);
      const l2 = await search("flat-l2", 1, ["--device", "cuda", ...extra]);
      expect([...l2.ids.subarray(0, 2)]).toEqual([7n, 500n]);
      expect(l2.scores[0]).toBeLessThan(SCORE_TOL);
    }
  });

  it("an HNSW file: --exact on the GPU, the graph on the CPU (with a note)", async () => {
    const exact = await search("hnsw-ip", 1, ["--exact", "--device", "cuda"]);
    expect([...exact.ids.subarray(0, 2)]).toEqual([7n, 750n]);
    const out = join(tmp, "graph.safetensors");
    const args = ["search", "--index", fixture("hnsw-ip.index"), "--queries"];
    args.push(fixture("hnsw-ip.expected.safetensors"), "--k", "10", "--out", out);
    const r = index([...args, "--device", "cuda"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toContain("the HNSW graph is searched on the CPU");
    const e = await readSafetensors(fixture("hnsw-ip.expected.safetensors"));
    const got = await readSafetensors(out);
    expect((got.get("ids") as Tensor).data).toEqual((e.get("file.k10.ids") as Tensor).data);
  });
});

describe.skipIf(!GPU)("serve --device cuda", () => {
  it("holds the index on the GPU (2 shards) and answers as search --device cuda", async () => {
    const path = fixture("flat-l2.expected.safetensors");
    const t = await readSafetensors(path);
    const q = t.get("queries") as Tensor;
    const [nq, d] = q.shape as [number, number];
    const data = q.data as Float32Array;
    const vectors = Array.from({ length: nq }, (_, i) => [...data.subarray(i * d, (i + 1) * d)]);
    const serve = new ServeProcess(
      EXE,
      ["serve", "--index", fixture("flat-l2.index"), "--device", "cuda", "--gpus", "0,0"],
      ENV,
    );
    const info = await serve.ok("info");
    expect(info).toMatchObject({ fp16: true, index_device: "cuda" });
    const shards = info.gpus as { gpu: number; first: number; rows: number; bytes: number }[];
    expect(shards.map((s) => [s.gpu, s.first, s.rows, s.bytes])).toEqual([
      [0, 0, 500, 500 * (32 * 2 + 4)],
      [0, 500, 500, 500 * (32 * 2 + 4)],
    ]);
    const exact = await faissResult("flat-l2", 10);
    const r = (await serve.ok("search", { k: 10, vectors })) as {
      ids: number[][];
      scores: number[][];
    };
    const got: Result = {
      nq,
      k: 10,
      ids: BigInt64Array.from(r.ids.flat().map(BigInt)),
      scores: Float32Array.from(r.scores.flat()),
    };
    expectClose(got, exact, "serve k=10");
    // k beyond ntotal is cut to it: every row comes back, each once
    const all = (await serve.ok("search", { k: 5000, vectors: vectors.slice(0, 2) })) as {
      ids: number[][];
    };
    expect(all.ids.map((row) => new Set(row).size)).toEqual([1000, 1000]);
    expect(await serve.close()).toBe(0);
  });
});
