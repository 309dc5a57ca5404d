/**
 * verl FSDP actor checkpoints → Hugging Face tensors. Each rank wrote
 * `model_world_size_{W}_rank_{r}.pt`, a state dict under HF names whose values are
 * DTensor shards (torch ≥ 2: concatenated along the Shard dim in rank order, Replicate
 * taken once) or plain tensors (single-GPU runs, and replicated buffers, which are kept
 * once and must agree across ranks rather than being concatenated world-size times).
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { InputError, UsageError } from "../runtime/errors.js";
import { DTYPE_SIZE, type DType } from "../tensors/safetensors.js";
import { castBytes } from "./cast.js";
import { type ModelDims, readConfig } from "./model-dims.js";
import { mergedTensor, readLoraConfig } from "./peft.js";
import type { Conversion, SourceTensor } from "./source.js";
import { concat } from "./tensor-ops.js";
import { convertTorchFiles, DTensorShard, describe } from "./torch-load.js";
import { TorchTensor } from "./torch-tensor.js";

export interface FsdpLayout {
  actorDir: string;
  worldSize: number;
  /** files[rank] */
  files: string[];
}

const MODEL_FILE = /^model_world_size_(\d+)_rank_(\d+)\.pt$/;

export function locateFsdp(input: string): FsdpLayout {
  const actorDir = findActorDir(input);
  const worlds = new Set<number>();
  for (const f of readdirSync(actorDir)) {
    const m = MODEL_FILE.exec(f);
    if (m) worlds.add(Number(m[1]));
  }
  let worldSize: number;
  const configPath = join(actorDir, "fsdp_config.json");
  if (existsSync(configPath)) {
    const config = readConfig(configPath);
    if (!Number.isSafeInteger(config.world_size) || (config.world_size as number) <= 0) {
      throw new InputError(`${configPath}: field "world_size" must be a positive integer`);
    }
    worldSize = config.world_size as number;
  } else if (worlds.size === 1) {
    worldSize = [...worlds][0] as number;
  } else {
    throw new InputError(
      worlds.size === 0
        ? `${actorDir}: no model_world_size_W_rank_R.pt files`
        : `${actorDir}: files for several world sizes (${[...worlds].join(", ")}) and no fsdp_config.json`,
    );
  }
  const files = Array.from({ length: worldSize }, (_, r) => {
    const f = join(actorDir, `model_world_size_${worldSize}_rank_${r}.pt`);
    if (!existsSync(f)) throw new InputError(`${f}: missing (world size ${worldSize})`);
    return f;
  });
  return { actorDir, worldSize, files };
}

/** The actor folder, a global_step_N folder, or a checkpoint root (tracker file or one step). */
function findActorDir(input: string): string {
  if (!existsSync(input) || !statSync(input).isDirectory()) {
    throw new InputError(`${input}: no such checkpoint folder`);
  }
  if (readdirSync(input).some((f) => MODEL_FILE.test(f))) return input;
  if (existsSync(join(input, "actor"))) return findActorDir(join(input, "actor"));
  const tracker = join(input, "latest_checkpointed_iteration.txt");
  if (existsSync(tracker)) {
    const step = readFileSync(tracker, "utf8").trim();
    const dir = join(input, `global_step_${step}`);
    if (!/^\d+$/.test(step) || !existsSync(dir)) {
      throw new InputError(`${tracker}: names step "${step}", but ${dir} is missing`);
    }
    return findActorDir(dir);
  }
  const steps = readdirSync(input).filter((d) => /^global_step_\d+$/.test(d));
  if (steps.length === 1) return findActorDir(join(input, steps[0] as string));
  throw new InputError(
    steps.length > 1
      ? `${input}: several steps (${steps.join(", ")}) and no latest_checkpointed_iteration.txt; pass one as --input`
      : `${input}: not a verl FSDP checkpoint (no model_world_size_W_rank_R.pt, actor/ or global_step_N/)`,
  );
}

// FSDP/activation-checkpointing wrappers that older saves leave in parameter names.
const WRAPPERS = /(^|\.)(_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)\./g;

/** What fsdp-to-hf does with a LoRA run's adapters (`--lora`). */
export type FsdpLora = "merge" | "separate";

/** A LoRA run's adapter as a PEFT folder to write beside the base (`--lora separate`). */
export interface FsdpAdapter {
  /** The checkpoint's `lora_adapter/adapter_config.json`, copied as it is. */
  configPath: string;
  rank: number;
  /** PEFT's saved names, `base_model.model.<module>.lora_A.weight`, in checkpoint order. */
  tensors: SourceTensor[];
}

export interface FsdpConversion extends Conversion {
  /** With `--lora separate`, the adapter the base tensors go without. */
  adapter?: FsdpAdapter;
}

export async function fsdpToHf(
  layout: FsdpLayout,
  dims: ModelDims,
  loraMode: FsdpLora = "merge",
): Promise<FsdpConversion> {
  let adapter: FsdpAdapter | undefined;
  const conversion = await convertTorchFiles(layout.files, (values) => {
    const dicts = values.map((value, r) => {
      if (!(value instanceof Map)) {
        throw new InputError(`${layout.files[r]}: expected a state dict, found ${describe(value)}`);
      }
      const dict = new Map<string, unknown>();
      for (const [k, v] of value) dict.set(String(k).replace(WRAPPERS, "$1"), v);
      return dict;
    });
    const first = dicts[0] as Map<string, unknown>;
    dicts.forEach((d, r) => {
      for (const k of d.keys()) {
        if (!first.has(k)) throw new InputError(`${layout.files[r]}: ${k} is not in rank 0's file`);
      }
    });
    const tensors: SourceTensor[] = [];
    const lora = new Map<string, { A?: SourceTensor; B?: SourceTensor }>();
    for (const name of first.keys()) {
      const merged = merge(
        name,
        layout.files,
        dicts.map((d) => d.get(name)),
      );
      const hfName = name.replace(PEFT_PREFIX, "").replace(".base_layer.", ".");
      const half = LORA_TENSOR.exec(hfName);
      if (half) {
        const key = half[1] as string;
        lora.set(key, { ...lora.get(key), [half[2] as "A" | "B"]: merged });
        continue;
      }
      if (hfName.includes("lora_")) {
        throw new InputError(`${layout.files[0]}: ${name}: not a LoRA tensor this reader knows`);
      }
      if (hfName === "lm_head.weight" && dims.tied) continue; // the tied embedding, saved twice
      tensors.push({ ...merged, name: hfName });
    }
    if (lora.size === 0) {
      if (loraMode === "separate") {
        throw new UsageError(
          `--lora separate: ${layout.actorDir} holds no LoRA adapters (no lora_A/lora_B tensors)`,
        );
      }
      return tensors;
    }
    const found = fsdpLora(layout, tensors, lora);
    if (loraMode === "separate") {
      adapter = found.adapter;
      return tensors;
    }
    return found.merged;
  });
  return { ...conversion, adapter };
}

/**
 * PEFT's names in a LoRA model's state dict (peft/tuners/lora/layer.py): the model under
 * `base_model.model.`, a targeted layer's own weight as `base_layer`, its adapter as
 * `lora_A.default` / `lora_B.default`.
 */
const PEFT_PREFIX = /^base_model\.model\./;
const LORA_TENSOR = /^(.+)\.lora_([AB])\.default\.weight$/;

/**
 * A LoRA run's checkpoint: its adapters, checked against the base weights they target and
 * the PEFT folder verl writes beside the rank files (`<actor>/lora_adapter/`,
 * verl/workers/fsdp_workers.py, save_checkpoint), whose adapter_config.json holds the
 * lora_alpha the rank files lack; as the base tensors with the adapters merged in, and as a
 * PEFT adapter apart (what verl's model_merger writes, verl/model_merger/base_model_merger.py,
 * save_lora_adapter: the names less `.default`).
 */
function fsdpLora(
  layout: FsdpLayout,
  tensors: SourceTensor[],
  lora: Map<string, { A?: SourceTensor; B?: SourceTensor }>,
): { merged: SourceTensor[]; adapter: FsdpAdapter } {
  const adapterDir = join(layout.actorDir, "lora_adapter");
  const configPath = join(adapterDir, "adapter_config.json");
  if (!existsSync(configPath)) {
    throw new InputError(
      `${layout.files[0]}: holds LoRA adapters, but ${configPath} (their lora_alpha, which verl saves beside the rank files) is missing`,
    );
  }
  const config = readLoraConfig(adapterDir);
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const pairs = new Map<string, { A: SourceTensor; B: SourceTensor }>();
  const adapterTensors: SourceTensor[] = [];
  for (const [module, { A, B }] of lora) {
    const key = `${module}.weight`;
    const where = `${layout.files[0]}: ${key}`;
    if (!A || !B) throw new InputError(`${where}: lora_${A ? "B" : "A"} is missing`);
    const base = byName.get(key);
    if (!base)
      throw new InputError(`${where}: an adapter targets it, but it is not in the checkpoint`);
    const why = config.refuses(module);
    if (why !== null) throw new InputError(`${where}: has an adapter, but ${why} (${configPath})`);
    const [out, inDim] = base.shape;
    const fit =
      base.shape.length === 2 &&
      A.shape.join() === [config.rank, inDim].join() &&
      B.shape.join() === [out, config.rank].join();
    if (!fit) {
      throw new InputError(
        `${where}: lora_A [${A.shape}] and lora_B [${B.shape}] do not fit the base weight [${base.shape}] at r = ${config.rank} (${configPath})`,
      );
    }
    pairs.set(key, { A, B });
    for (const [half, t] of [
      ["A", A],
      ["B", B],
    ] as const) {
      adapterTensors.push({ ...t, name: `base_model.model.${module}.lora_${half}.weight` });
    }
  }
  const floats = async (x: SourceTensor) =>
    new Float32Array(new Uint8Array(castBytes(await x.read(), x.dtype, "F32")).buffer);
  const merged = tensors.map((t) => {
    const pair = pairs.get(t.name);
    if (!pair) return t;
    return mergedTensor(
      t,
      async () => ({ a: await floats(pair.A), b: await floats(pair.B), rank: config.rank }),
      config.scaling,
    );
  });
  return { merged, adapter: { configPath, rank: config.rank, tensors: adapterTensors } };
}

function merge(name: string, files: string[], values: unknown[]): SourceTensor {
  if (values.every((v) => v instanceof DTensorShard))
    return mergeDTensor(name, files, values as DTensorShard[]);
  if (!values.every((v) => v instanceof TorchTensor)) {
    const r = values.findIndex((v) => !(v instanceof TorchTensor));
    throw new InputError(
      `${files[r]}: ${name} is ${describe(values[r])}${values.some((v) => v instanceof DTensorShard) ? " on this rank and a DTensor on another" : ", not a tensor"}`,
    );
  }
  const parts = values as TorchTensor[];
  const p0 = parts[0] as TorchTensor;
  const dtype = p0.validate(name);
  parts.forEach((p, r) => {
    if (p.validate(name) !== dtype || p.shape.join() !== p0.shape.join()) {
      throw new InputError(
        `${files[r]}: plain tensor ${name} differs in dtype or shape from rank 0's`,
      );
    }
  });
  // Plain tensors on several ranks are replicated buffers: one copy, checked equal.
  return {
    name,
    dtype,
    shape: [...p0.shape],
    read: async () => {
      const bytes = await Promise.all(parts.map((p) => p.read(name)));
      bytes.forEach((b, r) => {
        if (!b.equals(bytes[0] as Buffer)) {
          throw new InputError(
            `${files[r]}: plain tensor ${name} differs from rank 0's; without DTensor placements shards cannot be merged`,
          );
        }
      });
      return bytes[0] as Buffer;
    },
  };
}

function mergeDTensor(name: string, files: string[], shards: DTensorShard[]): SourceTensor {
  const s0 = shards[0] as DTensorShard;
  const dtype: DType = s0.local.validate(name);
  const where = (r: number) => `${files[r]}: ${name}`;
  shards.forEach((s, r) => {
    if (s.local.validate(name) !== dtype)
      throw new InputError(`${where(r)}: dtype differs from rank 0's`);
    if (s.globalShape.join() !== s0.globalShape.join()) {
      throw new InputError(`${where(r)}: global shape differs from rank 0's`);
    }
    if (s.placements.length !== 1) {
      throw new InputError(
        `${where(r)}: DTensor on a ${s.placements.length}-D device mesh; only 1-D (fsdp) meshes are supported`,
      );
    }
  });
  const placement = s0.placements[0];
  const shape = [...s0.globalShape];
  if (placement?.kind === "replicate") {
    if (s0.local.shape.join() !== shape.join())
      throw new InputError(`${where(0)}: replicated shard is not the full tensor`);
    return { name, dtype, shape, read: () => s0.local.read(name) };
  }
  if (placement?.kind !== "shard") {
    throw new InputError(
      `${where(0)}: unsupported DTensor placement ${placement?.kind === "other" ? placement.name : "?"}`,
    );
  }
  const dim = placement.dim < 0 ? placement.dim + shape.length : placement.dim;
  const summed = shards.reduce((a, s) => a + (s.local.shape[dim] ?? Number.NaN), 0);
  shards.forEach((s, r) => {
    const p = s.placements[0];
    const ok =
      p?.kind === "shard" &&
      s.local.shape.length === shape.length &&
      s.local.shape.every((d, i) => i === dim || d === shape[i]);
    if (!ok)
      throw new InputError(
        `${where(r)}: shard [${s.local.shape.join(", ")}] does not fit the global shape [${shape.join(", ")}] split on dim ${dim}`,
      );
  });
  if (summed !== shape[dim]) {
    throw new InputError(
      `${where(0)}: shards add up to ${summed} on dim ${dim}, the global shape [${shape.join(", ")}] has ${shape[dim]}`,
    );
  }
  return {
    name,
    dtype,
    shape,
    read: async () => {
      const bytes = await Promise.all(shards.map((s) => s.local.read(name)));
      const parts = bytes.map((b, r) => ({
        bytes: b,
        shape: (shards[r] as DTensorShard).local.shape,
      }));
      return concat(parts, dim, DTYPE_SIZE[dtype]).bytes;
    },
  };
}
