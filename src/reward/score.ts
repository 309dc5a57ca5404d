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
export function scoreTrajectory(input: RewardInput, config: RewardConfig): RewardResult {
  const { golds } = input;
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
