// Answer metrics on normalised strings: exact match and substring exact match as Search-R1's
// qa_em.py has them (em_check, subem_check), and SQuAD v1.1's token F1, which Search-R1 lacks
// but QA evaluations (FlashRAG, the papers' tables) report beside EM.

import { pythonSplit } from "../text/python-string.js";
import { normalizeAnswer } from "./normalize.js";

/** Gold answers: ground_truth.target, or one bare string (Search-R1 accepts both). */
export type Golds = readonly string[] | string;

export function goldList(golds: Golds): readonly string[] {
  return typeof golds === "string" ? [golds] : golds;
}

/** 1 when the normalised prediction equals some normalised gold; a missing answer scores 0. */
export function emCheck(prediction: string | null, golds: Golds): 0 | 1 {
  if (prediction === null) return 0;
  const p = normalizeAnswer(prediction);
  return goldList(golds).some((g) => normalizeAnswer(g) === p) ? 1 : 0;
}

/**
 * 1 when some normalised gold is a substring of the normalised prediction: a character
 * substring, not a token one ("jing" is in "beijing"), and a gold that normalises to "" (say
 * "The") matches everything — both as in the original.
 */
export function subemCheck(prediction: string | null, golds: Golds): 0 | 1 {
  if (prediction === null) return 0;
  const p = normalizeAnswer(prediction);
  return goldList(golds).some((g) => p.includes(normalizeAnswer(g))) ? 1 : 0;
}

/** Token F1 against one gold, with multiset overlap (Counter & Counter). */
function tokenF1(predictionTokens: readonly string[], goldTokens: readonly string[]): number {
  const counts = new Map<string, number>();
  for (const t of goldTokens) counts.set(t, (counts.get(t) ?? 0) + 1);
  let same = 0;
  for (const t of predictionTokens) {
    const left = counts.get(t) ?? 0;
    if (left > 0) {
      counts.set(t, left - 1);
      same++;
    }
  }
  if (same === 0) return 0;
  const precision = same / predictionTokens.length;
  const recall = same / goldTokens.length;
  return (2 * precision * recall) / (precision + recall);
}

/**
 * SQuAD v1.1's f1_score, the max over golds. No shared token gives 0, and so does an empty
 * prediction against an empty gold (v1.1 returns through its num_same == 0 branch; SQuAD v2
 * would give 1). No golds, or no answer, gives 0. Unlike FlashRAG's F1 there is no yes/no
 * special case.
 */
export function f1Score(prediction: string | null, golds: Golds): number {
  if (prediction === null) return 0;
  const p = pythonSplit(normalizeAnswer(prediction));
  let best = 0;
  for (const g of goldList(golds))
    best = Math.max(best, tokenF1(p, pythonSplit(normalizeAnswer(g))));
  return best;
}
