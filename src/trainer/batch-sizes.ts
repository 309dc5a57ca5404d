import type { TrainConfig } from "../config/schemas/train.js";
import { UsageError } from "../runtime/errors.js";

/**
 * verl's batch arithmetic, as its workers normalise their config (verl
 * verl/workers/fsdp_workers.py, ActorRolloutRefWorker.__init__ and CriticWorker.__init__;
 * Search-R1 verl/workers/fsdp_workers.py, the same with rollout.n_agent): the mini- and
 * micro-batch sizes of a config are global, over all data-parallel ranks, and each rank takes
 * its share. `ppo_mini_batch_size` counts prompts and is multiplied by `rollout.n`; Search-R1's
 * `rollout.n_agent` repeats the prompts before the rollouts instead, so its mini-batch counts
 * trajectories. The `*_per_gpu` sizes are per rank, taken as given. Where verl asserts that a
 * rank's mini-batch is a multiple of its micro-batch, a micro-batch here is a token budget
 * (the trainer packs by tokens), so a last, smaller micro-batch is allowed: small runs need it.
 */
export interface BatchSizes {
  /** Trajectories per prompt: one GRPO group (n × n_agent). */
  group: number;
  /** Trajectories a step generates (train_batch_size × group). */
  trajectories: number;
  /** The actor's optimizer steps per training step (each mini-batch, every epoch). */
  optimizerSteps: number;
  actor: UpdateBatching;
  /** PPO's critic; null for the other algorithms. */
  critic: UpdateBatching | null;
  /** The passes of the old log-probs, the reference's and the critic's values. */
  policyLogProbs: PassBatching;
  refLogProbs: PassBatching;
  values: PassBatching | null;
}

/** One learner's updates: trajectories per optimizer step over all ranks, micro-batches per rank. */
export interface UpdateBatching {
  miniBatch: number;
  epochs: number;
  /** Trajectories per micro-batch on a rank, or null with a token budget. */
  microPerRank: number | null;
  /** Real tokens per micro-batch on a rank (verl's use_dynamic_bsz), or null. */
  tokensPerRank: number | null;
}

/** A forward pass over the step's trajectories: trajectories per pass on a rank, or a token budget. */
export interface PassBatching {
  microPerRank: number | null;
  tokensPerRank: number | null;
}

/** The sizes of a run of `ranks` data-parallel ranks; refused where verl asserts. */
export function batchSizes(config: TrainConfig, ranks: number): BatchSizes {
  const { actor, critic, rollout, ref, data } = config;
  const ppo = config.algorithm.name === "ppo";
  const group = rollout.n * rollout.n_agent;
  const trajectories = data.train_batch_size * group;
  const actorMini = actor.ppo_mini_batch_size * rollout.n;
  const criticMini = (critic.ppo_mini_batch_size ?? actor.ppo_mini_batch_size) * rollout.n;
  const update = (
    learner: "actor" | "critic",
    mini: number,
    micro: number | null,
    perGpu: number | null,
    dynamic: boolean,
    tokens: number,
  ): UpdateBatching => {
    divide(`${learner}.ppo_mini_batch_size × rollout.n (${mini})`, mini, ranks);
    const microPerRank = dynamic
      ? null
      : (perGpu ?? divide(`${learner}.ppo_micro_batch_size`, need(micro, learner), ranks));
    return {
      miniBatch: mini,
      epochs: actor.ppo_epochs,
      microPerRank,
      tokensPerRank: dynamic ? tokens : null,
    };
  };
  const pass = (
    key: string,
    micro: number | null,
    perGpu: number | null,
    dynamic: boolean,
    tokens: number,
  ): PassBatching =>
    dynamic
      ? { microPerRank: null, tokensPerRank: tokens }
      : { microPerRank: perGpu ?? divide(key, need(micro, key), ranks), tokensPerRank: null };
  const criticDynamic = critic.use_dynamic_bsz ?? actor.use_dynamic_bsz;
  const policyDynamic = rollout.log_prob_use_dynamic_bsz ?? actor.use_dynamic_bsz;
  const policyTokens = rollout.log_prob_max_token_len_per_gpu ?? actor.ppo_max_token_len_per_gpu;
  return {
    group,
    trajectories,
    optimizerSteps: Math.ceil(trajectories / actorMini) * actor.ppo_epochs,
    actor: update(
      "actor",
      actorMini,
      actor.ppo_micro_batch_size,
      actor.ppo_micro_batch_size_per_gpu,
      actor.use_dynamic_bsz,
      actor.ppo_max_token_len_per_gpu,
    ),
    critic: !ppo
      ? null
      : update(
          "critic",
          criticMini,
          critic.ppo_micro_batch_size,
          critic.ppo_micro_batch_size_per_gpu,
          criticDynamic,
          critic.ppo_max_token_len_per_gpu,
        ),
    policyLogProbs: pass(
      "rollout.log_prob_micro_batch_size",
      rollout.log_prob_micro_batch_size,
      rollout.log_prob_micro_batch_size_per_gpu,
      policyDynamic,
      policyTokens,
    ),
    refLogProbs: pass(
      "ref.log_prob_micro_batch_size",
      ref.log_prob_micro_batch_size ?? rollout.log_prob_micro_batch_size,
      ref.log_prob_micro_batch_size_per_gpu ?? rollout.log_prob_micro_batch_size_per_gpu,
      ref.log_prob_use_dynamic_bsz ?? policyDynamic,
      ref.log_prob_max_token_len_per_gpu ?? policyTokens,
    ),
    values: !ppo
      ? null
      : pass(
          "critic.ppo_micro_batch_size",
          critic.ppo_micro_batch_size,
          critic.ppo_micro_batch_size_per_gpu,
          criticDynamic,
          critic.forward_max_token_len_per_gpu ?? critic.ppo_max_token_len_per_gpu,
        ),
  };
}

/**
 * A micro-batch's real-token budget on a rank for the trainer (`ppo_max_token_len_per_gpu`):
 * the budget itself, or that many of the step's longest trajectories.
 */
export function updateTokens(b: UpdateBatching, longest: number): number {
  return b.tokensPerRank ?? (b.microPerRank as number) * longest;
}

/**
 * Trajectories per forward pass on a rank for the trainer (`micro_batch_size`): a token budget
 * holds ⌊budget ÷ the longest trajectory⌋ of them (at least one).
 */
export function passSize(b: PassBatching, longest: number): number {
  return b.microPerRank ?? Math.max(1, Math.floor((b.tokensPerRank as number) / longest));
}

/** A global size's share of one rank, refused when the ranks cannot share it evenly. */
function divide(key: string, size: number, ranks: number): number {
  if (size % ranks !== 0) {
    throw new UsageError(
      `${key} is a global size, divided by the ${ranks} data-parallel ranks (trainer.gpus × trainer.nnodes), and ${size} is not a multiple of ${ranks}: change it, or give the per-rank size (*_per_gpu)`,
    );
  }
  return size / ranks;
}

function need(size: number | null, key: string): number {
  if (size === null) {
    throw new UsageError(`${key} is null: set it, its *_per_gpu size, or use_dynamic_bsz`);
  }
  return size;
}
