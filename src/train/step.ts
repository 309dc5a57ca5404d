import { readdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { promptIds } from "../agent/prompt.js";
import { type AgentSettings, rolloutAll } from "../agent/rollout.js";
import type { AgentSession } from "../agent/session.js";
import { agentSettings } from "../agent/session.js";
import type { Trajectory } from "../agent/trajectory.js";
import type { TrainConfig } from "../config/schemas/train.js";
import type { QaItem } from "../data/qa-items.js";
import { EngineRouter } from "../engine/client/router.js";
import { type RewardResult, scoreTrajectory } from "../reward/score.js";
import { computeAdvantages } from "../rl/advantages.js";
import { filterGroups } from "../rl/filter-groups.js";
import { type KlController, updateKlController } from "../rl/kl-controller.js";
import { overlongPenalty } from "../rl/overlong-reward.js";
import { parseRolloutRs, rolloutCorrection } from "../rl/rollout-correction.js";
import { InputError } from "../runtime/errors.js";
import type { ModelTokenizer } from "../text/model-tokenizer.js";
import type { MetricsRow } from "../tracking/metrics-log.js";
import { type BatchSizes, passSize, updateTokens } from "../trainer/batch-sizes.js";
import { logProbRows, updateActorRows, updateCriticRows, valueRows } from "../trainer/rows.js";
import type { Trainer } from "../trainer/trainer.js";
import type { DataOrder } from "./data-order.js";
import { POLICY_ADAPTER } from "./lora.js";
import type { NodeExports } from "./nodes.js";
import { logprobGap, retrieverMetrics, rolloutMetrics } from "./rollout-metrics.js";

/** What one training step works with; `kl` changes from step to step. */
export interface StepContext {
  config: TrainConfig;
  tokenizer: ModelTokenizer;
  session: AgentSession;
  trainer: Trainer;
  order: DataOrder<QaItem>;
  kl: KlController;
  /** The step's batch arithmetic over the run's ranks (verl's). */
  batches: BatchSizes;
  /**
   * Generation batches of prompts drawn before this step (data order position): one per step,
   * more with dynamic sampling (algorithm.filter_groups), which draws until the step's
   * batch is full. Saved in the checkpoint; a step moves it on.
   */
  genBatches: number;
  /** Where the policy is exported for the engine (a fresh folder per step). */
  exportsDir: string;
  /**
   * LoRA is on: each push exports the adapter alone and the engine serves it unmerged, as
   * POLICY_ADAPTER, which rollouts name; `adapterLoaded` once the engine holds one.
   */
  lora?: { adapterLoaded: boolean };
  /** On several nodes with engine replicas: each node's copy of the weights (train/nodes.ts). */
  nodeExports?: NodeExports;
  /** The phase being run, for the live view. */
  onPhase?: (phase: string) => void;
}

/** The sampling seed of trajectory i of a step: a pure function, so a resumed run repeats it. */
export function rolloutSeed(seed: number, step: number, i: number): number {
  return (seed * 7919 + step * 100_003 + i) % 2 ** 31;
}

/** A trajectory of a step with its prompt and its scores. */
interface Drawn {
  item: QaItem;
  trajectory: Trajectory;
  reward: RewardResult;
  /** DAPO's overlong penalty (reward.overlong_buffer; 0 when off). */
  overlong: number;
}

const uidOf = (item: QaItem) => item.uid ?? item.key;

/**
 * One GRPO or PPO step (docs/train-step.md, whose numbered list the comments below follow):
 * roll out rollout.n × rollout.n_agent trajectories per prompt, score them, get old and reference log-probs
 * (and values) from the trainer, compute advantages, update the actor (and the critic), and
 * load the new policy into the engine. Returns the step's metrics.
 */
export async function trainStep(ctx: StepContext, step: number): Promise<MetricsRow> {
  const { config, trainer, batches } = ctx;
  const { rollout, actor, algorithm } = config;
  const t0 = performance.now();
  const timing: Record<string, number> = {};
  const phase = async <T>(name: string, work: () => Promise<T>): Promise<T> => {
    ctx.onPhase?.(name);
    const start = performance.now();
    try {
      return await work();
    } finally {
      const key = `timing/${name}_s`;
      timing[key] = (timing[key] ?? 0) + (performance.now() - start) / 1000;
    }
  };

  // 1–3. Prompts, rollouts, rewards; with dynamic sampling, again until the batch is full.
  // A web search retriever's counters are read around them: what this step's searches cost.
  const searchesBefore = await ctx.session.retriever.counters();
  const drawn = await drawBatch(ctx, step, phase);
  const searchesAfter = searchesBefore && (await ctx.session.retriever.counters());
  const { kept } = drawn;
  // rollout.free_cache_engine: the engine's KV cache goes back to the device while the
  // trainer works, and is taken again once the new weights are in (step 6).
  const engine = ctx.session.engine;
  const freeCache =
    config.rollout.free_cache_engine &&
    ctx.session.startedEngine &&
    engine.releaseMemoryOccupation !== undefined;
  if (freeCache) await engine.releaseMemoryOccupation?.();
  const trajectories = kept.map((d) => d.trajectory);

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
  const longest = Math.max(...sequences.map((s) => s.promptIds.length + s.responseIds.length));
  const { old, ref, values } = await phase("log_probs", async () => {
    const old = await logProbRows(trainer, sequences, {
      model: "policy",
      temperature: rollout.temperature,
      micro_batch_size: passSize(batches.policyLogProbs, longest),
    });
    const ref = needRef
      ? await logProbRows(trainer, sequences, {
          model: "reference",
          temperature: rollout.temperature,
          micro_batch_size: passSize(batches.refLogProbs, longest),
        })
      : null;
    const values = batches.values
      ? await valueRows(trainer, sequences, {
          micro_batch_size: passSize(batches.values, longest),
        })
      : null;
    return { old, ref, values };
  });
  const advantages = computeAdvantages(
    {
      uids: kept.map((d) => uidOf(d.item)),
      scores: kept.map((d) => d.reward.reward + d.overlong),
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

  // Rollout correction (algorithm.rollout_correction), after the advantages as in verl: IS
  // weights and rejection for the actor's loss from the trainer's and the engine's log-probs
  // of the generated tokens; the mismatch is logged whenever the engine gave its log-probs.
  const correction = correct(config, trajectories, old.logProbs, lossMask);

  // 5. Updates: the critic first (on the rollout's values), as verl does, then the actor.
  const criticBatches = batches.critic;
  const critic =
    values && criticBatches
      ? await phase("update_critic", () =>
          updateCriticRows(
            trainer,
            sequences,
            { responseMask, values, returns: advantages.returns },
            {
              ppo_mini_batch_size: criticBatches.miniBatch,
              ppo_epochs: criticBatches.epochs,
              ppo_max_token_len_per_gpu: updateTokens(criticBatches, longest),
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
        lossMask: correction.lossMask,
        oldLogProbs: old.logProbs,
        advantages: advantages.advantages,
        refLogProbs: actor.use_kl_loss ? ref?.logProbs : undefined,
        rolloutIsWeights: correction.weights,
      },
      {
        ppo_mini_batch_size: batches.actor.miniBatch,
        ppo_epochs: batches.actor.epochs,
        ppo_max_token_len_per_gpu: updateTokens(batches.actor, longest),
        clip_ratio: actor.clip_ratio,
        clip_ratio_low: actor.clip_ratio_low ?? actor.clip_ratio,
        clip_ratio_high: actor.clip_ratio_high ?? actor.clip_ratio,
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
  let pushed = 0;
  await phase("update_weights", async () => {
    pushed = await pushWeights(ctx, step);
    if (freeCache) await engine.resumeMemoryOccupation?.();
  });

  // With dynamic sampling the rollout metrics cover every trajectory the step generated (what
  // the policy does); the update saw the kept groups.
  const all = drawn.all;
  const generated = all.reduce((n, d) => n + d.trajectory.lossMask.reduce((a, b) => a + b, 0), 0);
  const seconds = (performance.now() - t0) / 1000;
  return {
    step,
    epoch: drawn.epoch,
    ...rolloutMetrics(
      all.map((d) => d.trajectory),
      all.map((d) => ({ ...d.reward, reward: d.reward.reward + d.overlong })),
    ),
    ...retrieverMetrics(searchesBefore, searchesAfter),
    ...(config.reward.overlong_buffer.enable
      ? {
          "reward/overlong_penalty/mean": mean(all.map((d) => d.overlong)),
          "reward/overlong/ratio": mean(all.map((d) => (d.overlong < 0 ? 1 : 0))),
        }
      : {}),
    ...(algorithm.filter_groups.enable
      ? {
          "train/num_gen_batches": drawn.rounds,
          "train/filtered_group_ratio": drawn.groups ? drawn.dropped / drawn.groups : 0,
        }
      : {}),
    "rollout/logprob_gap": logprobGap(trajectories, old.logProbs),
    ...correction.metrics,
    ...prefixed("actor", update),
    ...(critic ? prefixed("critic", critic) : {}),
    ...(algorithm.use_kl_in_reward
      ? { "algorithm/kl_coef": klCoef, "algorithm/kl": advantages.currentKl ?? null }
      : {}),
    ...timing,
    "timing/step_s": seconds,
    "throughput/generated_tokens_per_s":
      generated / Math.max(timing["timing/rollout_s"] ?? seconds, 1e-9),
    "update_weights/bytes": pushed,
  };
}

const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

/**
 * Steps 1–3: the step's prompts, each rolled out n × n_agent times (one group), scored. With
 * algorithm.filter_groups (DAPO's dynamic sampling, as verl's DAPO recipe: RayDAPOTrainer.fit)
 * the groups whose metric is the same for every trajectory are dropped and further
 * generation batches of train_batch_size prompts are drawn, in data order, until
 * train_batch_size groups are kept (the first ones kept; a prompt already kept this step is
 * not taken twice), at most max_num_gen_batches of them when that is positive.
 */
async function drawBatch(
  ctx: StepContext,
  step: number,
  phase: <T>(name: string, work: () => Promise<T>) => Promise<T>,
): Promise<{
  kept: Drawn[];
  all: Drawn[];
  epoch: number;
  rounds: number;
  groups: number;
  dropped: number;
}> {
  const { config } = ctx;
  const filter = config.algorithm.filter_groups;
  const max = filter.enable ? filter.max_num_gen_batches : 1;
  const wanted = config.data.train_batch_size;
  const kept: Drawn[] = [];
  const all: Drawn[] = [];
  const keptUids = new Set<string>();
  let [rounds, groups, dropped, epoch] = [0, 0, 0, 0];
  for (;;) {
    const batch = ctx.order.batch(ctx.genBatches + rounds + 1);
    epoch = batch.epoch;
    const drawn = await generate(ctx, step, rounds, batch.items, phase);
    rounds++;
    all.push(...drawn);
    if (!filter.enable) {
      kept.push(...drawn);
      break;
    }
    const uids = drawn.map((d) => uidOf(d.item));
    const f = filterGroups(
      uids,
      drawn.map((d) => filterMetric(d, filter.metric)),
    );
    groups += f.groups;
    dropped += f.dropped;
    for (const uid of f.keptUids) {
      if (keptUids.size === wanted || keptUids.has(uid)) continue;
      keptUids.add(uid);
      drawn.forEach((d, i) => {
        if (uids[i] === uid) kept.push(d);
      });
    }
    if (keptUids.size === wanted) break;
    // verl: "if max_num_gen_batches <= 0 or num_gen_batches < max_num_gen_batches: continue"
    if (max > 0 && rounds >= max) {
      throw new InputError(
        `algorithm.filter_groups.max_num_gen_batches=${max}: step ${step} drew ${rounds} batches of ` +
          `${wanted} prompts and kept ${keptUids.size} of the ${wanted} groups it needs (a group is ` +
          `kept when its ${filter.metric} differs between its trajectories); the data may be too ` +
          "hard or too easy for the policy: raise the limit, or set it to 0 for no limit",
      );
    }
  }
  ctx.genBatches += rounds;
  return { kept, all, epoch, rounds, groups, dropped };
}

/** One generation batch: prompts × group trajectories, rewards and overlong penalties. */
async function generate(
  ctx: StepContext,
  step: number,
  round: number,
  items: readonly QaItem[],
  phase: <T>(name: string, work: () => Promise<T>) => Promise<T>,
): Promise<Drawn[]> {
  const { config, tokenizer } = ctx;
  const { rollout } = config;
  // 1. Prompts, each repeated n × n_agent times next to each other (one GRPO group: Search-R1
  // repeats the batch n_agent times interleaved, and its groups are the question's index).
  const settings = policySettings(ctx, {
    temperature: rollout.temperature,
    topP: rollout.top_p,
    topK: rollout.top_k,
  });
  const prompts = await Promise.all(
    items.map((item) => promptIds(tokenizer, item.messages, settings.format)),
  );
  const group = items.flatMap((item, i) =>
    Array.from({ length: ctx.batches.group }, () => ({ item, promptIds: prompts[i] as number[] })),
  );

  // 2. Rollouts, every trajectory concurrently. Round r > 0 of dynamic sampling seeds its
  // trajectories after those of the rounds before it.
  const trajectories = await phase("rollout", () =>
    rolloutAll(
      group.map((g, i) => ({
        promptIds: g.promptIds,
        seed: rolloutSeed(config.data.seed, step, round * group.length + i),
      })),
      settings,
      ctx.session.parts(tokenizer.tokenizer, tokenizer),
      { concurrency: group.length, signal: ctx.session.signal },
    ),
  );

  // 3. Rewards, and DAPO's overlong penalty on the longest turn.
  const rewards = await phase("reward", () =>
    Promise.all(trajectories.map((t, i) => reward(t, (group[i] as { item: QaItem }).item, ctx))),
  );
  const buffer = config.reward.overlong_buffer;
  return trajectories.map((trajectory, i) => ({
    item: (group[i] as { item: QaItem }).item,
    trajectory,
    reward: rewards[i] as RewardResult,
    overlong: buffer.enable
      ? overlongPenalty(
          Math.max(0, ...trajectory.turns.map((turn) => turn.tokens)),
          config.data.max_response_length,
          buffer.len,
          buffer.penalty_factor,
        )
      : 0,
  }));
}

/** The value algorithm.filter_groups.metric names, for one trajectory. */
function filterMetric(d: Drawn, metric: TrainConfig["algorithm"]["filter_groups"]["metric"]) {
  switch (metric) {
    case "acc":
      return d.reward.em;
    case "score":
      return d.reward.reward;
    default:
      // seq_reward: the token-level scores' sum (the score with the overlong penalty);
      // seq_final_reward adds the in-reward KL in verl, refused with it here (run.ts), so the same.
      return d.reward.reward + d.overlong;
  }
}

/**
 * algorithm.rollout_correction over the generated tokens that have both log-probs: the IS
 * weights for the actor (1 everywhere when rollout_is is null), the loss mask with the
 * rejected tokens removed, and the `rollout_corr/` metrics (none when the engine gave no
 * log-probs and no correction is asked for).
 */
function correct(
  config: TrainConfig,
  trajectories: readonly Trajectory[],
  oldLogProbs: readonly ArrayLike<number>[],
  lossMask: readonly ArrayLike<number>[],
): { weights: Float64Array[]; lossMask: ArrayLike<number>[]; metrics: Record<string, number> } {
  const rc = config.algorithm.rollout_correction;
  const active = rc.rollout_is !== null || rc.rollout_rs !== null;
  const missing = trajectories.some((t) =>
    t.lossMask.some((m, j) => m === 1 && t.logprobs[j] === null),
  );
  if (active && missing) {
    throw new InputError(
      `algorithm.rollout_correction (rollout_is=${rc.rollout_is}, rollout_rs=${rc.rollout_rs}) ` +
        "needs the engine's log-prob of every generated token, and the engine left some out",
    );
  }
  const mask = trajectories.map((t) =>
    Float64Array.from(t.lossMask, (m, j) => (m === 1 && t.logprobs[j] !== null ? 1 : 0)),
  );
  const result = rolloutCorrection(
    oldLogProbs,
    trajectories.map((t) => Float64Array.from(t.logprobs, (x) => x ?? 0)),
    mask,
    {
      rolloutIs: rc.rollout_is,
      rolloutIsThreshold: rc.rollout_is_threshold,
      rolloutIsBatchNormalize: rc.rollout_is_batch_normalize,
      rejection:
        rc.rollout_rs === null ? [] : parseRolloutRs(rc.rollout_rs, rc.rollout_rs_threshold),
    },
  );
  return {
    weights: result.weights,
    lossMask: lossMask.map((row, b) =>
      Float32Array.from(row, (m, t) => m * ((result.keep[b] as Float64Array)[t] as number)),
    ),
    metrics: result.metrics,
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
  return scoreTrajectory(
    { promptText, responseText, golds: item.golds },
    config,
    ctx.config.rollout.multi_turn.format === "hermes" ? "verl_search_r1_like" : "search_r1",
  );
}

/** The agent's settings for the policy being trained: with LoRA, turns run with its adapter. */
export function policySettings(
  ctx: Pick<StepContext, "config" | "lora">,
  sampling: AgentSettings["sampling"],
): AgentSettings {
  const settings = agentSettings(ctx.config, sampling);
  return ctx.lora ? { ...settings, lora: POLICY_ADAPTER } : settings;
}

/**
 * Exports the policy and has the engine load it; the previous export is removed. With LoRA
 * the adapter alone goes (a PEFT folder of a few MB, no merged weights): the engine drops the
 * last one and loads it under POLICY_ADAPTER, unmerged. Returns the bytes of the folder the
 * engine read (node 0's copy on several nodes).
 */
export async function pushWeights(ctx: StepContext, step: number): Promise<number> {
  const name = `step_${step}`;
  const engine = ctx.session.engine;
  const nodes = ctx.nodeExports;
  if (ctx.lora) {
    if (!engine.loadLoraAdapter || !engine.unloadLoraAdapter) {
      throw new Error("the engine cannot load LoRA adapters (the native engine and SGLang can)");
    }
    if (ctx.lora.adapterLoaded) await engine.unloadLoraAdapter(POLICY_ADAPTER);
    ctx.lora.adapterLoaded = false;
    if (nodes) {
      if (!(engine instanceof EngineRouter)) throw new Error("several nodes need engine replicas");
      const { roots, replicaNode } = nodes;
      await ctx.trainer.exportPolicy({ node_outs: roots.map((r) => join(r, name)), adapter: true });
      await engine.loadLoraAdapterOf(POLICY_ADAPTER, (r) =>
        join(roots[replicaNode(r)] as string, name),
      );
      nodes.removeElsewhere(`step_${step - 1}`);
    } else {
      const out = join(ctx.exportsDir, name);
      await ctx.trainer.exportPolicy({ out, adapter: true });
      await engine.loadLoraAdapter(POLICY_ADAPTER, out);
    }
    ctx.lora.adapterLoaded = true;
  } else if (nodes) {
    // Each node's first rank writes the node's copy; each replica loads its node's.
    if (!(engine instanceof EngineRouter)) throw new Error("several nodes need engine replicas");
    const { roots, replicaNode, dtype } = nodes;
    await ctx.trainer.exportPolicy({ node_outs: roots.map((r) => join(r, name)), dtype });
    await engine.updateWeightsFromDiskOf((r) => join(roots[replicaNode(r)] as string, name));
    nodes.removeElsewhere(`step_${step - 1}`);
  } else {
    const out = join(ctx.exportsDir, name);
    await ctx.trainer.exportPolicy({ out, dtype: "fp32" });
    if (!engine.updateWeightsFromDisk) {
      throw new Error("the engine cannot load weights from disk");
    }
    await engine.updateWeightsFromDisk(out);
  }
  await rm(join(ctx.exportsDir, `step_${step - 1}`), { recursive: true, force: true });
  return folderBytes(join(nodes ? (nodes.roots[0] as string) : ctx.exportsDir, name));
}

/** The bytes of the files directly in `dir`. */
async function folderBytes(dir: string): Promise<number> {
  const files = await readdir(dir, { withFileTypes: true });
  const sizes = await Promise.all(
    files.filter((f) => f.isFile()).map(async (f) => (await stat(join(dir, f.name))).size),
  );
  return sizes.reduce((a, b) => a + b, 0);
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
