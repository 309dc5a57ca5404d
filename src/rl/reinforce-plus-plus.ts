// REINFORCE++ (Hu 2025, arXiv 2501.03262) without a critic: the discounted return-to-go of
// the token rewards, whitened over the batch, as verl's
// compute_reinforce_plus_plus_outcome_advantage. The token rewards carry the outcome score on
// the last token and, with use_kl_in_reward, the per-token KL penalty (the paper's token-level
// KL), so each token's return is the score minus the KL still to come.

import { maskedWhiten } from "./masked-whiten.js";
import { checkRows, type Rows, zerosLike } from "./rows.js";

export interface ReinforcePlusPlusInput {
  tokenLevelRewards: Rows;
  /** Steps and whitening mask; the response mask, as for GAE (see gae.ts). */
  mask: Rows;
  /** algorithm.gamma. */
  gamma: number;
}

export interface ReinforcePlusPlusResult {
  /** Whitened returns, 0 outside the mask. */
  advantages: Float64Array[];
  /** G_t, unwhitened, 0 outside the mask. */
  returns: Float64Array[];
}

/**
 * G_t = r_t + γ·G_{t+1} backwards over each row (G = 0 after the last step), then
 * A = (G − mean)/sqrt(var + 1e-8) over all masked tokens of the batch (unbiased var).
 *
 * Positions outside the mask are skipped, as in gae.ts. verl instead resets the running return
 * to 0 at every mask-0 position: the same for masks without holes (trailing padding), but with
 * holes it would cut each return at the first observation block after the token.
 */
export function reinforcePlusPlusOutcomeAdvantage(
  input: ReinforcePlusPlusInput,
): ReinforcePlusPlusResult {
  const { tokenLevelRewards, mask, gamma } = input;
  checkRows("tokenLevelRewards", tokenLevelRewards, mask, "mask");
  const returns = zerosLike(mask);
  for (let b = 0; b < mask.length; b++) {
    const m = mask[b] as ArrayLike<number>;
    const r = tokenLevelRewards[b] as ArrayLike<number>;
    const g = returns[b] as Float64Array;
    let running = 0;
    for (let t = m.length - 1; t >= 0; t--) {
      if (m[t] === 0) continue;
      running = (r[t] as number) + gamma * running;
      g[t] = running;
    }
  }
  return { advantages: maskedWhiten(returns, mask), returns };
}
