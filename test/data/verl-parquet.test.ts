import { existsSync, readdirSync } from "node:fs";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { SEARCH_R1_ROWS, type SearchR1Row } from "../../src/data/search-r1-rows.js";
import { VerlParquetWriter } from "../../src/data/verl-parquet.js";
import { duckdb, readParquet, tempDir } from "./helpers.js";

function row(i: number): SearchR1Row {
  const answers = i % 2 ? ["ans", `ans ${i}`] : [`only ${i}`];
  return {
    id: i % 3 ? `id-${i}` : null,
    question: `question ${i} «ü»`,
    golden_answers: answers,
    data_source: "src",
    prompt: [{ role: "user", content: `prompt ${i}\n` }],
    ability: "fact-reasoning",
    reward_model: { style: "rule", ground_truth: { target: answers } },
    extra_info: { split: "train", index: i, uid: `src-train-${i}` },
  };
}

describe("VerlParquetWriter", () => {
  let tmp: ReturnType<typeof tempDir>;
  beforeEach(() => {
    tmp = tempDir();
  });
  afterEach(() => tmp.cleanup());

  it("writes row groups of the given size to a hidden temporary file, then renames it", async () => {
    const file = path.join(tmp.dir, "train.parquet");
    const writer = new VerlParquetWriter(file, SEARCH_R1_ROWS, 4);
    expect(writer.tempPath).toBe(path.join(tmp.dir, `.train.parquet.tmp-${process.pid}`));
    for (let i = 0; i < 10; i++) writer.append(row(i));
    writer.finish();
    expect(readdirSync(tmp.dir)).toEqual([`.train.parquet.tmp-${process.pid}`]);
    await writer.commit();
    expect(readdirSync(tmp.dir)).toEqual(["train.parquet"]);

    const rows = await readParquet(file);
    expect(rows).toEqual(
      Array.from({ length: 10 }, (_, i) => {
        const r = row(i);
        return { ...r, extra_info: { ...r.extra_info, index: String(i) } };
      }),
    );
    const groups = await duckdb(
      `select row_group_id, any_value(row_group_num_rows) as n from parquet_metadata('${file}')
       group by row_group_id order by row_group_id`,
    );
    expect(groups.map((g) => g.n)).toEqual(["4", "4", "2"]);
  });

  it("writes a valid empty file when no row passes", async () => {
    const file = path.join(tmp.dir, "test.parquet");
    const writer = new VerlParquetWriter(file, SEARCH_R1_ROWS);
    writer.finish();
    await writer.commit();
    expect(await readParquet(file)).toEqual([]);
  });

  it("deletes the temporary file on abort and leaves no final file", async () => {
    const file = path.join(tmp.dir, "train.parquet");
    const writer = new VerlParquetWriter(file, SEARCH_R1_ROWS, 2);
    for (let i = 0; i < 5; i++) writer.append(row(i));
    await writer.abort();
    expect(readdirSync(tmp.dir)).toEqual([]);
    expect(existsSync(file)).toBe(false);
  });
});
