// The native faiss index reader, searcher and writer (native/src/index/, searchr1-index)
// against faiss itself: the fixtures are faiss-written files and faiss's own search results
// (test/retrieval/make_faiss_fixtures.py, committed: CI has no Python).
import {
  copyFileSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  truncateSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import {
  readSafetensors,
  readSafetensorsHeader,
  type Tensor,
  writeSafetensors,
} from "../../src/tensors/safetensors.js";
import { type Run, runIndex } from "./index-tool.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/faiss/", import.meta.url));
const fixture = (name: string): string => join(FIXTURES, name);
const tmp = mkdtempSync(join(tmpdir(), "sr1-faiss-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const index = runIndex;

function ok(args: string[]): Run {
  const r = index(args);
  if (r.code !== 0)
    throw new Error(`searchr1-index ${args.join(" ")} exited ${r.code}: ${r.stderr}`);
  return r;
}

let outputs = 0;
/** Runs `search` and returns its ids and scores. */
async function search(
  file: string,
  queries: string,
  k: number,
  extra: string[] = [],
): Promise<{ ids: BigInt64Array; scores: Float32Array }> {
  const out = join(tmp, `out-${outputs++}.safetensors`);
  ok(["search", "--index", file, "--queries", queries, "--k", String(k), "--out", out, ...extra]);
  const t = await readSafetensors(out);
  return {
    ids: (t.get("ids") as Tensor).data as BigInt64Array,
    scores: (t.get("scores") as Tensor).data as Float32Array,
  };
}

async function expected(name: string) {
  const path = fixture(`${name}.expected.safetensors`);
  const tensors = await readSafetensors(path);
  const meta = (await readSafetensorsHeader(path)).metadata;
  const get = (key: string): Tensor => {
    const t = tensors.get(key);
    if (!t) throw new Error(`${path}: no ${key}`);
    return t;
  };
  return {
    path,
    meta,
    ids: (key: string) => get(`${key}.ids`).data as BigInt64Array,
    scores: (key: string) => get(`${key}.scores`).data as Float32Array,
    list: (field: string) => (meta[field] ?? "").split(",").map(Number),
  };
}

/** Largest |a - b| where faiss found a result (id >= 0); the empty places must match exactly. */
function scoreDiff(ids: BigInt64Array, a: Float32Array, b: Float32Array): number {
  let worst = 0;
  for (let i = 0; i < a.length; i++) {
    if (ids[i] === -1n) {
      if (a[i] !== b[i]) return Number.POSITIVE_INFINITY;
    } else {
      worst = Math.max(worst, Math.abs((a[i] as number) - (b[i] as number)));
    }
  }
  return worst;
}

describe("searchr1-index info", () => {
  it("reads faiss's flat and HNSW headers", () => {
    const info = (name: string) => JSON.parse(ok(["info", "--index", fixture(name)]).stdout);
    expect(info("flat-ip.index")).toMatchObject({
      type: "IndexFlatIP",
      fourcc: "IxFI",
      metric: "inner_product",
      d: 64,
      ntotal: 1200,
      bytes: 45 + 1200 * 64 * 4,
      vectors_offset: 45,
    });
    expect(info("flat-l2.index")).toMatchObject({
      type: "IndexFlatL2",
      metric: "l2",
      d: 32,
      ntotal: 1000,
    });
    expect(info("hnsw-ip.index")).toMatchObject({
      type: "IndexHNSWFlat",
      fourcc: "IHNf",
      metric: "inner_product",
      d: 32,
      ntotal: 1500,
      hnsw: { M: 16, level0_slots: 32, ef_construction: 40, ef_search: 24 },
    });
    expect(info("hnsw-l2.index")).toMatchObject({ metric: "l2", hnsw: { M: 8, ef_search: 24 } });
  });
});

describe("flat search equals faiss's", () => {
  for (const name of ["flat-ip", "flat-l2", "small-ip"]) {
    it(`${name}: identical ids, scores within 1e-5, for every k`, async () => {
      const e = await expected(name);
      for (const k of e.list("k")) {
        const r = await search(fixture(`${name}.index`), e.path, k);
        expect(r.ids, `k=${k}`).toEqual(e.ids(`k${k}`));
        expect(scoreDiff(e.ids(`k${k}`), r.scores, e.scores(`k${k}`)), `k=${k}`).toBeLessThan(1e-5);
      }
    });
  }

  it("fills the places beyond ntotal with id -1 and the worst score, as faiss does", async () => {
    const r = await search(
      fixture("small-ip.index"),
      fixture("small-ip.expected.safetensors"),
      120,
    );
    expect(r.ids[100]).toBe(-1n);
    expect(r.scores[119]).toBe(-3.4028234663852886e38);
  });

  it("orders bitwise-equal scores as faiss does (duplicated rows 7 and 1100: higher id first)", async () => {
    const r = await search(fixture("flat-ip.index"), fixture("flat-ip.expected.safetensors"), 2);
    expect([...r.ids.slice(0, 2)]).toEqual([1100n, 7n]);
    expect(r.scores[0]).toBe(r.scores[1]);
  });

  it("searches an HNSW file's vectors exhaustively with --exact", async () => {
    const r = await search(fixture("hnsw-ip.index"), fixture("hnsw-ip.expected.safetensors"), 1, [
      "--exact",
    ]);
    // queries 0 and 1 are database rows 7 and 750: each is its own nearest neighbour
    expect([...r.ids.slice(0, 2)]).toEqual([7n, 750n]);
  });
});

describe("HNSW search equals faiss's", () => {
  for (const name of ["hnsw-ip", "hnsw-l2"]) {
    it(`${name}: identical ids for every efSearch and k`, async () => {
      const e = await expected(name);
      for (const ef of e.list("ef")) {
        for (const k of e.list("k")) {
          const key = `ef${ef}.k${k}`;
          const r = await search(fixture(`${name}.index`), e.path, k, ["--ef-search", String(ef)]);
          expect(r.ids, key).toEqual(e.ids(key));
          expect(scoreDiff(e.ids(key), r.scores, e.scores(key)), key).toBeLessThan(1e-5);
        }
      }
    });

    it(`${name}: uses the efSearch stored in the file without --ef-search`, async () => {
      const e = await expected(name);
      const r = await search(fixture(`${name}.index`), e.path, 10);
      expect(r.ids).toEqual(e.ids("file.k10"));
    });
  }
});

describe("searchr1-index write", () => {
  it("writes the bytes faiss.write_index writes for the same vectors", () => {
    const out = join(tmp, "ours.index");
    ok(["write", "--vectors", fixture("small.vectors.safetensors"), "--out", out]);
    expect(readFileSync(out).equals(readFileSync(fixture("small-ip.index")))).toBe(true);
    // an existing output is refused unless --overwrite
    const again = index(["write", "--vectors", fixture("small.vectors.safetensors"), "--out", out]);
    expect(again.code).toBe(2);
    expect(again.stderr).toContain("--overwrite");
    ok(["write", "--vectors", fixture("small.vectors.safetensors"), "--out", out, "--overwrite"]);
  });

  it("was read back by faiss when the fixtures were made (writer-check.json)", () => {
    const check = JSON.parse(readFileSync(fixture("writer-check.json"), "utf8"));
    expect(check).toMatchObject({
      read_index: "IndexFlatIP",
      ntotal: 100,
      d: 64,
      vectors_equal: true,
      search_equal: true,
      bytes_equal_to_faiss_file: true,
    });
  });
});

describe("bad index files get one line naming the file", () => {
  const bad = (name: string, bytes: Buffer): string => {
    const path = join(tmp, name);
    writeFileSync(path, bytes);
    return path;
  };
  const fails = (
    path: string,
    pattern: RegExp,
    queries = fixture("flat-ip.expected.safetensors"),
  ) => {
    const r = index([
      "search",
      "--index",
      path,
      "--queries",
      queries,
      "--k",
      "3",
      "--out",
      join(tmp, "x.safetensors"),
    ]);
    expect(r.code, r.stderr).toBe(1);
    const line = r.stderr.trim();
    expect(line.split("\n")).toHaveLength(1);
    expect(line).toContain(path);
    expect(line).toMatch(pattern);
  };
  const flat = readFileSync(fixture("flat-ip.index"));
  const hnsw = readFileSync(fixture("hnsw-ip.index"));

  it("truncated flat and HNSW files", () => {
    fails(
      bad("cut.index", flat.subarray(0, 100_000)),
      /truncated: 1200 vectors of d = 64 need 307200 bytes/,
    );
    fails(bad("header.index", flat.subarray(0, 30)), /truncated/);
    fails(bad("cut-hnsw.index", hnsw.subarray(0, 50_000)), /truncated: HNSW neighbors/);
    const path = join(tmp, "cut-storage.index");
    copyFileSync(fixture("hnsw-ip.index"), path);
    truncateSync(path, hnsw.length - 10);
    fails(path, /truncated/);
  });

  it("a wrong magic number", () => {
    const b = Buffer.from(flat);
    b.write("IwFl", 0, "latin1");
    fails(bad("magic.index", b), /unsupported faiss index type 'IwFl'/);
    fails(bad("empty.index", Buffer.alloc(0)), /not a faiss index \(0 bytes\)/);
  });

  it("a dimension that disagrees with the data, or with the queries", () => {
    const b = Buffer.from(flat);
    b.writeInt32LE(63, 4);
    fails(
      bad("dim.index", b),
      /ntotal = 1200 vectors of d = 63 \(75600 floats\) but the data holds 76800/,
    );
    b.writeInt32LE(0, 4);
    fails(bad("dim0.index", b), /dimension d = 0 is out of range/);
    const r = index([
      "search",
      "--index",
      fixture("flat-l2.index"),
      "--queries",
      fixture("flat-ip.expected.safetensors"),
      "--out",
      join(tmp, "x.safetensors"),
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toMatch(
      /flat-ip\.expected\.safetensors: queries have d = 64 but .*flat-l2\.index holds vectors of d = 32$/,
    );
  });

  it("bytes after the index, a wrong metric, a neighbour id out of range", () => {
    fails(
      bad("tail.index", Buffer.concat([flat, Buffer.alloc(7)])),
      /7 unexpected bytes after the index/,
    );
    const metric = Buffer.from(flat);
    metric.writeInt32LE(1, 33);
    fails(bad("metric.index", metric), /IxFI \(IndexFlatIP\) must have metric_type 0, not 1/);
    // the entry point's first neighbour on the top level: the descent reads it first
    const g = Buffer.from(hnsw);
    const info = JSON.parse(ok(["info", "--index", fixture("hnsw-ip.index")]).stdout);
    const ep = info.hnsw.entry_point as number;
    let at = 4 + 4 + 8 + 16 + 1 + 4; // fourcc + header
    const skip = (elementSize: number) => {
      const n = Number(g.readBigUInt64LE(at));
      at += 8 + n * elementSize;
      return at - n * elementSize;
    };
    skip(8); // assign_probas
    const cum = skip(4); // cum_nneighbor_per_level
    skip(4); // levels
    const offsets = skip(8);
    const neighbors = skip(4);
    const top = g.readInt32LE(cum + 4 * (info.hnsw.max_level as number));
    const first = neighbors + 4 * (Number(g.readBigUInt64LE(offsets + 8 * ep)) + top);
    g.writeInt32LE(99_999, first);
    const queries = fixture("hnsw-ip.expected.safetensors");
    fails(
      bad("neighbour.index", g),
      /HNSW neighbour 99999 of node \d+ is not a node \(ntotal = 1500\)/,
      queries,
    );
  });
});

describe("queries files", () => {
  it("a query file with the wrong shape is named", async () => {
    const path = join(tmp, "q3.safetensors");
    await writeSafetensors(path, [
      { name: "queries", dtype: "F32", shape: [2, 2, 16], data: new Float32Array(64) },
    ]);
    const r = index([
      "search",
      "--index",
      fixture("flat-ip.index"),
      "--queries",
      path,
      "--out",
      join(tmp, "x.safetensors"),
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`${path}: tensor 'queries' has shape [2, 2, 16]; expected [n, d]`);
  });
});
