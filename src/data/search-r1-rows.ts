import type { SchemaElement } from "hyparquet";
import type { ColumnSource } from "hyparquet-writer";
import type { OutputSplit } from "./flashrag.js";
import {
  int64,
  list,
  promptColumn,
  rewardModelColumn,
  rootSchema,
  string,
  struct,
} from "./parquet-schema.js";
import { type PromptTemplate, renderTemplate } from "./templates.js";

/** A FlashRAG record that passed the checks: what every output format is built from. */
export interface QaRecord {
  id: string | null;
  /** Normalised as Search-R1 does (normalizeQuestion). */
  question: string;
  golden: string[];
}

export interface RowContext {
  dataSource: string;
  split: OutputSplit;
  /** 0-based position in the source file, bad rows included (Search-R1's per-source index). */
  index: number;
  /** 0-based position in the output file (a pandas RangeIndex over the merged file). */
  row: number;
  template: PromptTemplate;
}

/** One output format: its parquet schema, how a record becomes a row, and rows become columns. */
export interface RowFormat<Row> {
  schema: SchemaElement[];
  build(record: QaRecord, ctx: RowContext): Row;
  columns(rows: Row[]): ColumnSource[];
}

/** A record, or why the value cannot be one (a short reason without row details, for counting). */
export type RecordResult = { record: QaRecord } | { invalid: string };

/** Search-R1's normalisation: strip, then end with `?`. */
export function normalizeQuestion(question: string): string {
  const q = question.trim();
  return q.endsWith("?") ? q : `${q}?`;
}

function checkId(id: unknown): string | null | undefined {
  if (id === undefined || id === null) return null;
  if (typeof id === "string") return id;
  if (typeof id === "number" || typeof id === "bigint") return String(id);
  return undefined;
}

export function checkRecord(value: unknown): RecordResult {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return { invalid: "record is not a JSON object" };
  }
  const record = value as Record<string, unknown>;
  const { question, golden_answers: answers } = record;
  if (question === undefined || question === null) return { invalid: "question is missing" };
  if (typeof question !== "string") return { invalid: "question is not a string" };
  if (question.trim() === "") return { invalid: "question is empty" };
  if (answers === undefined || answers === null) return { invalid: "golden_answers is missing" };
  if (!Array.isArray(answers)) return { invalid: "golden_answers is not a list" };
  if (answers.length === 0) return { invalid: "golden_answers is empty" };
  if (!answers.every((a) => typeof a === "string")) {
    return { invalid: "golden_answers contains a non-string" };
  }
  const id = checkId(record.id);
  if (id === undefined) return { invalid: "id is not a string or number" };
  return { record: { id, question: normalizeQuestion(question), golden: answers as string[] } };
}

/**
 * One training row as Search-R1's scripts/data_process/nq_search.py writes it: the FlashRAG
 * columns `.map` keeps, then the verl columns. Field order is the parquet column order.
 */
export interface SearchR1Row {
  id: string | null;
  /**
   * Normalised: nq_search.py's process_fn sets example['question'] in place, and datasets'
   * Dataset.map merges in-place changes into the output (huggingface/datasets,
   * src/datasets/arrow_dataset.py, _map_single: "`function` can modify input in-place").
   */
  question: string;
  golden_answers: string[];
  data_source: string;
  prompt: { role: string; content: string }[];
  ability: string;
  reward_model: { style: string; ground_truth: { target: string[] } };
  extra_info: { split: OutputSplit; index: number; uid: string };
}

export const SEARCH_R1_ROWS: RowFormat<SearchR1Row> = {
  schema: rootSchema([
    [string("id", "OPTIONAL")],
    [string("question")],
    list("golden_answers", [string("element")]),
    [string("data_source")],
    promptColumn(),
    [string("ability")],
    rewardModelColumn(),
    struct("extra_info", [[string("split")], [int64("index")], [string("uid")]]),
  ]),
  build: ({ id, question, golden }, ctx) => ({
    id,
    question,
    golden_answers: golden,
    data_source: ctx.dataSource,
    prompt: [{ role: "user", content: renderTemplate(ctx.template, question) }],
    ability: "fact-reasoning",
    reward_model: { style: "rule", ground_truth: { target: golden } },
    extra_info: {
      split: ctx.split,
      index: ctx.index,
      // Search-R1 groups GRPO samples by index, which collides across sources; uid does not.
      uid: `${ctx.dataSource}-${ctx.split}-${ctx.index}`,
    },
  }),
  columns: (rows) => [
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
  ],
};
