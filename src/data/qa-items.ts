import { existsSync, statSync } from "node:fs";
import { InputError } from "../runtime/errors.js";
import { openRecords, recordLocation, type SourceFile } from "./flashrag.js";

/** One question of a training/test parquet (verl's schema, as `searchr1 preprocess` writes it). */
export interface QaItem {
  /** `<data_source>/<id>`: unique across the files (FlashRAG ids repeat across datasets). */
  key: string;
  /** The row's `id` column, or `<data_source>_<extra_info.index>` when it has none. */
  id: string;
  dataSource: string;
  /** The `question` column, or the prompt's last message when there is none. */
  question: string;
  golds: string[];
  /** The chat messages to render with the model's template. */
  messages: { role: string; content: string }[];
  /** `extra_info.uid` where preprocess wrote one: the GRPO group id. */
  uid: string | null;
}

const COLUMNS = ["id", "question", "data_source", "prompt", "reward_model", "extra_info"];

/**
 * Reads the questions of verl-schema parquet files in file and row order. A row without
 * `data_source`, `prompt` or `reward_model.ground_truth.target` is an InputError naming the
 * file, row and field: a test set that cannot be scored must not be half evaluated.
 */
export async function readQaItems(files: readonly string[]): Promise<QaItem[]> {
  const items: QaItem[] = [];
  const keys = new Set<string>();
  for (const path of files) {
    if (!existsSync(path) || !statSync(path).isFile()) {
      throw new InputError(
        `${path}: no such file (data files are parquet from searchr1 preprocess)`,
      );
    }
    const file: SourceFile = { dataset: path, split: "test", path, format: "parquet" };
    for await (const record of await openRecords(file, COLUMNS)) {
      const where = recordLocation(file, record.line);
      const item = toItem(record.value as Record<string, unknown>, where);
      let key = `${item.dataSource}/${item.id}`;
      if (keys.has(key)) key = `${key}#${record.index}`;
      keys.add(key);
      items.push({ ...item, key });
    }
  }
  return items;
}

function toItem(row: Record<string, unknown>, where: string): Omit<QaItem, "key"> {
  const bad = (field: string, expected: string) =>
    new InputError(`${where}: ${field} ${expected} (is this a searchr1 preprocess parquet?)`);
  const dataSource = row.data_source;
  if (typeof dataSource !== "string" || dataSource === "") throw bad("data_source", "is missing");
  const target = (row.reward_model as { ground_truth?: { target?: unknown } } | null)?.ground_truth
    ?.target;
  const golds = typeof target === "string" ? [target] : target;
  if (!Array.isArray(golds) || !golds.every((g) => typeof g === "string")) {
    throw bad("reward_model.ground_truth.target", "is missing or not a list of strings");
  }
  const prompt = row.prompt;
  if (
    !Array.isArray(prompt) ||
    prompt.length === 0 ||
    !prompt.every((m) => typeof m?.role === "string" && typeof m?.content === "string")
  ) {
    throw bad("prompt", "must be a list of {role, content} messages");
  }
  const extra = (row.extra_info ?? {}) as { index?: unknown; uid?: unknown; question?: unknown };
  const id =
    row.id !== null && row.id !== undefined
      ? String(row.id)
      : `${dataSource}_${String(extra.index ?? "")}`;
  const messages = prompt as { role: string; content: string }[];
  return {
    id,
    dataSource,
    // verl's tool-call rows keep the question in extra_info only.
    question:
      typeof row.question === "string"
        ? row.question
        : typeof extra.question === "string"
          ? extra.question
          : (messages.at(-1)?.content ?? ""),
    golds: golds as string[],
    messages,
    uid: typeof extra.uid === "string" ? extra.uid : null,
  };
}

/** The first `n` questions of each data source, in order. */
export function firstPerSource(items: readonly QaItem[], n: number): QaItem[] {
  const seen = new Map<string, number>();
  return items.filter((item) => {
    const count = (seen.get(item.dataSource) ?? 0) + 1;
    seen.set(item.dataSource, count);
    return count <= n;
  });
}
