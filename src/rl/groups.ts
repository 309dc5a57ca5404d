// Trajectories grouped by the prompt they answer, for GRPO and RLOO.

import { checkRows, type Rows } from "./rows.js";

/**
 * Row indices per group, in first-seen order. The key is the prompt's unique id
 * (extra_info.uid from searchr1 preprocess: "<source>-<split>-<index>"). Search-R1 grouped by
 * extra_info.index, which restarts at 0 in every data source, so an nq and a hotpotqa prompt
 * with the same index were normalised together (Search-R1 verl/trainer/ppo/ray_trainer.py,
 * RayPPOTrainer.fit: `uid = non_tensor_batch['index']`); uid does not collide. Rows of a
 * group need not be adjacent.
 */
export function groupByUid(uids: readonly string[]): number[][] {
  const groups = new Map<string, number[]>();
  uids.forEach((uid, b) => {
    const members = groups.get(uid);
    if (members) members.push(b);
    else groups.set(uid, [b]);
  });
  return [...groups.values()];
}

/**
 * Each trajectory's total reward: Σ of its token rewards over the mask (verl sums the whole
 * row, token_level_rewards.sum(-1); the rewards built by token-rewards.ts are 0 outside the
 * response mask, so the two agree, and stray values in padding are ignored here).
 */
export function maskedRowSums(rows: Rows, mask: Rows): number[] {
  checkRows("tokenLevelRewards", rows, mask, "responseMask");
  return rows.map((row, b) => {
    const m = mask[b] as ArrayLike<number>;
    let s = 0;
    for (let t = 0; t < row.length; t++) if (m[t] !== 0) s += row[t] as number;
    return s;
  });
}
