// searchr1-index build (native/src/index/faiss_write.h, hnsw_build.h): the faiss index types
// it makes from a flat file, against faiss 1.7.3's own (test/retrieval/make_faiss_build_fixtures.py,
// committed: CI has no Python). The input is flat-ip.index (1200 x 64, inner product).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { readSafetensors, type Tensor, writeSafetensors } from "../../src/tensors/safetensors.js";
import { runCli } from "../helpers/cli.js";
import { type Run, runIndex } from "./index-tool.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/faiss/", import.meta.url));
const fixture = (name: string): string => join(FIXTURES, name);
const FLAT = fixture("flat-ip.index");
const tmp = mkdtempSync(join(tmpdir(), "sr1-faiss-build-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function ok(args: string[]): Run {
  const r = runIndex(args);
  if (r.code !== 0)
    throw new Error(`searchr1-index ${args.join(" ")} exited ${r.code}: ${r.stderr}`);
  return r;
}

let outputs = 0;
/** Our search of `file` with flat-ip's queries: ids, one list of k per query. */
async function searchIds(file: string, k: number, extra: string[] = []): Promise<number[][]> {
  const queries = join(tmp, "queries.safetensors");
  const q = (await readSafetensors(fixture("flat-ip.expected.safetensors"))).get(
    "queries",
  ) as Tensor;
  await writeSafetensors(queries, [{ name: "queries", ...q }]);
  const out = join(tmp, `out-${outputs++}.safetensors`);
  ok(["search", "--index", file, "--queries", queries, "--k", String(k), "--out", out, ...extra]);
  return rows((await readSafetensors(out)).get("ids") as Tensor, k);
}

function rows(t: Tensor, k: number): number[][] {
  const flat = Array.from(t.data as BigInt64Array, Number);
  return Array.from({ length: flat.length / k }, (_, i) => flat.slice(i * k, (i + 1) * k));
}

async function expectedIds(name: string, key: string): Promise<number[][]> {
  return rows(
    (await readSafetensors(fixture(`${name}.expected.safetensors`))).get(key) as Tensor,
    10,
  );
}

function recall(found: number[][], exact: number[][]): number {
  let hit = 0;
  for (let i = 0; i < exact.length; i++) {
    const want = new Set(exact[i]);
    hit += (found[i] as number[]).filter((id) => want.has(id)).length;
  }
  return hit / (exact.length * (exact[0] as number[]).length);
}

function build(
  type: string,
  extra: string[] = [],
): { out: string; report: Record<string, unknown> } {
  const out = join(tmp, `${type.replace(",", "_")}-${outputs++}.index`);
  const r = ok(["build", "--from", FLAT, "--type", type, "--out", out, ...extra]);
  return { out, report: JSON.parse(r.stdout) };
}

describe("searchr1-index build", () => {
  it("HNSW16: an IndexHNSWFlat with the asked parameters whose search finds the exact neighbours", async () => {
    const { out, report } = build("HNSW16", ["--ef-construction", "40", "--ef-search", "24"]);
    expect(report).toMatchObject({ type: "IndexHNSWFlat", factory: "HNSW16", ntotal: 1200 });
    const info = JSON.parse(ok(["info", "--index", out]).stdout);
    expect(info).toMatchObject({
      type: "IndexHNSWFlat",
      fourcc: "IHNf",
      metric: "inner_product",
      d: 64,
    });
    expect(info.hnsw).toMatchObject({
      M: 16,
      level0_slots: 32,
      ef_construction: 40,
      ef_search: 24,
    });
    // faiss's level law for M = 16: the same table as faiss's own file of M = 16 (hnsw-ip).
    const exact = await expectedIds("flat-ip", "k10.ids");
    const r64 = recall(await searchIds(out, 10, ["--ef-search", "64"]), exact);
    // faiss 1.7.3's own graph at the same M and efConstruction: 0.9925 (build-check.json).
    expect(r64).toBeGreaterThanOrEqual(0.98);
    const r16 = recall(await searchIds(out, 10, ["--ef-search", "16"]), exact);
    expect(r16).toBeLessThan(r64); // a narrower beam misses some: the graph is searched
    expect(r16).toBeGreaterThan(0.6);
  });

  it("builds the same graph on one thread every time, and a valid one on several", () => {
    const a = build("HNSW8", ["--threads", "1"]).out;
    const b = build("HNSW8", ["--threads", "1"]).out;
    expect(readFileSync(a).equals(readFileSync(b))).toBe(true);
    const c = build("HNSW8", ["--threads", "2"]).out;
    expect(JSON.parse(ok(["info", "--index", c]).stdout).hnsw.M).toBe(8);
  });

  it("SQ8 and SQfp16: byte for byte the file faiss writes (trained on every vector)", () => {
    for (const [type, name] of [
      ["SQ8", "sq8-ip"],
      ["SQfp16", "sqfp16-ip"],
    ] as const) {
      const { out, report } = build(type);
      expect(report.type).toBe("IndexScalarQuantizer");
      expect(readFileSync(out).equals(readFileSync(fixture(`${name}.index`)))).toBe(true);
    }
  });

  it("reads faiss's SQ8, SQfp16 and HNSW16,SQ8 files and returns faiss's neighbours", async () => {
    for (const name of ["sq8-ip", "sqfp16-ip"]) {
      const info = JSON.parse(ok(["info", "--index", fixture(`${name}.index`)]).stdout);
      expect(info.type).toBe("IndexScalarQuantizer");
      expect(await searchIds(fixture(`${name}.index`), 10)).toEqual(
        await expectedIds(name, "k10.ids"),
      );
    }
    const hnsw = fixture("hnsw-sq8-ip.index");
    expect(JSON.parse(ok(["info", "--index", hnsw]).stdout).type).toBe("IndexHNSWSQ");
    const ours = await searchIds(hnsw, 10, ["--ef-search", "64"]);
    const theirs = await expectedIds("hnsw-sq8-ip", "ef64.k10.ids");
    const same = ours.filter((row, i) => JSON.stringify(row) === JSON.stringify(theirs[i])).length;
    expect(same).toBeGreaterThanOrEqual(ours.length - 1);
  });

  it("HNSW16,SQ8: an IndexHNSWSQ over SQ8 codes, as recall-worthy as faiss's", async () => {
    const { out, report } = build("HNSW16,SQ8", ["--ef-construction", "40"]);
    expect(report.type).toBe("IndexHNSWSQ");
    const exact = await expectedIds("flat-ip", "k10.ids");
    const theirs = recall(await expectedIds("hnsw-sq8-ip", "ef64.k10.ids"), exact);
    const ours = recall(await searchIds(out, 10, ["--ef-search", "64"]), exact);
    expect(Math.abs(ours - theirs)).toBeLessThanOrEqual(0.02);
  });

  it("faiss 1.7.3 read every type we built, and our graphs recall as faiss's (build-check.json)", () => {
    const check = JSON.parse(readFileSync(fixture("build-check.json"), "utf8"));
    expect(check.SQ8.bytes_equal_to_faiss_file).toBe(true);
    expect(check.SQfp16.bytes_equal_to_faiss_file).toBe(true);
    for (const type of ["HNSW16", "HNSW16,SQ8"]) {
      expect(check[type].read_index).toBe(type === "HNSW16" ? "IndexHNSWFlat" : "IndexHNSWSQ");
      for (const ef of ["ef16", "ef64"]) {
        const row = check[type][ef];
        expect(Math.abs(row.recall10_our_graph - row.recall10_faiss_graph)).toBeLessThanOrEqual(
          0.01,
        );
      }
    }
  });

  it("refuses an unknown or unbuilt factory string, naming the option", () => {
    for (const type of ["IVF4096,PQ64", "HNSW", "PQ8", "HNSW1"]) {
      const r = runIndex(["build", "--from", FLAT, "--type", type, "--out", join(tmp, "x.index")]);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(`--type ${type}`);
    }
    const r = runIndex([
      "build",
      "--from",
      FLAT,
      "--type",
      "SQ8",
      "--out",
      join(tmp, "y.index"),
      "--ef-construction",
      "9",
    ]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("--ef-construction applies to HNSW types");
    const cli = runCli([
      "build-index",
      "--retriever",
      "e5",
      "--retriever-model",
      tmp,
      "--corpus",
      FLAT,
      "--out",
      join(tmp, "z.index"),
      "--faiss-type",
      "IVF4096,PQ64",
    ]);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toContain("faiss-type");
  });
});
