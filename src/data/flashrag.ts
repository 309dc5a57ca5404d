import { createReadStream, type ReadStream, statSync } from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { pipeline, type Readable } from "node:stream";
import { createGunzip } from "node:zlib";
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects } from "hyparquet";
import { compressors } from "hyparquet-compressors";
import { InputError } from "../runtime/errors.js";

/** The two files Search-R1 training uses. */
export type OutputSplit = "train" | "test";

export type SourceFormat = "jsonl" | "jsonl.gz" | "parquet";

/** Extensions in order of preference when one split exists in several formats. */
const FORMATS: SourceFormat[] = ["jsonl", "jsonl.gz", "parquet"];

/** Input splits to try for each output split: Search-R1's test set takes test, else dev, else train. */
const INPUT_SPLITS: Record<OutputSplit, string[]> = {
  train: ["train"],
  test: ["test", "dev", "train"],
};

/** One dataset split on disk: `<input>/<dataset>/<split>.<format>`. */
export interface SourceFile {
  dataset: string;
  /** The input split the file holds (test, dev, train). */
  split: string;
  path: string;
  format: SourceFormat;
}

/** A dataset left out of an output split because it has no file for it. */
export interface MissingSource {
  dataset: string;
  lookedFor: string[];
}

export interface SplitPlan {
  split: OutputSplit;
  /** In the order the datasets were given. */
  sources: SourceFile[];
  missing: MissingSource[];
  /** Set when the split is left out altogether (an optional split no dataset has): why. */
  skipped?: string;
}

function isFile(p: string): boolean {
  return statSync(p, { throwIfNoEntry: false })?.isFile() ?? false;
}

function isDirectory(p: string): boolean {
  return statSync(p, { throwIfNoEntry: false })?.isDirectory() ?? false;
}

function candidateNames(splits: string[]): string[] {
  return splits.flatMap((s) => FORMATS.map((f) => `${s}.${f}`));
}

/** The file of the first input split that exists, in preferred format; undefined if none does. */
function findSplitFile(
  dataset: string,
  datasetDir: string,
  splits: string[],
): SourceFile | undefined {
  for (const split of splits) {
    for (const format of FORMATS) {
      const file = path.join(datasetDir, `${split}.${format}`);
      if (isFile(file)) return { dataset, split, path: file, format };
    }
  }
  return undefined;
}

/**
 * Finds every input file before anything is read, so a missing dataset or test split fails
 * the run up front. A dataset without a train split is only left out of train.parquet
 * (bamboogle ships test only). When no dataset has the split, a split in `optional` gets a
 * plan with no sources and the reason in `skipped`; any other is an error.
 */
export function locateSources(
  input: string,
  datasets: string[],
  splits: OutputSplit[],
  optional: readonly OutputSplit[] = [],
): SplitPlan[] {
  if (!isDirectory(input)) {
    throw new InputError(
      `input folder ${input} does not exist or is not a folder; expected <input>/<dataset>/<split>.jsonl`,
    );
  }
  const seen = new Set<string>();
  for (const dataset of datasets) {
    if (seen.has(dataset)) {
      throw new InputError(`dataset ${dataset} is listed twice; each data source must be unique`);
    }
    seen.add(dataset);
    const dir = path.join(input, dataset);
    if (!isDirectory(dir)) {
      throw new InputError(
        `dataset folder ${dir} does not exist; expected a FlashRAG folder with train/dev/test files`,
      );
    }
  }
  return splits.map((split) => {
    const plan: SplitPlan = { split, sources: [], missing: [] };
    const wanted = INPUT_SPLITS[split];
    for (const dataset of datasets) {
      const dir = path.join(input, dataset);
      const file = findSplitFile(dataset, dir, wanted);
      if (file) {
        plan.sources.push(file);
      } else if (split === "test") {
        throw new InputError(
          `dataset folder ${dir} has no test split; looked for ${candidateNames(wanted).join(", ")}`,
        );
      } else {
        plan.missing.push({ dataset, lookedFor: candidateNames(wanted) });
      }
    }
    if (plan.sources.length === 0) {
      const why =
        `no dataset has a ${split} split; looked for ${candidateNames(wanted).join(", ")} in ` +
        datasets.map((d) => path.join(input, d)).join(", ");
      if (!optional.includes(split)) throw new InputError(why);
      plan.skipped = why;
    }
    return plan;
  });
}

/** One input record before validation. */
export interface RawRecord {
  value: unknown;
  /** 1-based line (jsonl) or row (parquet) number, for messages. */
  line: number;
  /** 0-based position among the file's non-blank records, bad ones included. */
  index: number;
}

export interface RecordStream extends AsyncIterable<RawRecord> {
  /** Size of the work in `unit`: bytes on disk (compressed for .gz) or parquet rows. */
  total: number;
  unit: "B" | "rows";
  /** Work done so far, in `unit`. */
  done(): number;
}

/** `file:line` for jsonl, `file:row N` for parquet, as used in every row message. */
export function recordLocation(file: SourceFile, line: number): string {
  return file.format === "parquet" ? `${file.path}:row ${line}` : `${file.path}:${line}`;
}

/**
 * Streams a source file's records. `columns` limits which parquet columns are decoded
 * (FlashRAG's metadata columns can be large); absent ones are simply not read.
 */
export async function openRecords(file: SourceFile, columns?: string[]): Promise<RecordStream> {
  return file.format === "parquet" ? openParquet(file, columns) : openJsonl(file);
}

function openJsonl(file: SourceFile): RecordStream {
  const total = statSync(file.path).size;
  let raw: ReadStream | undefined;
  // Streams open on first iteration, so a stream that is never read holds no file handle.
  async function* records(): AsyncGenerator<RawRecord> {
    raw = createReadStream(file.path);
    // pipeline forwards a read error to the gunzip stream, where readline sees it.
    const text: Readable =
      file.format === "jsonl.gz" ? pipeline(raw, createGunzip(), () => {}) : raw;
    const lines = readline.createInterface({ input: text, crlfDelay: Number.POSITIVE_INFINITY });
    let line = 0;
    let index = 0;
    try {
      for await (let source of lines) {
        line++;
        if (line === 1 && source.startsWith("\uFEFF")) source = source.slice(1);
        if (source.trim() === "") continue;
        let value: unknown;
        try {
          value = JSON.parse(source);
        } catch (e) {
          throw new InputError(`${file.path}:${line}: malformed JSON (${(e as Error).message})`);
        }
        yield { value, line, index: index++ };
      }
    } catch (e) {
      if (e instanceof InputError) throw e;
      const what = file.format === "jsonl.gz" ? "cannot read gzip data" : "cannot read";
      throw new InputError(`${file.path}: ${what} after line ${line} (${(e as Error).message})`);
    } finally {
      lines.close();
      raw.destroy();
    }
  }
  return { total, unit: "B", done: () => raw?.bytesRead ?? 0, [Symbol.asyncIterator]: records };
}

async function openParquet(file: SourceFile, columns?: string[]): Promise<RecordStream> {
  const fail = (e: unknown) =>
    new InputError(`${file.path}: not a readable parquet file (${(e as Error).message})`);
  const buffer = await asyncBufferFromFile(file.path);
  const metadata = await parquetMetadataAsync(buffer).catch((e: unknown) => {
    throw fail(e);
  });
  const present = new Set(topLevelColumns(metadata.schema));
  const wanted = columns?.filter((c) => present.has(c));
  let rowsRead = 0;

  // One row group at a time: memory holds one decoded row group, never the whole file.
  async function* records(): AsyncGenerator<RawRecord> {
    let rowStart = 0;
    for (const group of metadata.row_groups) {
      const rowEnd = rowStart + Number(group.num_rows);
      const rows = await parquetReadObjects({
        file: buffer,
        metadata,
        columns: wanted,
        rowStart,
        rowEnd,
        compressors,
      }).catch((e: unknown) => {
        throw fail(e);
      });
      for (const [i, value] of rows.entries()) {
        rowsRead = rowStart + i + 1;
        yield { value, line: rowsRead, index: rowStart + i };
      }
      rowStart = rowEnd;
    }
  }

  return {
    total: Number(metadata.num_rows),
    unit: "rows",
    done: () => rowsRead,
    [Symbol.asyncIterator]: records,
  };
}

/**
 * The names of a parquet schema's top-level columns. The schema is a depth-first list
 * (parquet-format's SchemaElement: a group's `num_children` elements follow it), so a nested
 * field that shares a column's name (verl's extra_info.question) is skipped.
 */
function topLevelColumns(schema: readonly { name: string; num_children?: number }[]): string[] {
  const names: string[] = [];
  let i = 1;
  const skip = (): void => {
    const children = schema[i++]?.num_children ?? 0;
    for (let c = 0; c < children; c++) skip();
  };
  for (let c = 0; c < (schema[0]?.num_children ?? 0); c++) {
    names.push(schema[i]?.name as string);
    skip();
  }
  return names;
}
