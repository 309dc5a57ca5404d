import { rm } from "node:fs/promises";
import { join } from "node:path";
import { promptIds } from "../agent/prompt.js";
import { rolloutAll } from "../agent/rollout.js";
import type { AgentSession } from "../agent/session.js";
import { agentSettings } from "../agent/session.js";
import type { Trajectory } from "../agent/trajectory.js";
import type { TrainConfig } from "../config/schemas/train.js";
import type { QaItem } from "../data/qa-items.js";
import { type RewardResult, scoreTrajectory } from "../reward/score.js";
import { computeAdvantages } from "../rl/advantages.js";
import { type KlController, updateKlController } from "../rl/kl-controller.js";
import type { ModelTokenizer } from "../text/model-tokenizer.js";
import type { TrainerProcess } from "../trainer/process.js";
import { logProbRows, updateActorRows, updateCriticRows, valueRows } from "../trainer/rows.js";
import type { DataOrder } from "./data-order.js";
import type { MetricsRow } from "./metrics-log.js";
import { logprobGap, rolloutMetrics } from "./rollout-metrics.js";

/** What one training step works with; `kl` changes from step to step. */
export interface StepContext {
  config: TrainConfig;
  tokenizer: ModelTokenizer;
  session: AgentSession;
  trainer: TrainerProcess;
  order: DataOrder<QaItem>;
  kl: KlController;
  /** Where the policy is exported for the engine (a fresh folder per step). */
  exportsDir: string;
  /** The phase being run, for the live view. */
  onPhase?: (phase: string) => void;
}

/** The sampling seed of trajectory i of a step: a pure function, so a resumed run repeats it. */
export function rolloutSeed(seed: number, step: number, i: number): number {
  return (seed * 7919 + step * 100_003 + i) % 2 ** 31;
}

/**
 * One GRPO or PPO step (docs/train-step.md, whose numbered list the comments below follow):
 * roll out rollout.n trajectories per prompt, score them, get old and reference log-probs
 * (and values) from the trainer, compute advantages, update the actor (and the critic), and
 * load the new policy into the engine. Returns the step's metrics.
 */
export async function trainStep(ctx: StepContext, step: number): Promise<MetricsRow> {
  const { config, tokenizer, trainer } = ctx;
  const { rollout, actor, algorithm } = config;
  const t0 = performance.now();
  const timing: Record<string, number> = {};
  const phase = async <T>(name: string, work: () => Promise<T>): Promise<T> => {
    ctx.onPhase?.(name);
    const start = performance.now();
    try {
      return await work();
    } finally {
      timing[`timing/${name}_s`] = (performance.now() - start) / 1000;
    }
  };

  // 1. Prompts, each repeated rollout.n times next to each other (one GRPO group).
  const { epoch, items } = ctx.order.batch(step);
  const prompts = await Promise.all(items.map((item) => promptIds(tokenizer, item.messages)));
  const group = items.flatMap((item, i) =>
    Array.from({ length: rollout.n }, () => ({ item, promptIds: prompts[i] as number[] })),
  );

  // 2. Rollouts, every trajectory concurrently.
  const settings = agentSettings(config, {
    temperature: rollout.temperature,
    topP: rollout.top_p,
    topK: rollout.top_k,
  });
  const trajectories = await phase("rollout", () =>
    rolloutAll(
      group.map((g, i) => ({
        promptIds: g.promptIds,
        seed: rolloutSeed(config.data.seed, step, i),
      })),
      settings,
      ctx.session.parts(tokenizer.tokenizer),
      { concurrency: group.length, signal: ctx.session.signal },
    ),
  );

  // 3. Rewards.
  const rewards = await phase("reward", () =>
    Promise.all(trajectories.map((t, i) => reward(t, (group[i] as { item: QaItem }).item, ctx))),
  );

  // 4. Old and reference log-probs, values; advantages.
  const sequences = trajectories.map((t) => ({
    promptIds: t.promptIds,
    responseIds: t.responseIds,
  }));
  const responseMask = trajectories.map((t) => new Float32Array(t.responseIds.length).fill(1));
  const lossMask = actor.state_masking
    ? trajectories.map((t) => Float32Array.from(t.lossMask))
    : responseMask;
  const needRef = actor.use_kl_loss || algorithm.use_kl_in_reward;
  const ppo = algorithm.name === "ppo";
  const { old, ref, values } = await phase("log_probs", async () => {
    const old = await logProbRows(trainer, sequences, {
      model: "policy",
      temperature: rollout.temperature,
      micro_batch_size: rollout.log_prob_micro_batch_size,
    });
    const ref = needRef
      ? await logProbRows(trainer, sequences, {
          model: "reference",
          temperature: rollout.temperature,
          micro_batch_size: rollout.log_prob_micro_batch_size,
        })
      : null;
    const values = ppo
      ? await valueRows(trainer, sequences, {
          micro_batch_size: config.critic.ppo_micro_batch_size,
        })
      : null;
    return { old, ref, values };
  });
  const advantages = computeAdvantages(
    {
      uids: group.map((g) => g.item.uid ?? g.item.key),
      scores: rewards.map((r) => r.reward),
      responseMask,
      lossMask,
      oldLogProbs: old.logProbs,
      refLogProbs: ref?.logProbs,
      values: values ?? undefined,
    },
    {
      estimator: algorithm.name === "ppo" ? "gae" : algorithm.name,
      gamma: algorithm.gamma,
      lam: algorithm.lam,
      normAdvByStdInGrpo: algorithm.norm_adv_by_std_in_grpo,
      klInReward: algorithm.use_kl_in_reward
        ? { estimator: algorithm.kl_penalty, klCoef: ctx.kl.value }
        : undefined,
    },
  );

  // 5. Updates: the critic first (on the rollout's values), as verl does, then the actor.
  const longest = Math.max(...sequences.map((s) => s.promptIds.length + s.responseIds.length));
  const critic = values
    ? await phase("update_critic", () =>
        updateCriticRows(
          trainer,
          sequences,
          { responseMask, values, returns: advantages.returns },
          {
            ppo_mini_batch_size: actor.ppo_mini_batch_size * rollout.n,
            ppo_epochs: actor.ppo_epochs,
            ppo_max_token_len_per_gpu: config.critic.ppo_micro_batch_size * longest,
            cliprange_value: config.critic.cliprange_value,
            loss_agg_mode: actor.loss_agg_mode,
          },
        ),
      )
    : null;
  const update = await phase("update_actor", () =>
    updateActorRows(
      trainer,
      sequences,
      {
        lossMask,
        oldLogProbs: old.logProbs,
        advantages: advantages.advantages,
        refLogProbs: actor.use_kl_loss ? ref?.logProbs : undefined,
      },
      {
        ppo_mini_batch_size: actor.ppo_mini_batch_size * rollout.n,
        ppo_epochs: actor.ppo_epochs,
        ppo_max_token_len_per_gpu: actor.ppo_micro_batch_size * longest,
        clip_ratio: actor.clip_ratio,
        kl_loss_type: actor.kl_loss_type,
        kl_loss_coef: actor.use_kl_loss ? actor.kl_loss_coef : 0,
        entropy_coeff: actor.entropy_coeff,
        loss_agg_mode: actor.loss_agg_mode,
        temperature: rollout.temperature,
      },
    ),
  );
  const klCoef = ctx.kl.value;
  if (algorithm.use_kl_in_reward && advantages.currentKl !== undefined) {
    ctx.kl = updateKlController(ctx.kl, advantages.currentKl, trajectories.length);
  }

  // 6. The new policy into the engine, without restarting it.
  await phase("update_weights", () => pushWeights(ctx, step));

  const generated = trajectories.reduce((n, t) => n + t.lossMask.reduce((a, b) => a + b, 0), 0);
  const seconds = (performance.now() - t0) / 1000;
  return {
    step,
    epoch,
    ...rolloutMetrics(trajectories, rewards),
    "rollout/logprob_gap": logprobGap(trajectories, old.logProbs),
    ...prefixed("actor", update),
    ...(critic ? prefixed("critic", critic) : {}),
    ...(algorithm.use_kl_in_reward
      ? { "algorithm/kl_coef": klCoef, "algorithm/kl": advantages.currentKl ?? null }
      : {}),
    ...timing,
    "timing/step_s": seconds,
    "throughput/generated_tokens_per_s":
      generated / Math.max(timing["timing/rollout_s"] ?? seconds, 1e-9),
  };
}

async function reward(
  trajectory: Trajectory,
  item: QaItem,
  ctx: StepContext,
): Promise<RewardResult> {
  const { reward: config } = ctx.config;
  const tokenizer = ctx.tokenizer.tokenizer;
  const [responseText, promptText] = await Promise.all([
    tokenizer.decode(trajectory.responseIds, true),
    config.search_r1_extract ? tokenizer.decode(trajectory.promptIds, false) : "",
  ]);
  return scoreTrajectory({ promptText, responseText, golds: item.golds }, config);
}

/** Exports the policy and has the engine load it; the previous export is removed. */
export async function pushWeights(ctx: StepContext, step: number): Promise<void> {
  const out = join(ctx.exportsDir, `step_${step}`);
  await ctx.trainer.exportPolicy({ out, dtype: "fp32" });
  const engine = ctx.session.engine;
  if (!engine.updateWeightsFromDisk) {
    throw new Error("the engine cannot load weights from disk");
  }
  await engine.updateWeightsFromDisk(out);
  await rm(join(ctx.exportsDir, `step_${step - 1}`), { recursive: true, force: true });
}

/** The trainer's reply as metrics: `actor/pg_loss`, ...; counts and steps left out. */
function prefixed(prefix: string, reply: object): Record<string, number | null> {
  const skip = new Set(["optimizer_steps", "micro_batches", "global_step", "tokens"]);
  return Object.fromEntries(
    Object.entries(reply)
      .filter(([k]) => !skip.has(k))
      .map(([k, v]) => [`${prefix}/${k}`, v as number | null]),
  );
}
