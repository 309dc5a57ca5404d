/**
 * Benchmark: `searchr1 preprocess` against DuckDB doing the same conversion in SQL
 * (read_json → Search-R1 rows → parquet), on the same synthetic FlashRAG-layout input.
 * Usage: npm run bench:preprocess [-- ROWS]   (default 500,000 train rows + 50,000 test rows)
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DuckDBInstance } from "@duckdb/node-api";
import { packageRoot } from "../src/runtime/package-root.js";

const rows = Number(process.argv[2] ?? 500_000);
const testRows = Math.max(1, Math.floor(rows / 10));
const work = mkdtempSync(join(tmpdir(), "searchr1-bench-"));

function writeSplit(file: string, n: number) {
  const words = [
    "who",
    "wrote",
    "the",
    "novel",
    "when",
    "did",
    "river",
    "capital",
    "of",
    "Ørsted",
    "Müller",
  ];
  const lines: string[] = [];
  for (let i = 0; i < n; i++) {
    const q = Array.from(
      { length: 8 + (i % 9) },
      (_, j) => words[(i * 7 + j * 3) % words.length],
    ).join(" ");
    lines.push(
      JSON.stringify({
        id: `q${i}`,
        question: ` ${q}${i % 2 ? "?" : ""} `,
        golden_answers: [`answer ${i}`, `alt ${i % 13}`],
      }),
    );
  }
  writeFileSync(file, `${lines.join("\n")}\n`);
}

function seconds(fn: () => void): number {
  const t = process.hrtime.bigint();
  fn();
  return Number(process.hrtime.bigint() - t) / 1e9;
}

async function duckdb(input: string, out: string, template: string): Promise<number> {
  const db = await DuckDBInstance.create(":memory:");
  const con = await db.connect();
  const t = process.hrtime.bigint();
  for (const [split, file] of [
    ["train", "train.jsonl"],
    ["test", "test.jsonl"],
  ] as const) {
    const q = "trim(question)";
    await con.run(
      `COPY (
      SELECT id, question, golden_answers, 'nq' AS data_source,
        [{'role': 'user', 'content': replace($tmpl, '{question}', CASE WHEN right(${q}, 1) = '?' THEN ${q} ELSE ${q} || '?' END)}] AS prompt,
        'fact-reasoning' AS ability,
        {'style': 'rule', 'ground_truth': {'target': golden_answers}} AS reward_model,
        {'split': '${split}', 'index': (row_number() OVER () - 1)::BIGINT, 'uid': 'nq-${split}-' || (row_number() OVER () - 1)} AS extra_info
      FROM read_json('${join(input, "nq", file)}', format = 'newline_delimited',
        columns = {id: 'VARCHAR', question: 'VARCHAR', golden_answers: 'VARCHAR[]'})
    ) TO '${join(out, `${split}.parquet`)}' (FORMAT parquet)`,
      { tmpl: template },
    );
  }
  return Number(process.hrtime.bigint() - t) / 1e9;
}

async function main() {
  const input = join(work, "in");
  mkdirSync(join(input, "nq"), { recursive: true });
  writeSplit(join(input, "nq", "train.jsonl"), rows);
  writeSplit(join(input, "nq", "test.jsonl"), testRows);
  const total = rows + testRows;
  const bytes =
    statSync(join(input, "nq", "train.jsonl")).size +
    statSync(join(input, "nq", "test.jsonl")).size;

  const ours = join(work, "ours");
  const bin = join(packageRoot(), "bin", "searchr1");
  const oursS = seconds(() => {
    const r = spawnSync(
      process.execPath,
      [bin, "preprocess", "nq", "--input", input, "--out", ours, "--quiet"],
      { encoding: "utf8" },
    );
    if (r.status !== 0) throw new Error(`searchr1 preprocess failed: ${r.stderr}`);
  });
  const theirs = join(work, "duckdb");
  mkdirSync(theirs);
  const template = readFileSync(join(packageRoot(), "templates", "search-r1.txt"), "utf8");
  const duckS = await duckdb(input, theirs, template);

  const rate = (s: number) => `${Math.round(total / s).toLocaleString("en-US")} rows/s`;
  console.log(
    `preprocess: ${total.toLocaleString("en-US")} rows, ${(bytes / 2 ** 20).toFixed(1)} MiB of jsonl`,
  );
  console.log("| tool | seconds | throughput |");
  console.log("|---|---|---|");
  console.log(
    `| searchr1 preprocess (1 thread, streaming) | ${oursS.toFixed(2)} | ${rate(oursS)} |`,
  );
  console.log(`| DuckDB SQL COPY (all cores) | ${duckS.toFixed(2)} | ${rate(duckS)} |`);
  console.log(`ratio (DuckDB time / searchr1 time): ${(duckS / oursS).toFixed(2)}`);
  rmSync(work, { recursive: true, force: true });
}

await main();
