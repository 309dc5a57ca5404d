import type { OutputSplit } from "./flashrag.js";
import { type PromptTemplate, renderTemplate } from "./templates.js";

/**
 * One training row in verl's schema, as Search-R1's preprocessing writes it: the FlashRAG
 * columns it keeps, then the verl columns. Field order is the parquet column order.
 */
export interface VerlRow {
  id: string | null;
  /** The input question as given; only the prompt carries the normalised one. */
  question: string;
  golden_answers: string[];
  data_source: string;
  prompt: { role: string; content: string }[];
  ability: string;
  reward_model: { style: string; ground_truth: { target: string[] } };
  extra_info: { split: OutputSplit; index: number; uid: string };
}

export interface RowContext {
  dataSource: string;
  split: OutputSplit;
  /** 0-based position in the source file, bad rows included (Search-R1's per-source index). */
  index: number;
  template: PromptTemplate;
}

/** A row, or why the record cannot be one (a short reason without row details, for counting). */
export type RowResult = { row: VerlRow } | { invalid: string };

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

export function buildVerlRow(value: unknown, ctx: RowContext): RowResult {
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

  const golden = answers as string[];
  return {
    row: {
      id,
      question,
      golden_answers: golden,
      data_source: ctx.dataSource,
      prompt: [
        { role: "user", content: renderTemplate(ctx.template, normalizeQuestion(question)) },
      ],
      ability: "fact-reasoning",
      reward_model: { style: "rule", ground_truth: { target: golden } },
      extra_info: {
        split: ctx.split,
        index: ctx.index,
        // Search-R1 groups GRPO samples by index, which collides across sources; uid does not.
        uid: `${ctx.dataSource}-${ctx.split}-${ctx.index}`,
      },
    },
  };
}
