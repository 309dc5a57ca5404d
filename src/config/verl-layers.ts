import { parse as parseYaml } from "yaml";
import type { z } from "zod";
import { UsageError } from "../runtime/errors.js";
import {
  emptyLayer,
  formatOrigin,
  getPath,
  isPlainObject,
  type Layer,
  mergeValues,
  type Origin,
  originOf,
  setValue,
} from "./layers.js";
import { nodeAt } from "./schema-walk.js";
import { VERL_ENV, verlKey } from "./verl-keys.js";

/** What a command does with verl's and Search-R1's key names (CommandConfigSpec.verl). */
export interface VerlDialect {
  /**
   * The training config's schema, for a command that is not `train` (eval): a key of it is
   * accepted with a warning that it does nothing here, so a training script's line runs.
   */
  trainingSchema?: z.ZodType;
}

/** A layer in this project's key names, and whether it used any of verl's. */
export interface Translated {
  layer: Layer;
  usedVerl: boolean;
}

/**
 * A layer's keys in this project's names (verl-keys.ts): verl's and Search-R1's keys are
 * renamed, their no-effect keys dropped with a warning (once per key), values that cannot be
 * honoured refused naming the key and where it was set. This project's own keys win where a
 * name is both.
 */
export function translateLayer(
  schema: z.ZodType,
  dialect: VerlDialect,
  layer: Layer,
  warn: (line: string, key: string) => void,
): Translated {
  const out = emptyLayer();
  let usedVerl = false;
  const noEffect = (dotted: string, value: unknown, origin: Origin | undefined, why: string) =>
    warn(
      `searchr1: warning: ${dotted}=${JSON.stringify(loose(value))} (${formatOrigin(origin)}) has no effect in searchr1: ${why}; accepted so that verl/Search-R1 configs load`,
      dotted,
    );
  const place = (path: string[], value: unknown, origin: Origin | undefined, dotted: string) => {
    if (!nodeAt(schema, path) && dialect.trainingSchema && nodeAt(dialect.trainingSchema, path)) {
      noEffect(dotted, value, origin, "a training key");
      return;
    }
    setValue(out, path, value, origin ?? { kind: "override", text: dotted });
  };
  for (const [path, value] of leaves(layer.values, [])) {
    const dotted = path.join(".");
    const origin = originOf([layer], path);
    const entry = nodeAt(schema, path) ? undefined : verlKey(dotted);
    if (!entry) {
      place(path, value, origin, dotted);
      continue;
    }
    usedVerl = true;
    if ("noEffect" in entry) noEffect(dotted, value, origin, entry.noEffect);
    else if ("only" in entry) {
      const v = loose(value);
      if (!entry.only.some((allowed) => JSON.stringify(allowed) === JSON.stringify(v))) {
        throw new UsageError(
          `"${dotted}" = ${JSON.stringify(v)} (${formatOrigin(origin)}): cannot be honoured here (${entry.why}); accepted: ${entry.only.map((a) => JSON.stringify(a)).join(", ")}`,
        );
      }
    } else {
      place(entry.to.split("."), entry.value ? entry.value(loose(value)) : value, origin, dotted);
      for (const [key, v] of Object.entries(entry.also ?? {})) {
        place(key.split("."), v, origin, dotted);
      }
    }
  }
  return { layer: out, usedVerl };
}

/** Environment variables of verl's scripts that do nothing here: one warning each when set. */
export function verlEnvWarnings(env: Record<string, string | undefined>): string[] {
  return Object.entries(VERL_ENV)
    .filter(([name]) => env[name] !== undefined && env[name] !== "")
    .map(
      ([name, why]) =>
        `searchr1: warning: ${name}=${env[name]} has no effect in searchr1 (${why}); accepted so that verl/Search-R1 scripts run`,
    );
}

/**
 * Search-R1's verl defaults (Search-R1 verl/trainer/config/ppo_trainer.yaml), the ones that
 * change what a run computes and that searchr1 can express. A config written in verl's names
 * ran on these, not on searchr1's defaults, so they lie under its layers: e.g. its PPO script
 * never sets use_kl_loss (false there, true here) nor rollout.n (1 there, 5 here).
 */
const SEARCH_R1_DEFAULTS = {
  data: {
    max_prompt_length: 512,
    max_response_length: 512,
    max_start_length: 256,
    max_obs_length: 512,
    train_batch_size: 1024,
    val_batch_size: 1312,
    shuffle_train_dataloader: true,
  },
  actor_rollout_ref: {
    model: { enable_gradient_checkpointing: false },
    actor: {
      ppo_mini_batch_size: 256,
      ppo_micro_batch_size: 64,
      use_dynamic_bsz: false,
      ppo_max_token_len_per_gpu: 16384,
      grad_clip: 1.0,
      state_masking: false,
      clip_ratio: 0.2,
      entropy_coeff: 0.001,
      use_kl_loss: false,
      kl_loss_coef: 0.001,
      kl_loss_type: "low_var_kl",
      ppo_epochs: 1,
      optim: { lr: 1e-6, lr_warmup_steps_ratio: 0, warmup_style: "constant" },
    },
    ref: { log_prob_micro_batch_size: 128, fsdp_config: { param_offload: false } },
    rollout: {
      temperature: 1.0,
      top_k: -1,
      top_p: 0.95,
      gpu_memory_utilization: 0.5,
      free_cache_engine: true,
      log_prob_micro_batch_size: 128,
      n: 1,
      n_agent: 1,
    },
  },
  critic: {
    optim: { lr: 1e-5, lr_warmup_steps_ratio: 0 },
    ppo_micro_batch_size: 64,
    ppo_max_token_len_per_gpu: 32768,
    grad_clip: 1.0,
    cliprange_value: 0.5,
  },
  retriever: { url: "http://127.0.0.1:8000/retrieve", topk: 3 },
  algorithm: {
    gamma: 1.0,
    lam: 1.0,
    adv_estimator: "gae",
    kl_penalty: "kl",
    kl_ctrl: { type: "fixed", kl_coef: 0.001 },
  },
  trainer: {
    total_epochs: 30,
    total_training_steps: null,
    project_name: "verl_examples",
    experiment_name: "gsm8k",
    logger: ["console", "wandb"],
    nnodes: 1,
    n_gpus_per_node: 8,
  },
  max_turns: 10,
};

const DEFAULTS_ORIGIN: Origin = { kind: "defaults", name: "Search-R1's ppo_trainer.yaml" };

/**
 * The layer under a config that uses verl's names: Search-R1's defaults in this project's
 * keys, and its rule for the KL: in the reward exactly when not in the loss (Search-R1
 * verl/trainer/ppo/ray_trainer.py, RayPPOTrainer.fit: apply_kl_penalty unless use_kl_loss),
 * unless the config says otherwise (verl's later algorithm.use_kl_in_reward).
 */
export function verlDefaultsLayer(schema: z.ZodType, above: readonly Layer[]): Layer {
  const raw = emptyLayer();
  for (const [path, value] of leaves(SEARCH_R1_DEFAULTS, [])) {
    setValue(raw, path, value, DEFAULTS_ORIGIN);
  }
  // Only the keys this command has: eval takes the sampling and lengths, not the training.
  const layer = emptyLayer();
  const translated = translateLayer(schema, {}, raw, () => {}).layer;
  for (const [dotted, origin] of translated.origins) {
    const path = dotted.split(".");
    if (nodeAt(schema, path)) setValue(layer, path, getPath(translated.values, path), origin);
  }
  const klInReward = ["algorithm", "use_kl_in_reward"];
  if (nodeAt(schema, klInReward) && originOf(above, klInReward) === undefined) {
    const merged = mergeValues([layer, ...above]) as { actor?: { use_kl_loss?: unknown } };
    const inLoss = loose(merged.actor?.use_kl_loss) === true;
    setValue(layer, klInReward, !inLoss, DEFAULTS_ORIGIN);
  }
  return layer;
}

/** The leaves of a layer's values with their paths; an empty mapping is a leaf. */
function* leaves(values: unknown, path: string[]): Generator<[string[], unknown]> {
  if (isPlainObject(values) && (Object.keys(values).length > 0 || path.length === 0)) {
    for (const [key, v] of Object.entries(values)) yield* leaves(v, [...path, key]);
  } else yield [path, values];
}

/** A value as YAML (and Hydra) would read it from text: `False`, `null`, `1e-6`. */
function loose(value: unknown): unknown {
  if (typeof value !== "string") return value;
  try {
    return parseYaml(value);
  } catch {
    return value;
  }
}

/** What one `key=value` of a script becomes here, for `config --from-script`. */
export function explainKey(schema: z.ZodType, dialect: VerlDialect, dotted: string): string {
  const path = dotted.split(".");
  const entry = nodeAt(schema, path) ? undefined : verlKey(dotted);
  const target = entry && "to" in entry ? entry.to : entry ? null : dotted;
  if (target !== null) {
    const ours = nodeAt(schema, target.split("."));
    if (!ours && dialect.trainingSchema && nodeAt(dialect.trainingSchema, target.split("."))) {
      return "no effect here (a training key)";
    }
    if (!ours) return "unknown key (refused below)";
    const also =
      entry && "to" in entry && entry.also ? `, ${Object.keys(entry.also).join(", ")}` : "";
    return target === dotted ? "the same key" : `${target}${also}`;
  }
  if (entry && "noEffect" in entry) return `no effect (${entry.noEffect})`;
  return `accepted at ${(entry as { only: readonly unknown[] }).only.map((v) => JSON.stringify(v)).join(" or ")} (${(entry as { why: string }).why})`;
}
