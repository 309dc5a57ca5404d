import { rename, rm } from "node:fs/promises";
import path from "node:path";
import { fileWriter, ParquetWriter } from "hyparquet-writer";
import type { RowFormat } from "./search-r1-rows.js";

const DEFAULT_ROW_GROUP_SIZE = 10_000;

/**
 * Writes rows to `<dir>/.<name>.tmp-<pid>` one row group at a time, so memory holds at most
 * one row group; `commit()` renames the finished file into place, `abort()` deletes it.
 */
export class VerlParquetWriter<Row> {
  readonly tempPath: string;
  rows = 0;
  private buffer: Row[] = [];
  private readonly writer: ParquetWriter;

  constructor(
    readonly path: string,
    readonly format: RowFormat<Row>,
    private readonly rowGroupSize = DEFAULT_ROW_GROUP_SIZE,
  ) {
    this.tempPath = tempPathFor(path);
    this.writer = new ParquetWriter({ writer: fileWriter(this.tempPath), schema: format.schema });
  }

  append(row: Row): void {
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
    const columnData = this.format.columns(rows);
    void this.writer.write({ columnData, rowGroupSize: rows.length });
  }
}

function tempPathFor(file: string): string {
  return path.join(path.dirname(file), `.${path.basename(file)}.tmp-${process.pid}`);
}
