// From one outcome score per trajectory to token-level rewards: the score sits on the last
// response token, and the optional in-reward KL penalty (algorithm.use_kl_in_reward) is
// subtracted token by token.

import { type KlEstimator, klPenalty } from "./kl.js";
import { checkRows, lastMaskedIndex, type Rows, zerosLike } from "./rows.js";

/**
 * token_level_scores: each trajectory's score at its last response token, 0 elsewhere.
 * "Last" is the last position where `responseMask` is 1. Search-R1's reward function writes
 * token_level_scores[i, valid_response_length − 1] with valid_response_length the sum of the
 * response attention mask (Search-R1 verl/trainer/main_ppo.py, RewardManager.__call__); that
 * mask counts retrieved tokens too and has no holes, so its sum − 1 is its last 1. With a mask
 * that has holes the sum would land inside the response, which is why the position is found,
 * not counted. Pass the response mask (every response token, generated or retrieved), not the
 * loss mask: the reward then sits where Search-R1 puts it even when a trajectory ends on an
 * observation.
 */
export function tokenLevelScores(scores: readonly number[], responseMask: Rows): Float64Array[] {
  if (scores.length !== responseMask.length) {
    throw new Error(`scores: ${scores.length} values, but responseMask has ${responseMask.length}`);
  }
  const out = zerosLike(responseMask);
  for (let b = 0; b < scores.length; b++) {
    const last = lastMaskedIndex(responseMask[b] as ArrayLike<number>);
    if (last < 0) throw new Error(`responseMask[${b}]: no response token to carry its score`);
    (out[b] as Float64Array)[last] = scores[b] as number;
  }
  return out;
}

export interface KlPenaltyInput {
  tokenLevelScores: Rows;
  /** Log-probs of the sampled tokens under the policy that generated them. */
  oldLogProbs: Rows;
  refLogProbs: Rows;
  /**
   * Tokens that pay the penalty. Search-R1 uses info_mask: generated tokens only
   * (apply_kl_penalty in Search-R1 verl/trainer/ppo/ray_trainer.py).
   */
  mask: Rows;
  estimator: KlEstimator;
  /** β, the controller's current value. */
  klCoef: number;
}

export interface KlPenaltyResult {
  tokenLevelRewards: Float64Array[];
  /** Per-token KL (masked), for metrics. */
  kl: Float64Array[];
  /**
   * The batch KL the adaptive controller is fed (verl's critic/kl): the mean over trajectories
   * of each one's masked mean. A trajectory with no masked token is left out of the mean
   * (verl would get 0/0 = NaN and carry it into β); 0 when none has any.
   */
  currentKl: number;
}

/** rewards = scores − β·KL(old‖ref)·mask, as verl's apply_kl_penalty. */
export function applyKlPenalty(input: KlPenaltyInput): KlPenaltyResult {
  const { tokenLevelScores: scores, oldLogProbs, refLogProbs, mask, estimator, klCoef } = input;
  checkRows("tokenLevelScores", scores, mask, "mask");
  checkRows("oldLogProbs", oldLogProbs, mask, "mask");
  checkRows("refLogProbs", refLogProbs, mask, "mask");
  const rewards = zerosLike(mask);
  const kl = zerosLike(mask);
  let klSum = 0;
  let rowsWithTokens = 0;
  for (let b = 0; b < mask.length; b++) {
    const m = mask[b] as ArrayLike<number>;
    const s = scores[b] as ArrayLike<number>;
    const old = oldLogProbs[b] as ArrayLike<number>;
    const ref = refLogProbs[b] as ArrayLike<number>;
    const r = rewards[b] as Float64Array;
    const k = kl[b] as Float64Array;
    let rowSum = 0;
    let rowCount = 0;
    for (let t = 0; t < m.length; t++) {
      if (m[t] !== 0) {
        k[t] = klPenalty(old[t] as number, ref[t] as number, estimator);
        rowSum += k[t] as number;
        rowCount++;
      }
      r[t] = (s[t] as number) - klCoef * (k[t] as number);
    }
    if (rowCount > 0) {
      klSum += rowSum / rowCount;
      rowsWithTokens++;
    }
  }
  return {
    tokenLevelRewards: rewards,
    kl,
    currentKl: rowsWithTokens > 0 ? klSum / rowsWithTokens : 0,
  };
}
