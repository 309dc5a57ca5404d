// DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, §3.2 and Algorithm 1): a group
// whose trajectories all score the same has advantage 0 for every member under GRPO, so it
// adds nothing to the gradient but noise in the batch size; DAPO drops such groups and keeps
// sampling prompts until the batch holds train_batch_size groups that do carry a signal. As
// verl's DAPO recipe does it (algorithm.filter_groups.{enable,metric,max_num_gen_batches};
// RayDAPOTrainer.fit in recipe/dapo/dapo_ray_trainer.py, volcengine/verl before the recipes
// moved to verl-recipe, 2026-01; docs/algo/dapo.md): a group is kept when the std of its
// metric is above 0 or it has one member.

import { groupByUid } from "./groups.js";

export interface GroupFilter {
  /** Per trajectory: whether its group is kept. */
  keep: boolean[];
  /** The kept groups' uids, in first-seen order. */
  keptUids: string[];
  /** How many groups there were, and how many were dropped. */
  groups: number;
  dropped: number;
}

/**
 * Keeps the groups (trajectories of one prompt, by uid) whose metric values are not all equal,
 * and the groups of one. verl tests np.std(values) > 0; for values that are all equal that std
 * is 0 except for float rounding of the mean (np.std([0.1, 0.1, 0.1]) is 1.4e-17 and verl keeps
 * that group); here equal values are equal, whatever rounding the mean would have.
 */
export function filterGroups(uids: readonly string[], values: readonly number[]): GroupFilter {
  if (uids.length !== values.length) {
    throw new Error(`uids: ${uids.length} values, but the metric has ${values.length}`);
  }
  const keep = new Array<boolean>(uids.length).fill(false);
  const keptUids: string[] = [];
  const groups = groupByUid(uids);
  for (const members of groups) {
    const first = values[members[0] as number] as number;
    const varies = members.some((b) => (values[b] as number) !== first);
    if (members.length === 1 || varies) {
      for (const b of members) keep[b] = true;
      keptUids.push(uids[members[0] as number] as string);
    }
  }
  return { keep, keptUids, groups: groups.length, dropped: groups.length - keptUids.length };
}
