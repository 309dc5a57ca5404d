// SQuAD's normalize_answer, which Search-R1 copies into verl/utils/reward_score/qa_em.py and
// qa_em_format.py (normalize_answer), with the Python string semantics it relies on made
// explicit: EM against the original needs the same answer strings, not merely similar ones.

import { pythonSplit } from "../text/python-string.js";

/** string.punctuation: the 32 ASCII punctuation characters; “ ” 。 ¿ — and the like stay. */
const ASCII_PUNCTUATION = /[!-/:-@[-`{-~]/g;

/**
 * re.sub(r"\b(a|an|the)\b", " ", s) on a str: Python's \b is Unicode-aware, its word characters
 * being letters, numbers (any N category) and "_". JavaScript's \b is ASCII-only even with the u
 * flag, so the boundaries are spelled out: "théa", "a1", "a²" and "中a" keep their "a", while an
 * "a" before a combining accent (not a word character in Python either) goes.
 */
const ARTICLE = /(?<![\p{L}\p{N}_])(?:a|an|the)(?![\p{L}\p{N}_])/gu;

/**
 * lower → drop ASCII punctuation → articles to " " → " ".join(split()). toLowerCase agrees with
 * Python's str.lower() on every character both Unicode databases know (checked over all code
 * points: full mappings such as İ → i̇, and the final sigma).
 */
export function normalizeAnswer(s: string): string {
  const lowered = s.toLowerCase();
  const unpunctuated = lowered.replace(ASCII_PUNCTUATION, "");
  const noArticles = unpunctuated.replace(ARTICLE, " ");
  return pythonSplit(noArticles).join(" ");
}
