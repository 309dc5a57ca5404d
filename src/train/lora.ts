import { resolve } from "node:path";
import type { TrainConfig } from "../config/schemas/train.js";
import { loraOn, targetModules } from "../planning/lora-spec.js";
import { UsageError } from "../runtime/errors.js";
import type { LoraFields } from "../trainer/protocol.js";

/**
 * The engine's name for the policy's adapter when LoRA is on: each step's push loads the
 * trainer's adapter folder under it (replacing the last), and rollouts ask for it.
 */
export const POLICY_ADAPTER = "policy";

/**
 * The trainer's `lora` of `load` (native/src/train/SERVE.md, "LoRA") from the model.lora_*
 * keys, or undefined for full fine-tuning; refuses, naming the key, what the native trainer
 * cannot do beside adapters. With model.lora_adapter_path the folder's adapter_config.json
 * gives the fields, as verl's PeftModel.from_pretrained does; those set here beside it (away
 * from their defaults) are sent too, and the trainer refuses one that differs from the file.
 */
export function loraLoad(config: TrainConfig): LoraFields | undefined {
  const m = config.model;
  // Read every key, so that one set without LoRA on is still seen as read and checked.
  const { lora_rank, lora_alpha, use_rslora, lora_adapter_path } = m;
  const targets = targetModules(m.target_modules, m.exclude_modules);
  if (!loraOn(config)) {
    const unused = [
      lora_alpha !== 16 && `model.lora_alpha=${lora_alpha}`,
      use_rslora && "model.use_rslora=true",
      m.target_modules !== "all-linear" && "model.target_modules",
      (m.exclude_modules?.length ?? 0) > 0 && "model.exclude_modules",
    ].find((s) => s !== false);
    if (unused) {
      throw new UsageError(
        `${unused} has no effect without LoRA: set model.lora_rank (> 0) or model.lora_adapter_path, or leave it at its default`,
      );
    }
    return undefined;
  }
  checkLora(config);
  if (lora_adapter_path === null) {
    return { rank: lora_rank, alpha: lora_alpha, use_rslora, target_modules: targets };
  }
  return {
    path: resolve(lora_adapter_path),
    ...(lora_rank > 0 ? { rank: lora_rank } : {}),
    ...(lora_alpha !== 16 ? { alpha: lora_alpha } : {}),
    ...(use_rslora ? { use_rslora } : {}),
    ...(targets !== "all-linear" ? { target_modules: targets } : {}),
  };
}

/** What the native trainer refuses beside `lora` (session.cpp, load), named by our keys. */
function checkLora(config: TrainConfig): void {
  const why = `with LoRA (model.lora_rank=${config.model.lora_rank}${config.model.lora_adapter_path ? `, model.lora_adapter_path=${config.model.lora_adapter_path}` : ""})`;
  // actor.param_offload moves the frozen base to host memory between phases, as for a full model.
  for (const key of ["grad_offload", "optimizer_offload"] as const) {
    if (config.actor[key]) {
      throw new UsageError(
        `actor.${key}=true ${why}: the frozen base has no gradient or optimizer state, and the adapters' stay on the device (they are small); actor.param_offload moves the base to host memory between phases`,
      );
    }
  }
  if (config.ref.param_offload) {
    throw new UsageError(
      `ref.param_offload=true ${why}: the reference is the policy with its adapters off, there is no second copy to offload`,
    );
  }
}

/**
 * The trainer's `critic_lora` of `load` from critic.lora_rank, lora_alpha and target_modules
 * (verl's critic.model.lora_*), or undefined for a fully fine-tuned critic: adapters on the
 * frozen critic, its value head trained in full beside them (SERVE.md, "LoRA"). Refuses,
 * naming the key, a setting with no effect or one the trainer cannot run beside adapters.
 */
export function criticLoraLoad(config: TrainConfig): LoraFields | undefined {
  const c = config.critic;
  const { lora_rank, lora_alpha, target_modules } = c;
  if (lora_rank === 0) {
    const unused = [
      lora_alpha !== 16 && `critic.lora_alpha=${lora_alpha}`,
      target_modules !== "all-linear" && "critic.target_modules",
    ].find((s) => s !== false);
    if (unused) {
      throw new UsageError(
        `${unused} has no effect without adapters on the critic: set critic.lora_rank (> 0), or leave it at its default`,
      );
    }
    return undefined;
  }
  if (config.algorithm.name !== "ppo") {
    throw new UsageError(
      `critic.lora_rank=${lora_rank} has no effect with algorithm.name=${config.algorithm.name}: only PPO trains a critic`,
    );
  }
  for (const key of ["grad_offload", "optimizer_offload"] as const) {
    if (c[key]) {
      throw new UsageError(
        `critic.${key}=true with critic.lora_rank=${lora_rank}: the frozen critic has no gradient or optimizer state, and the adapters' stay on the device (they are small); critic.param_offload moves the base to host memory between phases`,
      );
    }
  }
  return { rank: lora_rank, alpha: lora_alpha, target_modules };
}
