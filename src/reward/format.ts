// Search-R1 v0.3's format reward (Search-R1 verl/utils/reward_score/qa_em_format.py,
// compute_score_em with is_valid_sequence and is_retrieval_correct): a partial score for a
// well-formed trajectory, so that early policies that answer wrongly still learn the protocol.

import { isBlank } from "../text/python-string.js";
import { type Golds, goldList } from "./metrics.js";
import { normalizeAnswer } from "./normalize.js";

type State =
  | "start"
  | "in_think"
  | "after_think"
  | "in_search"
  | "after_search"
  | "in_information"
  | "information"
  | "in_answer"
  | "end";

/** The tags the machine reads; String.split keeps the captured tag between the texts. */
const TAG = /(<\/?(?:think|search|information|answer)>)/;

/**
 * start → <think>…</think> → (<search>…</search> → <information>…</information> → <think>…</think>)*
 * → <answer>…</answer> → end. Any tag not listed for the current state is an error.
 */
const MOVES: Readonly<Record<string, Partial<Record<State, State>>>> = {
  "<think>": { start: "in_think", information: "in_think" },
  "</think>": { in_think: "after_think" },
  "<search>": { after_think: "in_search" },
  "</search>": { in_search: "after_search" },
  "<information>": { after_search: "in_information" },
  "</information>": { in_information: "information" },
  "<answer>": { after_think: "in_answer" },
  "</answer>": { in_answer: "end" },
};

const INSIDE: ReadonlySet<State> = new Set([
  "in_think",
  "in_search",
  "in_information",
  "in_answer",
]);

/**
 * Search-R1's state machine on a response alone (our default mode): whitespace-only text
 * anywhere is skipped, other text is allowed only inside a tag, and the walk must end right
 * after </answer>. So text before the first <think>, after </answer> (an EOS such as
 * <|im_end|> included: pass the response without it), or between tags is invalid, as is a
 * tag inside another ("<think>I will <search>…") or one in a retrieved document.
 *
 * The original first checks that each tag has as many openings as closings; a walk that ends
 * in `end` implies that (every tag is a move, and every opening must be closed before the next
 * move), so the check is left out. The fixtures' script asserts it on every case it tries.
 */
export function isValidResponse(response: string): boolean {
  const parts = response.split(TAG);
  let state: State = "start";
  for (let i = 0; i < parts.length; i++) {
    const part = parts[i] as string;
    if (isBlank(part)) continue;
    if (i % 2 === 1) {
      const next: State | undefined = MOVES[part]?.[state];
      if (next === undefined) return false;
      state = next;
    } else if (!INSIDE.has(state)) {
      return false;
    }
  }
  return state === "end";
}

const ASSISTANT = "<|im_start|>assistant";

/**
 * is_valid_sequence on the decoded prompt + response (search_r1_extract mode): the machine
 * runs on what follows the FIRST "<|im_start|>assistant" (Qwen's chat markup; false when it is
 * absent, as the original's "Missing assistant marker"). The original also consumes the
 * whitespace after the marker, which the machine skips anyway.
 */
export function isValidSequence(promptPlusResponse: string): boolean {
  const at = promptPlusResponse.indexOf(ASSISTANT);
  if (at < 0) return false;
  return isValidResponse(promptPlusResponse.slice(at + ASSISTANT.length));
}

const INFORMATION = /<information>(.*?)<\/information>/gs;

/** The contents of every <information>…</information> (lazy, DOTALL, as the original). */
export function informationBlocks(text: string): string[] {
  return Array.from(text.matchAll(INFORMATION), (m) => m[1] as string);
}

/**
 * is_retrieval_correct: some normalised gold is a substring of some normalised information
 * block of `text`. The original scans the whole decoded prompt + response, so the Search-R1
 * prompt's own "<information> and </information>" counts as a block ("and"); our default mode
 * passes the response alone. A gold that normalises to "" matches any block.
 *
 * One divergence: a bare-string gold is a list of one here; the original would iterate its
 * characters (it never gets one: ground_truth.target is a list).
 */
export function isRetrievalCorrect(text: string, golds: Golds): boolean {
  const wanted = goldList(golds).map(normalizeAnswer);
  return informationBlocks(text).some((block) => {
    const b = normalizeAnswer(block);
    return wanted.some((g) => b.includes(g));
  });
}

/** The three scores of reward.* in the train config (defaults in src/config/schemas/train.ts). */
export interface FormatScores {
  structure_format_score: number;
  final_format_score: number;
  retrieval_score: number;
}

export interface FormatOutcome {
  /** An answer was extracted (not null). */
  answered: boolean;
  /** It matches a gold exactly (only read when answered). */
  exactMatch: boolean;
  formatValid: boolean;
  /** Only read when formatValid: the original computes it only then. */
  retrievalCorrect: boolean;
}

/**
 * qa_em_format.compute_score_em's table, with the correct-answer score fixed at 1:
 *
 *   answer correct,   format valid    1
 *   answer correct,   format invalid  1 − structure_format_score
 *   answer wrong,     format valid    structure_format_score (+ retrieval_score if retrieved)
 *   answer wrong,     format invalid  final_format_score
 *   no answer,        format valid    structure_format_score (+ retrieval_score if retrieved)
 *   no answer,        format invalid  0
 *
 * The retrieval bonus goes only to a well-formed trajectory whose answer is wrong or missing;
 * a correct well-formed one gets exactly 1, nothing on top.
 */
export function formatReward(outcome: FormatOutcome, scores: FormatScores): number {
  const { answered, exactMatch, formatValid, retrievalCorrect } = outcome;
  const sf = scores.structure_format_score;
  if (answered && exactMatch) return formatValid ? 1 : 1 - sf;
  if (formatValid) return retrievalCorrect ? sf + scores.retrieval_score : sf;
  return answered ? scores.final_format_score : 0;
}
