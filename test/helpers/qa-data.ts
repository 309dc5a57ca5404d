import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { runCli } from "./cli.js";

export interface QaRow {
  id: string;
  question: string;
  golden_answers: string[];
}

/**
 * Writes FlashRAG-layout datasets (`<dir>/flashrag/<source>/<split>.jsonl`) and turns them
 * into verl parquet with the real `searchr1 preprocess`: `<dir>/data/{train,test}.parquet`.
 */
export function preprocessQa(
  dir: string,
  sources: Record<string, Partial<Record<"train" | "test", QaRow[]>>>,
  options: { template?: string; format?: "search-r1" | "verl" } = {},
): { train: string; test: string } {
  const splits = new Set<string>();
  for (const [source, bySplit] of Object.entries(sources)) {
    mkdirSync(path.join(dir, "flashrag", source), { recursive: true });
    for (const [split, rows] of Object.entries(bySplit)) {
      splits.add(split);
      writeFileSync(
        path.join(dir, "flashrag", source, `${split}.jsonl`),
        `${(rows as QaRow[]).map((r) => JSON.stringify(r)).join("\n")}\n`,
      );
    }
  }
  const r = runCli([
    "preprocess",
    ...Object.keys(sources),
    "--input",
    path.join(dir, "flashrag"),
    "--out",
    path.join(dir, "data"),
    "--splits",
    [...splits].join(","),
    "--quiet",
    ...(options.template ? [`template=${options.template}`] : []),
    ...(options.format ? [`format=${options.format}`] : []),
  ]);
  if (r.code !== 0) throw new Error(`preprocess failed: ${r.stderr}`);
  return {
    train: path.join(dir, "data", "train.parquet"),
    test: path.join(dir, "data", "test.parquet"),
  };
}
