// The answer a trajectory gives: the text of its last <answer>…</answer> (Search-R1
// verl/utils/reward_score/qa_em.py, extract_solution).

import { pythonStrip } from "../text/python-string.js";

/** re.finditer(r'<answer>(.*?)</answer>', s, re.DOTALL): lazy, so "<answer>a<answer>b</answer>" is one match, "a<answer>b". */
const ANSWER = /<answer>(.*?)<\/answer>/gs;

function answerMatches(text: string): string[] {
  return Array.from(text.matchAll(ANSWER), (m) => m[1] as string);
}

/**
 * Our default: the last <answer> of the response alone, stripped as Python's strip() does
 * (Unicode whitespace, not U+200B or U+FEFF); null when the response closes none.
 */
export function extractAnswer(response: string): string | null {
  const found = answerMatches(response);
  const last = found[found.length - 1];
  return last === undefined ? null : pythonStrip(last);
}

/**
 * Search-R1's extract_solution over the decoded prompt + response: ≤ 1 match gives null (the
 * original's guard against the prompt's own tags), else the last match, stripped.
 *
 * Quirk kept for compatibility: the Search-R1 prompt alone (make_prefix in Search-R1's
 * scripts/data_process/nq_search.py: "inside <answer> and </answer>, ... For example,
 * <answer> Beijing </answer>") already has two matches, " and " and " Beijing ", so a
 * trajectory that never answers extracts "Beijing" — and earns final_format_score, not 0,
 * under the format reward. With a prompt that has no answer tags, a trajectory with a single
 * answer extracts null.
 */
export function extractAnswerSearchR1(promptPlusResponse: string): string | null {
  const found = answerMatches(promptPlusResponse);
  if (found.length <= 1) return null;
  return pythonStrip(found[found.length - 1] as string);
}
