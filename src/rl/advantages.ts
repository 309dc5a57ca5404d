// One step's rewards-to-advantages for the train controller: scores on the last token, the
// optional in-reward KL, then the chosen estimator. This is where the masks are chosen, each
// as Search-R1 chose it with state masking on (apply_kl_penalty and compute_advantage in
// Search-R1 verl/trainer/ppo/ray_trainer.py; docs/rl-algorithms.md, "Which tokens count"):
//   - KL in the reward: loss mask (Search-R1's info_mask: retrieved tokens pay no KL).
//   - score position, GAE steps, GAE/REINFORCE++ whitening, GRPO/RLOO broadcast: response
//     mask (Search-R1's attention_mask: retrieved tokens count as ordinary steps).
//   - policy loss, entropy, KL loss: loss mask — applied by the trainer, not here.
//   - critic loss: the trainer's business; Search-R1 masks it with the response mask shifted
//     by one position (Search-R1 verl/workers/critic/dp_critic.py, DataParallelPPOCritic:
//     attention_mask[:, -L-1:-1]; see src/trainer/rows.ts).

import { gaeAdvantageReturn } from "./gae.js";
import { grpoOutcomeAdvantage } from "./grpo.js";
import type { KlEstimator } from "./kl.js";
import { reinforcePlusPlusOutcomeAdvantage } from "./reinforce-plus-plus.js";
import { rlooOutcomeAdvantage } from "./rloo.js";
import { checkRows, type Rows } from "./rows.js";
import { applyKlPenalty, tokenLevelScores } from "./token-rewards.js";

/** verl's adv_estimator names; algorithm.name "ppo" is "gae". */
export type AdvantageEstimator = "grpo" | "gae" | "reinforce_plus_plus" | "rloo";

export interface StepBatch {
  /** The prompt's unique id per trajectory (extra_info.uid). */
  uids: readonly string[];
  /** One outcome score per trajectory (exact match, or the format reward). */
  scores: readonly number[];
  /** 1 on every response token, generated or retrieved; 0 only on padding. */
  responseMask: Rows;
  /**
   * 1 on generated tokens, 0 on retrieved <information> blocks and invalid-action messages.
   * Without state masking (actor.state_masking false) pass the response mask. (Search-R1
   * uses info_mask for the in-reward KL even then; a run without state masking here has
   * retrieved tokens pay KL too.)
   */
  lossMask: Rows;
  /** Needed with KL in the reward. */
  oldLogProbs?: Rows;
  refLogProbs?: Rows;
  /** The critic's V(s_t); needed for gae. */
  values?: Rows;
}

export interface AdvantageOptions {
  estimator: AdvantageEstimator;
  /** algorithm.gamma (gae, reinforce_plus_plus). */
  gamma?: number;
  /** algorithm.lam (gae). */
  lam?: number;
  /** algorithm.norm_adv_by_std_in_grpo (grpo). */
  normAdvByStdInGrpo?: boolean;
  /** With algorithm.use_kl_in_reward: the estimator and β (the KL controller's value now). */
  klInReward?: { estimator: KlEstimator; klCoef: number };
}

export interface AdvantageResult {
  tokenLevelScores: Float64Array[];
  tokenLevelRewards: Float64Array[];
  advantages: Float64Array[];
  /** Critic targets for gae; for the other estimators what verl calls returns. */
  returns: Float64Array[];
  /** Batch KL for the KL controller and metrics; present with klInReward. */
  currentKl?: number;
}

export function computeAdvantages(batch: StepBatch, opts: AdvantageOptions): AdvantageResult {
  const { uids, responseMask, lossMask } = batch;
  checkRows("lossMask", lossMask, responseMask, "responseMask");
  const scores = tokenLevelScores(batch.scores, responseMask);
  let rewards = scores;
  let currentKl: number | undefined;
  if (opts.klInReward) {
    if (!batch.oldLogProbs || !batch.refLogProbs) {
      throw new Error("KL in the reward needs oldLogProbs and refLogProbs");
    }
    const penalised = applyKlPenalty({
      tokenLevelScores: scores,
      oldLogProbs: batch.oldLogProbs,
      refLogProbs: batch.refLogProbs,
      mask: lossMask,
      estimator: opts.klInReward.estimator,
      klCoef: opts.klInReward.klCoef,
    });
    rewards = penalised.tokenLevelRewards;
    currentKl = penalised.currentKl;
  }
  const gamma = opts.gamma ?? 1;
  let advantages: Float64Array[];
  let returns: Float64Array[];
  switch (opts.estimator) {
    case "grpo":
      advantages = grpoOutcomeAdvantage({
        tokenLevelRewards: rewards,
        responseMask,
        uids,
        normAdvByStd: opts.normAdvByStdInGrpo ?? true,
      });
      returns = advantages;
      break;
    case "rloo":
      advantages = rlooOutcomeAdvantage({ tokenLevelRewards: rewards, responseMask, uids });
      returns = advantages;
      break;
    case "gae": {
      if (!batch.values) throw new Error("gae needs the critic's values");
      ({ advantages, returns } = gaeAdvantageReturn({
        tokenLevelRewards: rewards,
        values: batch.values,
        mask: responseMask,
        gamma,
        lam: opts.lam ?? 1,
      }));
      break;
    }
    case "reinforce_plus_plus":
      ({ advantages, returns } = reinforcePlusPlusOutcomeAdvantage({
        tokenLevelRewards: rewards,
        mask: responseMask,
        gamma,
      }));
      break;
    default:
      throw new Error(`advantage estimator: unknown ${String(opts.estimator)}`);
  }
  return {
    tokenLevelScores: scores,
    tokenLevelRewards: rewards,
    advantages,
    returns,
    ...(currentKl === undefined ? {} : { currentKl }),
  };
}
