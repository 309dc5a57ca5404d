import type { Trajectory } from "../agent/trajectory.js";
import type { RewardResult } from "../reward/score.js";

const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

/**
 * What a step's rollouts did, as Search-R1 logs it (`env/*`, `critic/score/mean`,
 * `response_length/mean`) under our names: means per trajectory unless named a ratio.
 */
export function rolloutMetrics(
  trajectories: readonly Trajectory[],
  rewards: readonly RewardResult[],
): Record<string, number> {
  const actions = trajectories.reduce((n, t) => n + t.turns.length, 0);
  const invalid = trajectories.reduce((n, t) => n + t.invalidActions, 0);
  return {
    "reward/mean": mean(rewards.map((r) => r.reward)),
    "em/mean": mean(rewards.map((r) => r.em)),
    "response_length/mean": mean(trajectories.map((t) => t.responseIds.length)),
    "generated_tokens/mean": mean(trajectories.map((t) => t.lossMask.reduce((a, b) => a + b, 0))),
    "turns/mean": mean(trajectories.map((t) => t.turns.length)),
    "searches/mean": mean(trajectories.map((t) => t.searches)),
    "valid_action/ratio": actions ? (actions - invalid) / actions : 0,
    "answer/ratio": mean(trajectories.map((t) => (t.finishReason === "answer" ? 1 : 0))),
    "obs_truncated/count": trajectories.reduce(
      (n, t) => n + t.turns.filter((turn) => turn.observationTruncated).length,
      0,
    ),
  };
}

/**
 * `retriever/<counter>`: what the retriever counted between two readings of its totals
 * (RetrieverClient.counters: a web search retriever's queries, cache hits, calls to the
 * engine, failures), so a run shows what its searches cost step by step; none when either
 * reading is missing.
 */
export function retrieverMetrics(
  before: Record<string, number> | null,
  after: Record<string, number> | null,
): Record<string, number> {
  if (!before || !after) return {};
  return Object.fromEntries(
    Object.keys(after)
      .filter((name) => name in before)
      .map((name) => [`retriever/${name}`, (after[name] as number) - (before[name] as number)]),
  );
}

/**
 * Mean |log p_engine − log p_trainer| over generated tokens: how far the rollout's sampling
 * distribution is from the one the update assumes (bf16 kernels, batching); large values
 * mean the PPO ratio is off before any update.
 */
export function logprobGap(
  trajectories: readonly Trajectory[],
  trainerLogProbs: readonly ArrayLike<number>[],
): number | null {
  let sum = 0;
  let n = 0;
  trajectories.forEach((t, i) => {
    const trainer = trainerLogProbs[i] as ArrayLike<number>;
    t.logprobs.forEach((lp, j) => {
      if (lp === null || t.lossMask[j] !== 1) return;
      sum += Math.abs(lp - (trainer[j] as number));
      n++;
    });
  });
  return n ? sum / n : null;
}
