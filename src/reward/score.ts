// One trajectory's reward and answer metrics: what the agent, eval and train call.

import { extractAnswer, extractAnswerSearchR1 } from "./extract.js";
import {
  type FormatScores,
  formatReward,
  isRetrievalCorrect,
  isValidResponse,
  isValidSequence,
} from "./format.js";
import { emCheck, f1Score, type Golds, subemCheck } from "./metrics.js";

/** The train config's `reward` section (src/config/schemas/train.ts). */
export interface RewardConfig extends FormatScores {
  format_reward: boolean;
  search_r1_extract: boolean;
}

export interface RewardInput {
  /**
   * The chat-rendered prompt as decoded WITH special tokens (Search-R1 decodes prompt +
   * response together); read only with search_r1_extract.
   */
  promptText: string;
  /** The response, retrieved blocks included, without the EOS token. */
  responseText: string;
  golds: Golds;
}

export interface RewardResult {
  reward: number;
  prediction: string | null;
  em: number;
  subem: number;
  f1: number;
  /** null when format_reward is off (not computed). */
  formatValid: boolean | null;
}

/**
 * Which scorer: Search-R1's (qa_em.py, and its format reward), or verl's
 * search_r1_like_qa_em (what verl's Hermes tool-calling recipe is scored with).
 */
export type RewardRule = "search_r1" | "verl_search_r1_like";

/**
 * reward = EM (0 or 1; no answer is 0) as Search-R1's main runs, or with format_reward the
 * v0.3 table of formatReward. em, subem and f1 always describe the extracted prediction.
 *
 * search_r1_extract false (default): the answer is the response's last <answer>, and the
 * format and retrieval are judged on the response alone.
 * search_r1_extract true: the original's behaviour on promptText + responseText, quirks
 * included — extract_solution's "≤ 1 match is no answer" (so "Beijing" from the prompt when
 * the response never answers), the format checked after the first <|im_start|>assistant, and
 * the prompt's "<information> and </information>" counted as a retrieved block.
 */
export function scoreTrajectory(
  input: RewardInput,
  config: RewardConfig,
  rule: RewardRule = "search_r1",
): RewardResult {
  const { golds } = input;
  if (rule === "verl_search_r1_like") return verlSearchR1Like(input);
  const text = config.search_r1_extract
    ? input.promptText + input.responseText
    : input.responseText;
  const prediction = config.search_r1_extract ? extractAnswerSearchR1(text) : extractAnswer(text);
  const em = emCheck(prediction, golds);
  let reward: number = em;
  let formatValid: boolean | null = null;
  if (config.format_reward) {
    formatValid = config.search_r1_extract ? isValidSequence(text) : isValidResponse(text);
    reward = formatReward(
      {
        answered: prediction !== null,
        exactMatch: em === 1,
        formatValid,
        retrievalCorrect: formatValid && isRetrievalCorrect(text, golds),
      },
      config,
    );
  }
  return {
    reward,
    prediction,
    em,
    subem: subemCheck(prediction, golds),
    f1: f1Score(prediction, golds),
    formatValid,
  };
}

/**
 * verl's verl/utils/reward_score/search_r1_like_qa_em.py `compute_score` (format_score 0,
 * score 1) on the decoded response (verl's reward manager decodes the response ids with
 * skip_special_tokens, tool turns included): the last <answer> of the response, exact match
 * as Search-R1 normalises; a correct answer in a response with more than 10 `<answer>` or more
 * than 10 `</answer>` scores 1/4 ("prevent output a lot of </answer>").
 */
function verlSearchR1Like(input: RewardInput): RewardResult {
  const { golds, responseText: text } = input;
  const prediction = extractAnswer(text);
  const em = emCheck(prediction, golds);
  const spam = count(text, "<answer>") > 10 || count(text, "</answer>") > 10;
  return {
    reward: em === 1 && spam ? 0.25 : em,
    prediction,
    em,
    subem: subemCheck(prediction, golds),
    f1: f1Score(prediction, golds),
    formatValid: null,
  };
}

/** Python's str.count: non-overlapping occurrences. */
function count(text: string, tag: string): number {
  return text.split(tag).length - 1;
}
