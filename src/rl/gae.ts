// PPO's advantages: Generalized Advantage Estimation (Schulman et al. 2016, arXiv 1506.02438)
// over the response tokens, then whitened over the batch, as verl's
// compute_gae_advantage_return. Each response token is one step: the state is everything
// before it, the action is the token.

import { maskedWhiten } from "./masked-whiten.js";
import { checkRows, type Rows, zerosLike } from "./rows.js";

export interface GaeInput {
  tokenLevelRewards: Rows;
  /** The critic's V(s_t): the value of the state before response token t. */
  values: Rows;
  /**
   * The steps GAE runs over and whitens over. Search-R1 passes the response attention mask:
   * every response token, retrieved <information> tokens and invalid-action messages included
   * (compute_advantage in Search-R1 verl/trainer/ppo/ray_trainer.py), so an observation token
   * is an ordinary step with its own V(s_t) and its own discount. Positions outside the mask
   * are skipped (see below).
   */
  mask: Rows;
  /** algorithm.gamma (Search-R1: 1). */
  gamma: number;
  /** algorithm.lam (Search-R1: 1). */
  lam: number;
}

export interface GaeResult {
  /** Whitened advantages, 0 outside the mask. */
  advantages: Float64Array[];
  /** The critic's targets: unwhitened advantages + values, 0 outside the mask. */
  returns: Float64Array[];
}

/**
 * Backwards over each row:
 *   δ_t = r_t + γ·V(s_{t+1}) − V(s_t),   A_t = δ_t + γλ·A_{t+1},   R_t = A_t + V(s_t),
 * with V = 0 and A = 0 after the last step (the episode ends with the response). Then
 * A ← (A − mean)/sqrt(var + 1e-8) over all masked tokens of the batch (unbiased var).
 *
 * A position whose mask is 0 is not a step: the next step's V and A pass through it unchanged
 * (verl's current GAE does this for masks with holes; trailing padding is the common case).
 * With Search-R1's mask, which has no holes, this is plain GAE with V(terminal) = 0.
 *
 * Search-R1's fork (older verl) ran the recursion over the padded width without the mask and
 * took V at the first padding position from the critic (Search-R1
 * verl/trainer/ppo/core_algos.py, compute_gae_advantage_return; the values come from
 * verl/workers/critic/dp_critic.py, DataParallelPPOCritic.compute_values); that adds
 * γ(1 − λ)·V_pad to the last token's advantage, so it equals this one at λ = 1, the value
 * every Search-R1 script uses, and differs only by that padding artefact otherwise.
 */
export function gaeAdvantageReturn(input: GaeInput): GaeResult {
  const { tokenLevelRewards, values, mask, gamma, lam } = input;
  checkRows("tokenLevelRewards", tokenLevelRewards, mask, "mask");
  checkRows("values", values, mask, "mask");
  const raw = zerosLike(mask);
  const returns = zerosLike(mask);
  for (let b = 0; b < mask.length; b++) {
    const m = mask[b] as ArrayLike<number>;
    const r = tokenLevelRewards[b] as ArrayLike<number>;
    const v = values[b] as ArrayLike<number>;
    const a = raw[b] as Float64Array;
    const ret = returns[b] as Float64Array;
    let nextValue = 0;
    let nextAdvantage = 0;
    for (let t = m.length - 1; t >= 0; t--) {
      if (m[t] === 0) continue;
      const value = v[t] as number;
      const delta = (r[t] as number) + gamma * nextValue - value;
      nextAdvantage = delta + gamma * lam * nextAdvantage;
      nextValue = value;
      a[t] = nextAdvantage;
      ret[t] = nextAdvantage + value;
    }
  }
  return { advantages: maskedWhiten(raw, mask), returns };
}
