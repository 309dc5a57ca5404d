/**
 * PEFT LoRA adapters merged into a model's weights, as peft's `merge_and_unload()` does
 * (huggingface/peft, src/peft/tuners/lora/layer.py: `Linear.merge` adds `get_delta_weight`,
 * transpose(B @ A, fan_in_fan_out) · scaling, to the base layer's weight in its dtype;
 * scaling = lora_alpha / r, or lora_alpha / √r with use_rslora). The delta is summed in
 * float64 and the merged value rounded once to float32, then to the base tensor's dtype: the
 * same arithmetic as the native trainer's `export` (native/src/model/lora.cpp, merge), so the
 * two agree bit for bit; PEFT sums B @ A in the adapter's dtype, which differs from this by
 * float32 rounding.
 */
import { existsSync, readFileSync, statSync } from "node:fs";
import { isAbsolute, join, resolve } from "node:path";
import { InputError } from "../runtime/errors.js";
import { readSafetensors, type Tensor, toFloat32 } from "../tensors/safetensors.js";
import { castBytes } from "./cast.js";
import type { Conversion, SourceTensor } from "./source.js";

/** One module's adapter: A is [rank, in], B is [out, rank], row-major float32. */
export interface LoraPair {
  a: Float32Array;
  b: Float32Array;
  rank: number;
}

export interface LoraAdapter {
  /** The adapters by the HF name of the weight they change (`model.layers.0.self_attn.q_proj.weight`). */
  pairs: Map<string, LoraPair>;
  scaling: number;
  /** PEFT's fan_in_fan_out: the base weight is stored [in, out] (GPT-2's Conv1D). */
  fanInFanOut: boolean;
  /** adapter_config.json's base_model_name_or_path. */
  baseModel: string | null;
}

/** PEFT's tensor names: `base_model.model.<module>.lora_A.weight` (adapter name left out). */
const PEFT_NAME = /^base_model\.model\.(.+)\.lora_([AB])(?:\.default)?\.weight$/;

/** What adapter_config.json of a PEFT LoRA folder says about merging its adapters. */
export interface LoraConfig {
  rank: number;
  scaling: number;
  fanInFanOut: boolean;
  baseModel: string | null;
}

/** adapter_config.json of a PEFT folder; refuses, naming the field, what is not merged here. */
export function readLoraConfig(dir: string): LoraConfig {
  const configPath = join(dir, "adapter_config.json");
  if (!existsSync(configPath)) {
    throw new InputError(`${dir}: no adapter_config.json (a PEFT adapter folder is expected)`);
  }
  let config: Record<string, unknown>;
  try {
    config = JSON.parse(readFileSync(configPath, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new InputError(`${configPath}: invalid JSON (${(e as Error).message})`);
  }
  const refuse = (field: string, why: string) => new InputError(`${configPath}: ${field} ${why}`);
  if (config.peft_type !== "LORA") {
    throw refuse("peft_type", `is ${JSON.stringify(config.peft_type)}, not "LORA"`);
  }
  if (config.use_dora === true) {
    throw refuse("use_dora", "is true: DoRA's magnitude vector is not merged here");
  }
  if (config.bias !== undefined && config.bias !== "none") {
    throw refuse("bias", `is ${JSON.stringify(config.bias)}: only "none" (no trained biases)`);
  }
  for (const field of ["rank_pattern", "alpha_pattern"]) {
    const v = config[field];
    if (v && typeof v === "object" && Object.keys(v).length > 0) {
      throw refuse(field, "is set: per-module ranks and alphas are not supported");
    }
  }
  const saved = config.modules_to_save;
  if (Array.isArray(saved) && saved.length > 0) {
    throw refuse("modules_to_save", "is set: fully trained modules are not merged here");
  }
  const r = config.r;
  const alpha = config.lora_alpha;
  if (typeof r !== "number" || !Number.isInteger(r) || r <= 0) {
    throw refuse("r", "must be a positive integer");
  }
  if (typeof alpha !== "number" || !Number.isFinite(alpha)) {
    throw refuse("lora_alpha", "must be a number");
  }
  const base = config.base_model_name_or_path;
  return {
    rank: r,
    scaling: config.use_rslora === true ? alpha / Math.sqrt(r) : alpha / r,
    fanInFanOut: config.fan_in_fan_out === true,
    baseModel: typeof base === "string" && base !== "" ? base : null,
  };
}

/** Reads a PEFT adapter folder (adapter_config.json and adapter_model.safetensors). */
export async function readLoraAdapter(dir: string): Promise<LoraAdapter> {
  const { rank: r, scaling, fanInFanOut, baseModel } = readLoraConfig(dir);
  const configPath = join(dir, "adapter_config.json");
  const weights = join(dir, "adapter_model.safetensors");
  if (!existsSync(weights)) {
    const bin = existsSync(join(dir, "adapter_model.bin"));
    throw new InputError(
      `${dir}: no adapter_model.safetensors${bin ? " (adapter_model.bin is not read: save the adapter with PEFT's default safe_serialization=True)" : ""}`,
    );
  }
  const halves = new Map<string, { A?: Tensor; B?: Tensor }>();
  for (const [name, tensor] of await readSafetensors(weights)) {
    const m = PEFT_NAME.exec(name);
    if (!m) {
      throw new InputError(
        `${weights}: ${name} is not a LoRA tensor (base_model.model.<module>.lora_A/B.weight)`,
      );
    }
    const key = `${m[1]}.weight`;
    const entry = halves.get(key) ?? {};
    entry[m[2] as "A" | "B"] = tensor;
    halves.set(key, entry);
  }
  const pairs = new Map<string, LoraPair>();
  for (const [key, { A, B }] of halves) {
    if (!A || !B) throw new InputError(`${weights}: ${key}: lora_${A ? "B" : "A"} is missing`);
    const [ra] = A.shape;
    const [, rb] = B.shape;
    if (A.shape.length !== 2 || B.shape.length !== 2 || ra !== r || rb !== r) {
      throw new InputError(
        `${weights}: ${key}: lora_A [${A.shape}] and lora_B [${B.shape}] do not have rank r = ${r} (${configPath})`,
      );
    }
    pairs.set(key, { a: toFloat32(A), b: toFloat32(B), rank: r });
  }
  return { pairs, scaling, fanInFanOut, baseModel };
}

/**
 * The base model's folder for an adapter without --hf-base: base_model_name_or_path when it
 * names a local folder (as PEFT resolves it, from the working directory, else from the
 * adapter's folder); null otherwise (a hub id).
 */
export function localBaseModel(adapterDir: string, adapter: LoraAdapter): string | null {
  const name = adapter.baseModel;
  if (name === null) return null;
  for (const candidate of isAbsolute(name) ? [name] : [resolve(name), resolve(adapterDir, name)]) {
    if (existsSync(join(candidate, "config.json")) && statSync(candidate).isDirectory()) {
      return candidate;
    }
  }
  return null;
}

/**
 * The base model's tensors with the adapter merged into those it targets; every adapter must
 * find its weight, with the shape its A and B imply.
 */
export function mergeLora(base: Conversion, adapter: LoraAdapter, from: string): Conversion {
  const byName = new Map(base.tensors.map((t) => [t.name, t]));
  for (const [name, pair] of adapter.pairs) {
    const t = byName.get(name);
    if (!t)
      throw new InputError(
        `${from}: the adapter changes ${name}, which the base model does not have`,
      );
    if (!fits(t.shape, pair, adapter.fanInFanOut)) {
      throw new InputError(
        `${from}: ${name}: the adapter's A and B do not fit the base weight [${t.shape}]`,
      );
    }
  }
  const tensors = base.tensors.map((t) => {
    const pair = adapter.pairs.get(t.name);
    return pair ? mergedTensor(t, async () => pair, adapter.scaling, adapter.fanInFanOut) : t;
  });
  return { tensors, close: base.close };
}

/**
 * `base` + scaling · B A (transposed with fan_in_fan_out), in `base`'s dtype; the adapter is
 * read when the tensor is, and must fit it.
 */
export function mergedTensor(
  base: SourceTensor,
  readPair: () => Promise<LoraPair>,
  scaling: number,
  fanInFanOut: boolean,
): SourceTensor {
  return {
    ...base,
    read: async () => {
      const pair = await readPair();
      if (!fits(base.shape, pair, fanInFanOut)) {
        throw new InputError(
          `${base.name}: the adapter's A and B do not fit the base weight [${base.shape}]`,
        );
      }
      const [rows, cols] = base.shape as [number, number];
      const w = new Float32Array(rows * cols);
      Buffer.from(w.buffer).set(castBytes(await base.read(), base.dtype, "F32"));
      const r = pair.rank;
      const inDim = fanInFanOut ? rows : cols;
      for (let i = 0; i < rows; i++) {
        for (let j = 0; j < cols; j++) {
          const [o, c] = fanInFanOut ? [j, i] : [i, j];
          let d = 0;
          for (let k = 0; k < r; k++) {
            d += (pair.b[o * r + k] as number) * (pair.a[k * inDim + c] as number);
          }
          const at = i * cols + j;
          w[at] = (w[at] as number) + scaling * d;
        }
      }
      return castBytes(Buffer.from(w.buffer), "F32", base.dtype);
    },
  };
}

/** Whether A [r, in] and B [out, r] fit a weight of `shape` ([out, in], or [in, out]). */
function fits(shape: readonly number[], pair: LoraPair, fanInFanOut: boolean): boolean {
  if (shape.length !== 2) return false;
  const [out, inDim] = fanInFanOut ? [shape[1], shape[0]] : [shape[0], shape[1]];
  return (
    pair.b.length === (out as number) * pair.rank && pair.a.length === (inDim as number) * pair.rank
  );
}
