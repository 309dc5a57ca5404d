// RLOO, REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740),
// as verl's compute_rloo_outcome_advantage computes it.

import { groupByUid, maskedRowSums } from "./groups.js";
import { broadcast } from "./grpo.js";
import type { Rows } from "./rows.js";

export interface RlooInput {
  tokenLevelRewards: Rows;
  /** Tokens the advantage is broadcast over (the response mask, as for GRPO). */
  responseMask: Rows;
  /** The prompt's unique id per trajectory (extra_info.uid). */
  uids: readonly string[];
}

/**
 * A_i = R_i − (Σ_{j≠i} R_j)/(n − 1): the baseline of each trajectory is the mean reward of the
 * other n − 1 of its group, which is the same as (R_i − mean_g)·n/(n − 1). Unlike GRPO there
 * is no division by a std. A group of one has no other trajectory and keeps its raw reward
 * (verl: baseline 0). Broadcast over the response tokens; also the "returns" in verl.
 */
export function rlooOutcomeAdvantage(input: RlooInput): Float64Array[] {
  const { tokenLevelRewards, responseMask, uids } = input;
  if (uids.length !== responseMask.length) {
    throw new Error(`uids: ${uids.length} values, but responseMask has ${responseMask.length}`);
  }
  const scores = maskedRowSums(tokenLevelRewards, responseMask);
  const scalar = Float64Array.from(scores);
  for (const members of groupByUid(uids)) {
    const n = members.length;
    if (n < 2) continue;
    let sum = 0;
    for (const b of members) sum += scores[b] as number;
    for (const b of members) {
      const r = scores[b] as number;
      scalar[b] = r - (sum - r) / (n - 1);
    }
  }
  return broadcast(scalar, responseMask);
}
