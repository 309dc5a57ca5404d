/**
 * A run's LoRA adapters as the config asks for them (model.lora_*): whether there are any,
 * and which modules they cover; what src/train/lora.ts sends the trainer and the memory plan
 * sizes.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { LORA_MODULES, type TrainConfig } from "../config/schemas/train.js";
import { InputError, UsageError } from "../runtime/errors.js";

export type LoraModule = (typeof LORA_MODULES)[number];

/**
 * Whether a run trains LoRA adapters: model.lora_rank > 0 or a model.lora_adapter_path to
 * start from (verl's test, verl/workers/fsdp_workers.py: `lora_adapter_path is not None or
 * lora_rank > 0`).
 */
export function loraOn(config: TrainConfig): boolean {
  return config.model.lora_rank > 0 || config.model.lora_adapter_path !== null;
}

/** The adapters' rank and modules, for the plan; null without LoRA. */
export function loraSpec(
  config: TrainConfig,
): { rank: number; targets: "all-linear" | LoraModule[] } | null {
  if (!loraOn(config)) return null;
  const m = config.model;
  const targets = targetModules(m.target_modules, m.exclude_modules);
  if (m.lora_rank > 0 || m.lora_adapter_path === null) return { rank: m.lora_rank, targets };
  // Starting from an adapter folder: its adapter_config.json has the rank.
  const file = join(m.lora_adapter_path, "adapter_config.json");
  if (!existsSync(file)) {
    throw new InputError(
      `model.lora_adapter_path: ${file} does not exist (a PEFT adapter folder is expected)`,
    );
  }
  const r = (JSON.parse(readFileSync(file, "utf8")) as { r?: unknown }).r;
  if (typeof r !== "number" || !Number.isInteger(r) || r < 1) {
    throw new InputError(`${file}: r must be a positive integer`);
  }
  return { rank: r, targets };
}

/**
 * model.target_modules less model.exclude_modules, as PEFT's list matching does for our
 * module names (peft/tuners/tuners_utils.py, check_target_module_exists: a name matches an
 * entry equal to it or ending in `.<entry>`); PEFT's regex, or an entry naming one layer's
 * module, cannot be expressed here and is refused naming the key.
 */
export function targetModules(
  target: "all-linear" | LoraModule[],
  exclude: string[] | null,
): "all-linear" | LoraModule[] {
  if (exclude === null || exclude.length === 0) return target;
  for (const name of exclude) {
    if (!(LORA_MODULES as readonly string[]).includes(name)) {
      throw new UsageError(
        `model.exclude_modules: '${name}' is not one of ${LORA_MODULES.join(", ")}; adapters here cover a module in every layer or in none (PEFT's regex and one layer's module names are not supported)`,
      );
    }
  }
  const from = target === "all-linear" ? [...LORA_MODULES] : target;
  const kept = from.filter((name) => !exclude.includes(name));
  if (kept.length === 0) {
    throw new UsageError(
      `model.exclude_modules=[${exclude.join(",")}] leaves no module of model.target_modules to adapt`,
    );
  }
  return kept;
}
