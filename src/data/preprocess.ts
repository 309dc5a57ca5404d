import { mkdir } from "node:fs/promises";
import path from "node:path";
import type { PreprocessConfig } from "../config/schemas/preprocess.js";
import { InputError } from "../runtime/errors.js";
import type { Progress } from "../runtime/progress.js";
import { refuseExisting } from "../runtime/replace-dir.js";
import { table } from "../runtime/table.js";
import {
  locateSources,
  type OutputSplit,
  openRecords,
  recordLocation,
  type SourceFile,
} from "./flashrag.js";
import { checkRecord, type RowFormat, SEARCH_R1_ROWS } from "./search-r1-rows.js";
import { builtinTemplatesDir, loadTemplate, type PromptTemplate } from "./templates.js";
import { VerlParquetWriter } from "./verl-parquet.js";
import { VERL_TOOL_ROWS } from "./verl-tool-rows.js";

/** Each `format`'s rows and the template it uses when `template` is not given. */
const FORMATS: Record<PreprocessConfig["format"], { rows: RowFormat<unknown>; template: string }> =
  {
    "search-r1": { rows: SEARCH_R1_ROWS as RowFormat<unknown>, template: "search-r1" },
    verl: { rows: VERL_TOOL_ROWS as RowFormat<unknown>, template: "verl-tool-call" },
  };

/** Warnings printed per source file; the rest are only counted. */
const MAX_WARNINGS_PER_FILE = 10;
/** Records between progress updates and abort checks. */
const CHECK_EVERY = 1000;
/** The only parquet input columns a row needs; the rest are never decoded. */
const INPUT_COLUMNS = ["id", "question", "golden_answers"];

/** What one source file contributed to one output file. */
export interface SourceSummary {
  split: OutputSplit;
  dataSource: string;
  file: string;
  rows: number;
  skipped: number;
  /** Skipped rows by reason. */
  skipReasons: Record<string, number>;
}

/** A dataset left out of an output file because it has no split for it. */
export interface LeftOutSource {
  split: OutputSplit;
  dataSource: string;
  lookedFor: string[];
}

export interface OutputSummary {
  split: OutputSplit;
  path: string;
  rows: number;
}

/** An output file not written because no dataset has its split (asked for by default only). */
export interface SkippedOutput {
  split: OutputSplit;
  path: string;
  reason: string;
}

export interface PreprocessSummary {
  sources: SourceSummary[];
  leftOut: LeftOutSource[];
  outputs: OutputSummary[];
  skipped: SkippedOutput[];
}

/** The output files written when `splits` is not given; train.parquet only where there is data. */
const DEFAULT_SPLITS: OutputSplit[] = ["train", "test"];

/**
 * Converts FlashRAG datasets into `<out>/train.parquet` and `<out>/test.parquet` as
 * Search-R1's merge scripts do. An existing output file is refused unless `overwrite`.
 * Every output goes to a temporary file and is renamed only once all of them are
 * complete; on any error or abort the temporary files are removed.
 * Without `splits`, train.parquet is skipped (and the summary says why) when no dataset has
 * a train split; a split asked for explicitly must exist.
 */
export async function runPreprocess(
  config: PreprocessConfig,
  progress: Progress,
  signal?: AbortSignal,
): Promise<PreprocessSummary> {
  signal?.throwIfAborted();
  const format = FORMATS[config.format];
  const template = loadTemplate(config.template ?? format.template, builtinTemplatesDir());
  const splits = [...new Set(config.splits ?? DEFAULT_SPLITS)];
  const optional: OutputSplit[] = config.splits === null ? ["train"] : [];
  const plans = locateSources(config.input, config.datasets, splits, optional);
  for (const plan of plans) {
    if (plan.skipped === undefined) {
      await refuseExisting(path.join(config.out, `${plan.split}.parquet`), config.overwrite);
    }
  }
  try {
    await mkdir(config.out, { recursive: true });
  } catch (e) {
    throw new InputError(`output folder ${config.out} cannot be created (${(e as Error).message})`);
  }

  const summary: PreprocessSummary = { sources: [], leftOut: [], outputs: [], skipped: [] };
  const writers: VerlParquetWriter<unknown>[] = [];
  try {
    for (const plan of plans) {
      if (plan.skipped !== undefined) {
        const file = path.join(config.out, `${plan.split}.parquet`);
        summary.skipped.push({ split: plan.split, path: file, reason: plan.skipped });
        continue;
      }
      const writer = new VerlParquetWriter(
        path.join(config.out, `${plan.split}.parquet`),
        format.rows,
      );
      writers.push(writer);
      for (const { dataset, lookedFor } of plan.missing) {
        summary.leftOut.push({ split: plan.split, dataSource: dataset, lookedFor });
      }
      for (const source of plan.sources) {
        const converted = await convertSource(source, plan.split, writer, {
          template,
          strict: config.strict,
          progress,
          signal,
        });
        summary.sources.push(converted);
      }
      writer.finish();
      summary.outputs.push({ split: plan.split, path: writer.path, rows: writer.rows });
    }
    signal?.throwIfAborted();
    for (const writer of writers) await writer.commit();
  } catch (e) {
    await Promise.all(writers.map((w) => w.abort()));
    throw e;
  }
  return summary;
}

interface ConvertOptions {
  template: PromptTemplate;
  strict: boolean;
  progress: Progress;
  signal: AbortSignal | undefined;
}

async function convertSource(
  file: SourceFile,
  split: OutputSplit,
  writer: VerlParquetWriter<unknown>,
  { template, strict, progress, signal }: ConvertOptions,
): Promise<SourceSummary> {
  const summary: SourceSummary = {
    split,
    dataSource: file.dataset,
    file: file.path,
    rows: 0,
    skipped: 0,
    skipReasons: {},
  };
  const records = await openRecords(file, INPUT_COLUMNS);
  const task = progress.task(
    `${split}: ${file.dataset} ${path.basename(file.path)}`,
    records.total,
    records.unit,
  );
  let seen = 0;
  try {
    for await (const { value, line, index } of records) {
      const built = checkRecord(value);
      if ("record" in built) {
        const ctx = { dataSource: file.dataset, split, index, row: writer.rows, template };
        writer.append(writer.format.build(built.record, ctx));
        summary.rows++;
      } else {
        const where = recordLocation(file, line);
        if (strict) throw new InputError(`${where}: ${built.invalid}`);
        summary.skipped++;
        summary.skipReasons[built.invalid] = (summary.skipReasons[built.invalid] ?? 0) + 1;
        if (summary.skipped <= MAX_WARNINGS_PER_FILE) {
          progress.log(`warning: ${where}: ${built.invalid}; row skipped`);
        }
      }
      if (++seen % CHECK_EVERY === 0) {
        task.update(records.done());
        signal?.throwIfAborted();
      }
    }
    task.update(records.done());
  } finally {
    // Stops a terminal bar before any error is printed.
    task.finish();
  }
  const unprinted = summary.skipped - MAX_WARNINGS_PER_FILE;
  if (unprinted > 0) {
    progress.log(`warning: ${file.path}: ${unprinted} more invalid rows skipped`);
  }
  return summary;
}

/** A plain-text report: one line per (split, source), then skip reasons and files written. */
export function formatSummary(summary: PreprocessSummary): string {
  const lines = table(
    [
      ["split", "source", "file", "rows", "skipped"],
      ...summary.sources.map((s) => [
        s.split,
        s.dataSource,
        s.file,
        String(s.rows),
        String(s.skipped),
      ]),
    ],
    new Set([3, 4]),
  );

  const reasons = summary.sources.flatMap((s) =>
    Object.entries(s.skipReasons).map(
      ([reason, n]) => `  ${s.split} ${s.dataSource}: ${reason} (${n})`,
    ),
  );
  if (reasons.length > 0) lines.push("", "skipped rows:", ...reasons);

  if (summary.leftOut.length > 0) {
    lines.push(
      "",
      "left out (no file for the split):",
      ...summary.leftOut.map(
        (l) => `  ${l.split} ${l.dataSource}: looked for ${l.lookedFor.join(", ")}`,
      ),
    );
  }

  if (summary.skipped.length > 0) {
    lines.push("", "not written:", ...summary.skipped.map((s) => `  ${s.path}: ${s.reason}`));
  }

  lines.push(
    "",
    "written:",
    ...table(
      summary.outputs.map((o) => [`  ${o.path}`, `${o.rows} rows`]),
      new Set([1]),
    ),
  );
  return lines.join("\n");
}
