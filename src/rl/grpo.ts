// GRPO's outcome advantage (Shao et al. 2024, arXiv 2402.03300, §4.1.2 "outcome supervision"),
// as verl's compute_grpo_outcome_advantage computes it, and Dr. GRPO (Liu et al. 2025,
// arXiv 2503.20783), which drops the division by the group's std.

import { groupByUid, maskedRowSums } from "./groups.js";
import { type Rows, zerosLike } from "./rows.js";

export interface GrpoInput {
  tokenLevelRewards: Rows;
  /**
   * Tokens the advantage is broadcast over. Search-R1 broadcasts over the response attention
   * mask, retrieved tokens included (compute_advantage in Search-R1
   * verl/trainer/ppo/ray_trainer.py); the loss mask then keeps those out of the policy loss,
   * so either mask gives the same update.
   */
  responseMask: Rows;
  /** The prompt's unique id per trajectory (extra_info.uid, never extra_info.index). */
  uids: readonly string[];
  /** algorithm.norm_adv_by_std_in_grpo: true = GRPO, false = Dr. GRPO. */
  normAdvByStd?: boolean;
  epsilon?: number;
}

/**
 * A_i = (R_i − mean_g) / (std_g + ε) on every response token of trajectory i, where R_i is its
 * total reward and mean_g, std_g are over the trajectories of its group g; std_g is the
 * unbiased (n−1) estimate, as torch.std computes it in verl (and in Search-R1's fork). With
 * normAdvByStd false: A_i = R_i − mean_g.
 *
 * Edge cases, as verl: a group whose rewards are all equal has std 0 and gets A = 0 (the
 * numerator is exactly 0). A group of one takes mean 0 and std 1, so its trajectory gets
 * R/(1 + ε) (R with Dr. GRPO): not 0 — with n = 1 GRPO falls back to REINFORCE on the raw
 * reward rather than learning nothing.
 *
 * GRPO's advantage is also its "returns" in verl (no critic reads them).
 */
export function grpoOutcomeAdvantage(input: GrpoInput): Float64Array[] {
  const { tokenLevelRewards, responseMask, uids, normAdvByStd = true, epsilon = 1e-6 } = input;
  if (uids.length !== responseMask.length) {
    throw new Error(`uids: ${uids.length} values, but responseMask has ${responseMask.length}`);
  }
  const scores = maskedRowSums(tokenLevelRewards, responseMask);
  const scalar = new Float64Array(scores.length);
  for (const members of groupByUid(uids)) {
    const n = members.length;
    let mean = 0;
    let std = 1;
    if (n > 1) {
      for (const b of members) mean += scores[b] as number;
      mean /= n;
      let sq = 0;
      for (const b of members) sq += ((scores[b] as number) - mean) ** 2;
      std = Math.sqrt(sq / (n - 1));
    }
    for (const b of members) {
      const centred = (scores[b] as number) - mean;
      scalar[b] = normAdvByStd ? centred / (std + epsilon) : centred;
    }
  }
  return broadcast(scalar, responseMask);
}

/** One scalar per trajectory on every token where the mask is 1. */
export function broadcast(scalar: ArrayLike<number>, mask: Rows): Float64Array[] {
  const out = zerosLike(mask);
  for (let b = 0; b < mask.length; b++) {
    const m = mask[b] as ArrayLike<number>;
    const o = out[b] as Float64Array;
    for (let t = 0; t < m.length; t++) if (m[t] !== 0) o[t] = scalar[b] as number;
  }
  return out;
}
