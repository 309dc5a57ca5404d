import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { afterAll, describe, expect, it } from "vitest";
import { readMeta } from "../../src/retrieval/bm25/format.js";
import { openCorpusStore } from "../../src/retrieval/corpus-store.js";
import { runCli, startCli } from "../helpers/cli.js";
import { generateCorpus } from "./generated-corpus.js";

const made: string[] = [];
const tmp = () => {
  const dir = mkdtempSync(join(tmpdir(), "searchr1-build-index-"));
  made.push(dir);
  return dir;
};
afterAll(() => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});
const build = (corpus: string, out: string, ...extra: string[]) =>
  runCli(["build-index", "--corpus", corpus, "--out", out, "--quiet", ...extra]);

describe("searchr1 build-index --retriever bm25", () => {
  const lines = generateCorpus(600, 7);

  it("indexes a corpus and reads every row back by row number", async () => {
    const dir = tmp();
    const corpus = join(dir, "wiki.jsonl");
    writeFileSync(corpus, `${lines.join("\n")}\n`);
    const r = build(corpus, join(dir, "idx"));
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(
      /600 passages, [\d,]+ terms, [\d,]+ postings in [\d.]+ s \([\d,]+ passages\/s\)/,
    );
    const meta = await readMeta(join(dir, "idx"));
    expect(meta.corpus).toMatchObject({ path: corpus, kind: "jsonl", rows: 600 });
    expect(meta.analyzer).toMatchObject({ tokenizer: "uax29", stemmer: "porter" });
    expect(readdirSync(dir).sort()).toEqual(["idx", "wiki.jsonl"]);
    const store = await openCorpusStore(join(dir, "idx"), corpus, meta.corpus);
    const rows = [0, 1, 7, 599, 300, 0];
    expect(await store.read(rows)).toEqual(rows.map((i) => lines[i]));
    await expect(store.read([600])).rejects.toThrow(/row 600 outside the corpus/);
    await store.close();
  });

  it("reads jsonl.gz (rows stored in deflated blocks) into the same index", async () => {
    const dir = tmp();
    writeFileSync(join(dir, "c.jsonl"), `${lines.join("\n")}\n`);
    writeFileSync(join(dir, "c.jsonl.gz"), gzipSync(`${lines.join("\n")}\n`));
    expect(build(join(dir, "c.jsonl"), join(dir, "plain")).code).toBe(0);
    expect(build(join(dir, "c.jsonl.gz"), join(dir, "gz")).code).toBe(0);
    for (const f of ["terms.bin", "terms.tab", "postings.bin", "norms.bin"]) {
      expect(readFileSync(join(dir, "gz", f)).equals(readFileSync(join(dir, "plain", f))), f).toBe(
        true,
      );
    }
    const meta = await readMeta(join(dir, "gz"));
    expect(meta.corpus.kind).toBe("jsonl.gz");
    const store = await openCorpusStore(join(dir, "gz"), join(dir, "c.jsonl.gz"), meta.corpus);
    const rows = [599, 0, 63, 64, 65, 128, 300];
    expect(await store.read(rows)).toEqual(rows.map((i) => lines[i]));
    await store.close();
  });

  it("skips blank lines (they are not rows) and reads CRLF files", async () => {
    const dir = tmp();
    const corpus = join(dir, "c.jsonl");
    const some = lines.slice(0, 5);
    writeFileSync(corpus, `\n${some[0]}\r\n\r\n  \n${some.slice(1).join("\r\n")}`);
    expect(build(corpus, join(dir, "idx")).code).toBe(0);
    const meta = await readMeta(join(dir, "idx"));
    expect(meta.counts.documents).toBe(5);
    const store = await openCorpusStore(join(dir, "idx"), corpus, meta.corpus);
    expect(await store.read([0, 1, 2, 3, 4])).toEqual(some);
    await store.close();
  });

  it("refuses a corpus other than the one indexed", async () => {
    const dir = tmp();
    writeFileSync(join(dir, "a.jsonl"), `${lines.join("\n")}\n`);
    writeFileSync(join(dir, "b.jsonl"), `${lines.slice(1).join("\n")}\n${lines[0]}\n`);
    expect(build(join(dir, "a.jsonl"), join(dir, "idx")).code).toBe(0);
    const meta = await readMeta(join(dir, "idx"));
    await expect(
      openCorpusStore(join(dir, "idx"), join(dir, "b.jsonl"), meta.corpus),
    ).rejects.toThrow(
      /b\.jsonl is not the corpus the index in .*idx was built from .*different content/,
    );
  });

  it("refuses a copy changed after its first MiB (same size, same head)", async () => {
    const dir = tmp();
    const big = generateCorpus(8000, 5);
    writeFileSync(join(dir, "a.jsonl"), `${big.join("\n")}\n`);
    const last = big[big.length - 1] as string;
    const edited = last.replace(/"id":"7999"/, '"id":"7990"');
    expect(edited.length).toBe(last.length);
    writeFileSync(join(dir, "b.jsonl"), `${[...big.slice(0, -1), edited].join("\n")}\n`);
    expect(readFileSync(join(dir, "b.jsonl")).length).toBeGreaterThan(2 << 20);
    expect(build(join(dir, "a.jsonl"), join(dir, "idx")).code).toBe(0);
    const meta = await readMeta(join(dir, "idx"));
    await expect(
      openCorpusStore(join(dir, "idx"), join(dir, "b.jsonl"), meta.corpus),
    ).rejects.toThrow(/b\.jsonl is not the corpus .*different content/);
  });

  it("names the file and line of a bad row and leaves nothing behind", () => {
    const dir = tmp();
    const corpus = join(dir, "c.jsonl");
    writeFileSync(
      corpus,
      `${lines.slice(0, 400).join("\n")}\n\n{"id": "x", "contents": \n${lines[401]}\n`,
    );
    const r = build(corpus, join(dir, "idx"), "--memory-mb", "0.05");
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`${corpus}:402: not valid JSON`);
    expect(readdirSync(dir)).toEqual(["c.jsonl"]);

    writeFileSync(corpus, `${lines[0]}\n{"id": "1", "text": "no contents"}\n`);
    const r2 = build(corpus, join(dir, "idx"));
    expect(r2.code).toBe(1);
    expect(r2.stderr).toContain(`${corpus}:2: expected an object with a string "contents" field`);
    expect(readdirSync(dir)).toEqual(["c.jsonl"]);
  });

  it("reports a missing corpus, a broken gzip, an existing output and an unsupported kind", () => {
    const dir = tmp();
    const missing = build(join(dir, "nope.jsonl"), join(dir, "idx"));
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain(`${join(dir, "nope.jsonl")}: no such corpus file`);

    writeFileSync(join(dir, "empty.jsonl"), "\n  \n");
    const empty = build(join(dir, "empty.jsonl"), join(dir, "idx"));
    expect(empty.code).toBe(1);
    expect(empty.stderr).toContain("empty.jsonl: no rows");
    expect(existsSync(join(dir, "idx"))).toBe(false);

    writeFileSync(join(dir, "bad.jsonl.gz"), "this is not gzip");
    const gz = build(join(dir, "bad.jsonl.gz"), join(dir, "idx"));
    expect(gz.code).toBe(1);
    expect(gz.stderr).toContain("bad.jsonl.gz: not a valid gzip file");
    expect(existsSync(join(dir, "idx"))).toBe(false);

    writeFileSync(join(dir, "c.jsonl"), `${lines[0]}\n`);
    mkdirSync(join(dir, "taken"));
    writeFileSync(join(dir, "taken", "meta.json"), "{}");
    const taken = build(join(dir, "c.jsonl"), join(dir, "taken"));
    expect(taken.code).toBe(2);
    expect(taken.stderr).toContain(
      `${join(dir, "taken")}: already exists; pass --overwrite to replace it`,
    );

    const e5 = build(join(dir, "c.jsonl"), join(dir, "e5"), "--retriever", "e5");
    expect(e5.code).toBe(2);
    expect(e5.stderr).toContain("--retriever e5 needs the encoder: set --retriever-model");

    const k1 = build(join(dir, "c.jsonl"), join(dir, "k"), "--b", "2");
    expect(k1.code).toBe(2);
    expect(k1.stderr).toContain("bm25.b");

    // The dense options are refused where they would do nothing.
    const sq = build(join(dir, "c.jsonl"), join(dir, "s"), "--faiss-type", "SQ8");
    expect(sq.code).toBe(2);
    expect(sq.stderr).toContain("--retriever bm25 has none");
    const ef = build(
      join(dir, "c.jsonl"),
      join(dir, "s"),
      ...["--retriever", "e5", "--retriever-model", dir, "--faiss-type", "SQ8"],
      ...["--ef-construction", "40"],
    );
    expect(ef.code).toBe(2);
    expect(ef.stderr).toContain(
      "--ef-construction builds an HNSW graph: --faiss-type SQ8 has none",
    );
    expect(existsSync(join(dir, "s"))).toBe(false);
  });

  it("--overwrite replaces an index only once the new one is complete", async () => {
    const dir = tmp();
    writeFileSync(join(dir, "a.jsonl"), `${lines.slice(0, 10).join("\n")}\n`);
    writeFileSync(join(dir, "b.jsonl"), `${lines.slice(0, 20).join("\n")}\n`);
    expect(build(join(dir, "a.jsonl"), join(dir, "idx")).code).toBe(0);
    expect(build(join(dir, "b.jsonl"), join(dir, "idx"), "--overwrite", "--k1", "1.2").code).toBe(
      0,
    );
    const meta = await readMeta(join(dir, "idx"));
    expect(meta.counts.documents).toBe(20);
    expect(meta.bm25.k1).toBe(1.2);
    expect(readdirSync(dir).sort()).toEqual(["a.jsonl", "b.jsonl", "idx"]);
  });

  it("Ctrl-C stops the build, exits 130 and removes the partial index", async () => {
    const dir = tmp();
    const corpus = join(dir, "big.jsonl");
    writeFileSync(corpus, `${generateCorpus(150_000, 3).join("\n")}\n`);
    const cli = startCli(["build-index", "--corpus", corpus, "--out", join(dir, "idx"), "--quiet"]);
    while (!readdirSync(dir).some((f) => f.startsWith("idx.partial-"))) {
      await new Promise((r) => setTimeout(r, 10));
    }
    cli.child.kill("SIGINT");
    const r = await cli.result;
    expect(r.code).toBe(130);
    expect(r.stderr).toContain("interrupted; nothing was written");
    expect(readdirSync(dir)).toEqual(["big.jsonl"]);
  }, 30_000);
});
