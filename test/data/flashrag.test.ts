import { mkdirSync, statSync } from "node:fs";
import path from "node:path";
import { gzipSync } from "node:zlib";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  locateSources,
  openRecords,
  type RawRecord,
  recordLocation,
  type SourceFile,
} from "../../src/data/flashrag.js";
import { InputError } from "../../src/runtime/errors.js";
import { jsonl, put, putGzip, putQaParquet, tempDir } from "./helpers.js";

async function readAll(file: SourceFile, columns?: string[]): Promise<RawRecord[]> {
  const out: RawRecord[] = [];
  for await (const r of await openRecords(file, columns)) out.push(r);
  return out;
}

describe("locating FlashRAG splits", () => {
  let tmp: ReturnType<typeof tempDir>;
  beforeEach(() => {
    tmp = tempDir();
  });
  afterEach(() => tmp.cleanup());

  it("prefers jsonl, then jsonl.gz, then parquet, and falls back test → dev → train", () => {
    const a = path.join(tmp.dir, "a");
    put(path.join(a, "train.jsonl"), "");
    put(path.join(a, "train.jsonl.gz"), "");
    put(path.join(a, "train.parquet"), "");
    put(path.join(a, "dev.parquet"), "");
    put(path.join(a, "dev.jsonl.gz"), "");
    const b = path.join(tmp.dir, "b");
    put(path.join(b, "train.parquet"), "");
    put(path.join(b, "test.jsonl"), "");
    put(path.join(b, "dev.jsonl"), "");

    const [train, test] = locateSources(tmp.dir, ["a", "b"], ["train", "test"]);
    expect(train?.sources.map((s) => [s.dataset, s.split, s.format, s.path])).toEqual([
      ["a", "train", "jsonl", path.join(a, "train.jsonl")],
      ["b", "train", "parquet", path.join(b, "train.parquet")],
    ]);
    expect(test?.sources.map((s) => [s.dataset, s.split, s.format])).toEqual([
      ["a", "dev", "jsonl.gz"],
      ["b", "test", "jsonl"],
    ]);
  });

  it("uses train for the test file when a dataset has neither test nor dev", () => {
    put(path.join(tmp.dir, "only-train", "train.jsonl.gz"), "");
    const [test] = locateSources(tmp.dir, ["only-train"], ["test"]);
    expect(test?.sources[0]?.split).toBe("train");
  });

  it("leaves a dataset without train out of train, and reports what it looked for", () => {
    put(path.join(tmp.dir, "nq", "train.jsonl"), "");
    put(path.join(tmp.dir, "bamboogle", "test.jsonl"), "");
    const [train] = locateSources(tmp.dir, ["nq", "bamboogle"], ["train"]);
    expect(train?.sources.map((s) => s.dataset)).toEqual(["nq"]);
    expect(train?.missing).toEqual([
      { dataset: "bamboogle", lookedFor: ["train.jsonl", "train.jsonl.gz", "train.parquet"] },
    ]);
  });

  it("fails when no dataset has a train split", () => {
    put(path.join(tmp.dir, "bamboogle", "test.jsonl"), "");
    expect(() => locateSources(tmp.dir, ["bamboogle"], ["train", "test"])).toThrow(
      `no dataset has a train split; looked for train.jsonl, train.jsonl.gz, train.parquet in ${path.join(tmp.dir, "bamboogle")}`,
    );
  });

  it("gives an optional split no dataset has an empty plan saying why, instead of failing", () => {
    put(path.join(tmp.dir, "bamboogle", "test.jsonl"), "");
    const [train, test] = locateSources(tmp.dir, ["bamboogle"], ["train", "test"], ["train"]);
    expect(train?.sources).toEqual([]);
    expect(train?.skipped).toBe(
      `no dataset has a train split; looked for train.jsonl, train.jsonl.gz, train.parquet in ${path.join(tmp.dir, "bamboogle")}`,
    );
    expect(test?.skipped).toBeUndefined();
    expect(test?.sources.map((s) => s.dataset)).toEqual(["bamboogle"]);
  });

  it("fails on a test split that does not exist, naming the folder and the files", () => {
    const dir = path.join(tmp.dir, "empty");
    mkdirSync(dir);
    expect(() => locateSources(tmp.dir, ["empty"], ["test"])).toThrow(
      `dataset folder ${dir} has no test split; looked for test.jsonl, test.jsonl.gz, test.parquet, dev.jsonl, dev.jsonl.gz, dev.parquet, train.jsonl, train.jsonl.gz, train.parquet`,
    );
  });

  it("names a missing input folder, a missing dataset folder and a repeated dataset", () => {
    const input = path.join(tmp.dir, "missing");
    expect(() => locateSources(input, ["nq"], ["train"])).toThrow(InputError);
    expect(() => locateSources(input, ["nq"], ["train"])).toThrow(`input folder ${input} `);
    put(path.join(tmp.dir, "nq", "train.jsonl"), "");
    expect(() => locateSources(tmp.dir, ["nq", "hotpotqa"], ["train"])).toThrow(
      `dataset folder ${path.join(tmp.dir, "hotpotqa")} does not exist`,
    );
    expect(() => locateSources(tmp.dir, ["nq", "nq"], ["train"])).toThrow("nq is listed twice");
  });
});

describe("streaming records", () => {
  let tmp: ReturnType<typeof tempDir>;
  beforeEach(() => {
    tmp = tempDir();
  });
  afterEach(() => tmp.cleanup());

  const source = (file: string, format: SourceFile["format"]): SourceFile => ({
    dataset: "d",
    split: "train",
    path: file,
    format,
  });

  it("reads jsonl with 1-based lines, skipping blank lines, a BOM and CRLF endings", async () => {
    const file = put(
      path.join(tmp.dir, "train.jsonl"),
      '\uFEFF{"q":1}\r\n\r\n   \n{"q":"é"}\r\n[1]\n{"q":3}',
    );
    const stream = await openRecords(source(file, "jsonl"));
    expect([stream.total, stream.unit]).toEqual([statSync(file).size, "B"]);
    const records: RawRecord[] = [];
    for await (const r of stream) records.push(r);
    expect(records).toEqual([
      { value: { q: 1 }, line: 1, index: 0 },
      { value: { q: "é" }, line: 4, index: 1 },
      { value: [1], line: 5, index: 2 },
      { value: { q: 3 }, line: 6, index: 3 },
    ]);
    expect(stream.done()).toBe(statSync(file).size);
  });

  it("streams a 200,000-row jsonl file", async () => {
    const lines: string[] = [];
    for (let i = 0; i < 200_000; i++) {
      lines.push(`{"question":"q${i}","golden_answers":["${i}"]}\n`);
    }
    const file = put(path.join(tmp.dir, "train.jsonl"), lines.join(""));
    const stream = await openRecords(source(file, "jsonl"));
    let count = 0;
    let last: RawRecord | undefined;
    for await (const r of stream) {
      count++;
      last = r;
    }
    expect(count).toBe(200_000);
    expect(last).toEqual({
      value: { question: "q199999", golden_answers: ["199999"] },
      line: 200_000,
      index: 199_999,
    });
    expect(stream.done()).toBe(stream.total);
  });

  it("reads jsonl.gz and measures progress in compressed bytes", async () => {
    const file = putGzip(path.join(tmp.dir, "train.jsonl.gz"), jsonl([{ a: 1 }, { a: 2 }]));
    const stream = await openRecords(source(file, "jsonl.gz"));
    const records: RawRecord[] = [];
    for await (const r of stream) records.push(r);
    expect(records.map((r) => r.value)).toEqual([{ a: 1 }, { a: 2 }]);
    expect(stream.total).toBe(statSync(file).size);
    expect(stream.done()).toBe(stream.total);
  });

  it("reports malformed JSON with file:line", async () => {
    const file = put(path.join(tmp.dir, "train.jsonl"), '{"a":1}\n\n{"a": oops}\n');
    await expect(readAll(source(file, "jsonl"))).rejects.toThrow(
      new RegExp(`^${escapeRegExp(file)}:3: malformed JSON \\(.+\\)$`),
    );
  });

  it("reports corrupt gzip data as an input error naming the file", async () => {
    const gz = gzipSync(Buffer.from(jsonl([{ a: 1 }]).repeat(1000)));
    const file = put(path.join(tmp.dir, "train.jsonl.gz"), gz.subarray(0, gz.length - 40));
    const error = await readAll(source(file, "jsonl.gz")).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InputError);
    expect((error as Error).message).toMatch(`${file}: cannot read gzip data`);
  });

  it("reads parquet row group by row group, only the requested columns that exist", async () => {
    const rows = Array.from({ length: 7 }, (_, i) => ({
      id: `r${i}`,
      question: `q${i}`,
      golden_answers: [`a${i}`, `b${i}`],
    }));
    const file = putQaParquet(path.join(tmp.dir, "dev.parquet"), rows, 3);
    const stream = await openRecords(source(file, "parquet"), ["question", "golden_answers", "x"]);
    expect([stream.total, stream.unit]).toEqual([7, "rows"]);
    const records: RawRecord[] = [];
    for await (const r of stream) records.push(r);
    expect(records).toEqual(
      rows.map((r, i) => ({
        value: { question: r.question, golden_answers: r.golden_answers },
        line: i + 1,
        index: i,
      })),
    );
    expect(stream.done()).toBe(7);
    expect(recordLocation(source(file, "parquet"), 3)).toBe(`${file}:row 3`);
  });

  it("reports a file that is not parquet", async () => {
    const file = put(path.join(tmp.dir, "dev.parquet"), "not parquet at all");
    await expect(readAll(source(file, "parquet"))).rejects.toThrow(
      `${file}: not a readable parquet file`,
    );
  });
});

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
