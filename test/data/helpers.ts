import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { gzipSync } from "node:zlib";
import { DuckDBInstance } from "@duckdb/node-api";
import type { SchemaElement } from "hyparquet";
import { parquetWriteFile } from "hyparquet-writer";
import type { PreprocessConfig } from "../../src/config/schemas/preprocess.js";
import type { Progress } from "../../src/runtime/progress.js";

export function tempDir(): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-data-"));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Writes a file, creating its folder. */
export function put(file: string, content: string | Buffer): string {
  mkdirSync(path.dirname(file), { recursive: true });
  writeFileSync(file, content);
  return file;
}

export function jsonl(records: unknown[]): string {
  return records.map((r) => `${JSON.stringify(r)}\n`).join("");
}

export function putGzip(file: string, content: string): string {
  return put(file, gzipSync(Buffer.from(content, "utf8")));
}

export interface QaRow {
  id: string;
  question: string;
  golden_answers: string[];
}

/** A FlashRAG-style parquet file with a real list<string> golden_answers column. */
export function putQaParquet(file: string, rows: QaRow[], rowGroupSize?: number): string {
  mkdirSync(path.dirname(file), { recursive: true });
  const str = (name: string): SchemaElement => ({
    name,
    type: "BYTE_ARRAY",
    converted_type: "UTF8",
    repetition_type: "OPTIONAL",
  });
  parquetWriteFile({
    filename: file,
    columnData: [
      { name: "id", data: rows.map((r) => r.id) },
      { name: "question", data: rows.map((r) => r.question) },
      { name: "golden_answers", data: rows.map((r) => r.golden_answers) },
    ],
    schema: [
      { name: "root", num_children: 3 },
      str("id"),
      str("question"),
      {
        name: "golden_answers",
        repetition_type: "OPTIONAL",
        converted_type: "LIST",
        num_children: 1,
      },
      { name: "list", repetition_type: "REPEATED", num_children: 1 },
      str("element"),
    ],
    rowGroupSize,
  });
  return file;
}

export interface RecordingProgress extends Progress {
  logs: string[];
  tasks: { label: string; total: number | undefined; unit: string; done: number }[];
}

export function recordingProgress(onUpdate?: (done: number) => void): RecordingProgress {
  const logs: string[] = [];
  const tasks: RecordingProgress["tasks"] = [];
  return {
    logs,
    tasks,
    task(label, total, unit) {
      const t = { label, total, unit, done: 0 };
      tasks.push(t);
      return {
        update(done) {
          t.done = done;
          onUpdate?.(done);
        },
        finish() {},
      };
    },
    log(message) {
      logs.push(message);
    },
  };
}

export function config(overrides: Partial<PreprocessConfig> & { input: string; out: string }) {
  return {
    datasets: ["nq"],
    splits: ["train", "test"],
    format: "search-r1",
    template: null,
    strict: false,
    overwrite: false,
    quiet: true,
    ...overrides,
  } satisfies PreprocessConfig;
}

/** Reads parquet with DuckDB, a different implementation from the writer under test. */
export async function duckdb(sql: string): Promise<Record<string, unknown>[]> {
  const instance = await DuckDBInstance.create(":memory:");
  const connection = await instance.connect();
  try {
    return (await connection.runAndReadAll(sql)).getRowObjectsJson();
  } finally {
    connection.closeSync();
    instance.closeSync();
  }
}

export function readParquet(file: string): Promise<Record<string, unknown>[]> {
  return duckdb(`select * from read_parquet('${file}')`);
}

export async function describeParquet(file: string): Promise<[string, string][]> {
  const rows = await duckdb(`describe select * from read_parquet('${file}')`);
  return rows.map((r) => [String(r.column_name), String(r.column_type)]);
}
