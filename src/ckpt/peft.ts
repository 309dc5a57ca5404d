/**
 * PEFT LoRA adapters merged into a model's weights, as peft's `merge_and_unload()` does
 * (huggingface/peft, src/peft/tuners/lora/layer.py: `Linear.merge` adds `get_delta_weight`,
 * transpose(B @ A, fan_in_fan_out) · scaling, to the base layer's weight in its dtype;
 * scaling = lora_alpha / r, or lora_alpha / √r with use_rslora). fan_in_fan_out is always
 * false here: PEFT sets it so for a torch.nn.Linear (layer.py, dispatch_default), and every
 * model read here (llama, mistral, qwen2, qwen3) has nothing else. The delta is summed in
 * float64 and the merged value rounded once to float32, then to the base tensor's dtype: the
 * same arithmetic as the native trainer's `export` (native/src/model/lora.cpp, merge), so the
 * two agree bit for bit; PEFT rounds B @ A and its product with scaling to float32 first,
 * which differs from this by float32 rounding.
 */
import { existsSync, readFileSync, statSync } from "node:fs";
import { copyFile, mkdir } from "node:fs/promises";
import { isAbsolute, join, resolve } from "node:path";
import { InputError } from "../runtime/errors.js";
import { readSafetensors, toFloat32, writeSafetensorsStreamed } from "../tensors/safetensors.js";
import { castBytes, isFloat } from "./cast.js";
import type { Conversion, SourceTensor } from "./source.js";
import { describe, loadTorchFile } from "./torch-load.js";
import { TorchTensor } from "./torch-tensor.js";

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
  /** adapter_config.json's base_model_name_or_path. */
  baseModel: string | null;
}

/** PEFT's tensor names: `base_model.model.<module>.lora_A.weight` (adapter name left out). */
const PEFT_NAME = /^base_model\.model\.(.+)\.lora_([AB])(?:\.default)?\.weight$/;

/** What adapter_config.json of a PEFT LoRA folder says about merging its adapters. */
export interface LoraConfig {
  rank: number;
  scaling: number;
  baseModel: string | null;
  /**
   * Whether PEFT puts an adapter on a module (its HF path, `model.layers.0.self_attn.q_proj`);
   * null when it does, else why not (naming the field).
   */
  refuses: (module: string) => string | null;
}

/**
 * LoraConfig fields of PEFT's LoRA variants and extras, each with a merge other than
 * W + scaling·B A (or none at all); set to anything but their default they are refused
 * (huggingface/peft, src/peft/tuners/lora/config.py).
 */
const UNSUPPORTED = [
  ["use_dora", "DoRA's magnitude vector is not merged here"],
  ["lora_bias", "lora_B's bias is not merged here"],
  ["use_qalora", "QALoRA (GPTQ) adapters are not merged here"],
  ["alora_invocation_tokens", "activated LoRA cannot be merged (PEFT does not either)"],
  ["velora_config", "VeLoRA is not merged here"],
  ["monteclora_config", "MonteCLoRA is not merged here"],
  ["use_bdlora", "block-diagonal LoRA is not merged here"],
  ["arrow_config", "Arrow routing is not merged here"],
  ["kasa_config", "KaSA's singular values are not merged here"],
  ["rank_pattern", "per-module ranks are not supported"],
  ["alpha_pattern", "per-module alphas are not supported"],
  ["modules_to_save", "fully trained modules are not merged here"],
  ["trainable_token_indices", "trainable token embeddings are not merged here"],
  ["target_parameters", "adapters on parameters (MoE experts) are not merged here"],
  ["layer_replication", "replicated layers are not supported"],
] as const;

/** Whether a config value differs from PEFT's "off" defaults (None, False, [], {}, ""). */
function isSet(v: unknown): boolean {
  if (v === undefined || v === null || v === false || v === "") return false;
  if (Array.isArray(v)) return v.length > 0;
  if (typeof v === "object") return Object.keys(v).length > 0;
  return true;
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
  if (config.bias !== undefined && config.bias !== "none") {
    throw refuse("bias", `is ${JSON.stringify(config.bias)}: only "none" (no trained biases)`);
  }
  for (const [field, why] of UNSUPPORTED) {
    if (isSet(config[field]))
      throw refuse(field, `is set (${JSON.stringify(config[field])}): ${why}`);
  }
  // init_lora_weights="mica" selects a LoRA variant class (MiCALinearVariant) too.
  if (config.init_lora_weights === "mica") {
    throw refuse("init_lora_weights", 'is "mica": the MiCA variant is not merged here');
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
    baseModel: typeof base === "string" && base !== "" ? base : null,
    refuses: targetMatcher(config, configPath),
  };
}

/**
 * PEFT's choice of the modules that get an adapter (peft/tuners/tuners_utils.py,
 * check_target_module_exists): not matched by exclude_modules (a list: a name equal to an
 * entry or ending in `.<entry>`; a string: a regex the whole name matches); then
 * target_modules as "all-linear" (every Linear but the output layer: for the models read
 * here, the `*_proj` layers), a regex the whole name matches, or a list matched as above and
 * narrowed to layers_to_transform (the first `.<layers_pattern>.<N>.` in the name, any
 * `.<word>.<N>.` without a pattern). Python regexes that JavaScript reads differently or not
 * at all are refused, naming the field.
 */
function targetMatcher(
  config: Record<string, unknown>,
  configPath: string,
): (module: string) => string | null {
  const refuse = (field: string, why: string) => new InputError(`${configPath}: ${field} ${why}`);
  const fullRegex = (field: string, pattern: string): RegExp => {
    try {
      // "u": an escape JavaScript does not know (Python's \A, \Z) is an error, not a letter.
      return new RegExp(`^(?:${pattern})$`, "u");
    } catch (e) {
      throw refuse(
        field,
        `${JSON.stringify(pattern)} is not a regex read here (${(e as Error).message})`,
      );
    }
  };
  const strings = (v: unknown): string[] | null =>
    Array.isArray(v) && v.every((x) => typeof x === "string") ? v : null;
  const listMatch = (list: readonly string[], key: string) =>
    list.some((entry) => key === entry || key.endsWith(`.${entry}`));

  const exclude = config.exclude_modules;
  let excluded: (key: string) => boolean = () => false;
  if (typeof exclude === "string" && exclude !== "") {
    const re = fullRegex("exclude_modules", exclude);
    excluded = (key) => re.test(key);
  } else if (isSet(exclude)) {
    const list = strings(exclude);
    if (!list) throw refuse("exclude_modules", "must be a list of module names or a regex");
    excluded = (key) => listMatch(list, key);
  }

  const target = config.target_modules;
  const layers = config.layers_to_transform;
  const layerIndexes = Number.isInteger(layers)
    ? [layers as number]
    : Array.isArray(layers) && layers.every(Number.isInteger)
      ? (layers as number[])
      : null;
  if (isSet(layers) && layerIndexes === null) {
    throw refuse("layers_to_transform", "must be a layer index or a list of them");
  }
  const usesLayers = layerIndexes !== null && layerIndexes.length > 0;
  const shown = `target_modules ${JSON.stringify(target)}`;
  let targeted: (key: string) => boolean;
  if (typeof target === "string") {
    if (usesLayers) throw refuse("layers_to_transform", "needs target_modules to be a list");
    if (target.toLowerCase() === "all-linear") {
      targeted = (key) => /_proj$/.test(key);
    } else {
      const re = fullRegex("target_modules", target);
      targeted = (key) => re.test(key);
    }
  } else {
    const list = strings(target);
    if (!list) {
      throw refuse(
        "target_modules",
        `is ${JSON.stringify(target ?? null)}: a list of module names, "all-linear" or a regex is expected`,
      );
    }
    let layerOf: (key: string) => number | null = () => null;
    if (usesLayers) {
      const pattern = config.layers_pattern ?? [];
      const patterns =
        typeof pattern === "string" ? (pattern === "" ? [] : [pattern]) : strings(pattern);
      if (!patterns) throw refuse("layers_pattern", "must be a name or a list of names");
      const res =
        patterns.length === 0
          ? [/^.*?\.[^.]*\.(\d+)\./u]
          : patterns.map((p) => {
              try {
                return new RegExp(`^.*?\\.${p}\\.(\\d+)\\.`, "u");
              } catch (e) {
                throw refuse(
                  "layers_pattern",
                  `${JSON.stringify(p)} is not a regex read here (${(e as Error).message})`,
                );
              }
            });
      layerOf = (key) => {
        for (const re of res) {
          const m = re.exec(key);
          if (m) return Number(m[1]);
        }
        return null;
      };
    }
    targeted = (key) => {
      if (list.includes(key)) return true;
      if (!listMatch(list, key)) return false;
      if (!usesLayers) return true;
      const layer = layerOf(key);
      return layer !== null && (layerIndexes as number[]).includes(layer);
    };
  }
  return (key) => {
    if (excluded(key)) return `exclude_modules ${JSON.stringify(exclude)} excludes it`;
    if (!targeted(key)) {
      return `${shown}${usesLayers ? ` with layers_to_transform ${JSON.stringify(layers)}` : ""} does not select it`;
    }
    return null;
  };
}

interface AdapterTensor {
  shape: number[];
  values: Float32Array;
}

/** The adapter's tensors as float32: adapter_model.safetensors, else adapter_model.bin. */
async function readAdapterTensors(
  dir: string,
): Promise<{ file: string; tensors: Map<string, AdapterTensor> }> {
  const tensors = new Map<string, AdapterTensor>();
  const safetensors = join(dir, "adapter_model.safetensors");
  if (existsSync(safetensors)) {
    for (const [name, t] of await readSafetensors(safetensors)) {
      if (!isFloat(t.dtype))
        throw new InputError(`${safetensors}: ${name} is ${t.dtype}, not a float tensor`);
      tensors.set(name, { shape: t.shape, values: toFloat32(t) });
    }
    return { file: safetensors, tensors };
  }
  // PEFT's save_pretrained(safe_serialization=False): a torch.save'd state dict.
  const bin = join(dir, "adapter_model.bin");
  if (!existsSync(bin)) {
    throw new InputError(`${dir}: no adapter_model.safetensors or adapter_model.bin`);
  }
  const { archive, value } = await loadTorchFile(bin);
  try {
    if (!(value instanceof Map)) {
      throw new InputError(`${bin}: expected a state dict, found ${describe(value)}`);
    }
    for (const [key, t] of value) {
      const name = String(key);
      if (!(t instanceof TorchTensor)) {
        throw new InputError(`${bin}: ${name} is ${describe(t)}, not a tensor`);
      }
      const dtype = t.validate(name);
      if (!isFloat(dtype)) throw new InputError(`${bin}: ${name} is ${dtype}, not a float tensor`);
      const bytes = castBytes(await t.read(name), dtype, "F32");
      // A copy: the bytes read may start anywhere in their buffer.
      tensors.set(name, {
        shape: [...t.shape],
        values: new Float32Array(new Uint8Array(bytes).buffer),
      });
    }
  } finally {
    await archive.close();
  }
  return { file: bin, tensors };
}

/** Reads a PEFT adapter folder (adapter_config.json, adapter_model.safetensors or .bin). */
export async function readLoraAdapter(dir: string): Promise<LoraAdapter> {
  const { rank: r, scaling, baseModel, refuses } = readLoraConfig(dir);
  const configPath = join(dir, "adapter_config.json");
  const { file, tensors } = await readAdapterTensors(dir);
  const halves = new Map<string, { A?: AdapterTensor; B?: AdapterTensor }>();
  for (const [name, tensor] of tensors) {
    const m = PEFT_NAME.exec(name);
    if (!m) {
      throw new InputError(
        /\.lora_embedding_[AB]\b/.test(name)
          ? `${file}: ${name}: LoRA on an embedding is not merged here (only on linear layers)`
          : `${file}: ${name} is not a LoRA tensor (base_model.model.<module>.lora_A/B.weight)`,
      );
    }
    const module = m[1] as string;
    const why = refuses(module);
    if (why !== null) {
      throw new InputError(
        `${file}: ${name} adapts ${module}, but ${why} (${configPath}); PEFT would not load it`,
      );
    }
    const key = `${module}.weight`;
    const entry = halves.get(key) ?? {};
    entry[m[2] as "A" | "B"] = tensor;
    halves.set(key, entry);
  }
  const pairs = new Map<string, LoraPair>();
  for (const [key, { A, B }] of halves) {
    if (!A || !B) throw new InputError(`${file}: ${key}: lora_${A ? "B" : "A"} is missing`);
    const [ra] = A.shape;
    const [, rb] = B.shape;
    if (A.shape.length !== 2 || B.shape.length !== 2 || ra !== r || rb !== r) {
      throw new InputError(
        `${file}: ${key}: lora_A [${A.shape}] and lora_B [${B.shape}] do not have rank r = ${r} (${configPath})`,
      );
    }
    pairs.set(key, { a: A.values, b: B.values, rank: r });
  }
  return { pairs, scaling, baseModel };
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
    if (!fits(t.shape, pair)) {
      throw new InputError(
        `${from}: ${name}: the adapter's A [${pair.rank}, ${pair.a.length / pair.rank}] and B [${pair.b.length / pair.rank}, ${pair.rank}] do not fit the base weight [${t.shape}]`,
      );
    }
  }
  const tensors = base.tensors.map((t) => {
    const pair = adapter.pairs.get(t.name);
    return pair ? mergedTensor(t, async () => pair, adapter.scaling) : t;
  });
  return { tensors, close: base.close };
}

/**
 * `base` + scaling · B A, in `base`'s dtype; the adapter is read when the tensor is, and must
 * fit it.
 */
export function mergedTensor(
  base: SourceTensor,
  readPair: () => Promise<LoraPair>,
  scaling: number,
): SourceTensor {
  return {
    ...base,
    read: async () => {
      const pair = await readPair();
      if (!fits(base.shape, pair)) {
        throw new InputError(
          `${base.name}: the adapter's A and B do not fit the base weight [${base.shape}]`,
        );
      }
      const [rows, cols] = base.shape as [number, number];
      const w = new Float32Array(rows * cols);
      Buffer.from(w.buffer).set(castBytes(await base.read(), base.dtype, "F32"));
      const r = pair.rank;
      for (let o = 0; o < rows; o++) {
        for (let i = 0; i < cols; i++) {
          let d = 0;
          for (let k = 0; k < r; k++) {
            d += (pair.b[o * r + k] as number) * (pair.a[k * cols + i] as number);
          }
          const at = o * cols + i;
          w[at] = (w[at] as number) + scaling * d;
        }
      }
      return castBytes(Buffer.from(w.buffer), "F32", base.dtype);
    },
  };
}

/** Whether A [r, in] and B [out, r] fit a weight [out, in]. */
function fits(shape: readonly number[], pair: LoraPair): boolean {
  if (shape.length !== 2) return false;
  const [out, inDim] = shape as [number, number];
  return pair.b.length === out * pair.rank && pair.a.length === inDim * pair.rank;
}

/**
 * Writes a PEFT adapter folder as PEFT's save_pretrained lays it out: `config` copied as it
 * is (adapter_config.json) and `tensors` in adapter_model.safetensors, as they are.
 */
export async function writeLoraFolder(
  dir: string,
  config: string,
  tensors: readonly SourceTensor[],
): Promise<void> {
  const file = join(dir, "adapter_model.safetensors");
  try {
    await mkdir(dir, { recursive: true });
    await copyFile(config, join(dir, "adapter_config.json"));
  } catch (e) {
    throw new InputError(
      `${dir}: cannot write the adapter (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`,
    );
  }
  await writeSafetensorsStreamed(file, tensors, async (i) => (tensors[i] as SourceTensor).read(), {
    format: "pt",
  });
}
