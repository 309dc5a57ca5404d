import { rename, rm } from "node:fs/promises";
import path from "node:path";
import type { SchemaElement } from "hyparquet";
import { type ColumnSource, fileWriter, ParquetWriter } from "hyparquet-writer";
import type { VerlRow } from "./search-r1-rows.js";

function string(name: string, repetition: "REQUIRED" | "OPTIONAL" = "REQUIRED"): SchemaElement {
  return {
    name,
    type: "BYTE_ARRAY",
    converted_type: "UTF8",
    logical_type: { type: "STRING" },
    repetition_type: repetition,
  };
}

function struct(name: string, fields: SchemaElement[][]): SchemaElement[] {
  return [{ name, repetition_type: "REQUIRED", num_children: fields.length }, ...fields.flat()];
}

/** The standard 3-level LIST: `<name>` (LIST) → repeated `list` → `element`. */
function list(name: string, element: SchemaElement[]): SchemaElement[] {
  return [
    {
      name,
      repetition_type: "REQUIRED",
      converted_type: "LIST",
      logical_type: { type: "LIST" },
      num_children: 1,
    },
    { name: "list", repetition_type: "REPEATED", num_children: 1 },
    ...element,
  ];
}

const COLUMNS: SchemaElement[][] = [
  [string("id", "OPTIONAL")],
  [string("question")],
  list("golden_answers", [string("element")]),
  [string("data_source")],
  list("prompt", struct("element", [[string("role")], [string("content")]])),
  [string("ability")],
  struct("reward_model", [
    [string("style")],
    struct("ground_truth", [list("target", [string("element")])]),
  ]),
  struct("extra_info", [
    [string("split")],
    [{ name: "index", type: "INT64", repetition_type: "REQUIRED" }],
    [string("uid")],
  ]),
];

/** verl's training schema (Search-R1's columns plus `id`, `question`, `golden_answers`). */
export const VERL_SCHEMA: SchemaElement[] = [
  { name: "root", num_children: COLUMNS.length },
  ...COLUMNS.flat(),
];

const DEFAULT_ROW_GROUP_SIZE = 10_000;

/**
 * Writes rows to `<dir>/.<name>.tmp-<pid>` one row group at a time, so memory holds at most
 * one row group; `commit()` renames the finished file into place, `abort()` deletes it.
 */
export class VerlParquetWriter {
  readonly tempPath: string;
  rows = 0;
  private buffer: VerlRow[] = [];
  private readonly writer: ParquetWriter;

  constructor(
    readonly path: string,
    private readonly rowGroupSize = DEFAULT_ROW_GROUP_SIZE,
  ) {
    this.tempPath = tempPathFor(path);
    this.writer = new ParquetWriter({ writer: fileWriter(this.tempPath), schema: VERL_SCHEMA });
  }

  append(row: VerlRow): void {
    this.buffer.push(row);
    this.rows++;
    if (this.buffer.length >= this.rowGroupSize) this.flush();
  }

  /** Writes the last row group and the footer; the file is still under its temporary name. */
  finish(): void {
    this.flush();
    // fileWriter writes synchronously, so there is no promise to wait for.
    void this.writer.finish();
  }

  async commit(): Promise<void> {
    await rename(this.tempPath, this.path);
  }

  async abort(): Promise<void> {
    await rm(this.tempPath, { force: true });
  }

  private flush(): void {
    if (this.buffer.length === 0) return;
    const rows = this.buffer;
    this.buffer = [];
    const columnData: ColumnSource[] = [
      { name: "id", data: rows.map((r) => r.id) },
      { name: "question", data: rows.map((r) => r.question) },
      { name: "golden_answers", data: rows.map((r) => r.golden_answers) },
      { name: "data_source", data: rows.map((r) => r.data_source) },
      // Min/max over long prompts that share the template prefix were the costliest part of
      // writing, and no reader of training data prunes on prompt text.
      { name: "prompt", data: rows.map((r) => r.prompt), statistics: false },
      { name: "ability", data: rows.map((r) => r.ability) },
      { name: "reward_model", data: rows.map((r) => r.reward_model) },
      {
        name: "extra_info",
        // INT64 columns take bigints.
        data: rows.map(({ extra_info: e }) => ({ ...e, index: BigInt(e.index) })),
      },
    ];
    void this.writer.write({ columnData, rowGroupSize: rows.length });
  }
}

function tempPathFor(file: string): string {
  return path.join(path.dirname(file), `.${path.basename(file)}.tmp-${process.pid}`);
}
