import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Report } from "../eval/report.js";
import { WORLD_FILES } from "../world/world.js";

/** EM, searches per question and valid-action rate of one eval, pooled over all questions. */
export interface QuickstartScores {
  em: number;
  searches_per_question: number;
  valid_action_rate: number;
}

export interface QuickstartResult {
  before: QuickstartScores;
  after: QuickstartScores;
  seconds: number;
  algorithm: "grpo" | "ppo";
  /** 0: full fine-tuning. */
  lora_rank: number;
  seed: number;
  /** Where things are, for the closing table. */
  paths: { dir: string; run: string; plots: string; trained: string };
}

/** The pooled figures of an eval folder (its trajectories, all questions weighing the same). */
export function scores(evalDir: string): QuickstartScores {
  const report = JSON.parse(readFileSync(join(evalDir, "report.json"), "utf8")) as Report;
  const sources = Object.values(report.sources);
  const n = sources.reduce((sum, s) => sum + s.n, 0);
  const pooled = (f: (s: Report["sources"][string]) => number) =>
    sources.reduce((sum, s) => sum + f(s) * s.n, 0) / n;
  return {
    em: pooled((s) => s.em),
    searches_per_question: pooled((s) => s.searches),
    // Valid actions over all actions: (turns − invalid) / turns, pooled.
    valid_action_rate:
      sources.reduce((sum, s) => sum + (s.turns - s.invalid_actions) * s.n, 0) /
      sources.reduce((sum, s) => sum + s.turns * s.n, 0),
  };
}

/** The before/after table printed at the end. */
export function quickstartTable(r: QuickstartResult): string {
  const row = (name: string, s: QuickstartScores) =>
    `${name.padEnd(20)} ${s.em.toFixed(3).padStart(6)}  ${s.searches_per_question.toFixed(2).padStart(8)}  ${s.valid_action_rate.toFixed(3).padStart(12)}`;
  return [
    `${"".padEnd(20)} ${"EM".padStart(6)}  ${"searches".padStart(8)}  ${"valid actions".padStart(12)}`,
    row("warm start (before)", r.before),
    row(
      `after ${r.algorithm.toUpperCase()}${r.lora_rank > 0 ? ` LoRA ${r.lora_rank}` : ""}`,
      r.after,
    ),
    "",
    `${r.seconds.toFixed(0)} s in all; plots in ${r.paths.plots}; trained model ${r.paths.trained}`,
    "ask it about the world (questions in world/datasets/*/test.jsonl):",
    `  searchr1 serve-retriever --index ${join(r.paths.dir, "bm25")} --corpus ${join(r.paths.dir, "world", WORLD_FILES.corpus)} &`,
    `  searchr1 ask "<question>" --model ${r.paths.trained} retriever.topk=1 rollout.max_turns=2`,
  ].join("\n");
}
