/**
 * Megatron-core GPT checkpoints (Qwen2/Qwen2.5, Llama) → Hugging Face tensors.
 * Each rank file holds its stage's layers numbered from 0 and its tensor-parallel slice:
 * replicated norms, column-parallel tensors split on dim 0 (embedding, output layer, the
 * fused QKV, the fused gate/up fc1), row-parallel ones on dim 1 (attention output, fc2).
 * The fused QKV is laid out per query group (its query heads, one key head, one value
 * head), each TP rank holding whole groups; fc1 is [gate; up] within each TP slice.
 */
import { InputError } from "../runtime/errors.js";
import { DTYPE_SIZE, type DType } from "../tensors/safetensors.js";
import type { MegatronLayout } from "./megatron-layout.js";
import type { ModelDims } from "./model-dims.js";
import type { Conversion, SourceTensor } from "./source.js";
import { concat, takeRows } from "./tensor-ops.js";
import { convertTorchFiles, describe } from "./torch-load.js";
import { TorchTensor } from "./torch-tensor.js";

/** How one Megatron tensor maps onto HF tensors. */
type Rule =
  | { kind: "replicated"; hf: string }
  | { kind: "column"; hf: string; vocab?: boolean }
  | { kind: "row"; hf: string }
  | { kind: "qkv"; suffix: "weight" | "bias" }
  | { kind: "glu"; suffix: "weight" | "bias" };

const LAYER_RULES: Record<string, Rule> = {
  "self_attention.linear_qkv.layer_norm_weight": {
    kind: "replicated",
    hf: "input_layernorm.weight",
  },
  "input_layernorm.weight": { kind: "replicated", hf: "input_layernorm.weight" },
  "self_attention.linear_qkv.weight": { kind: "qkv", suffix: "weight" },
  "self_attention.linear_qkv.bias": { kind: "qkv", suffix: "bias" },
  "self_attention.linear_proj.weight": { kind: "row", hf: "self_attn.o_proj.weight" },
  "self_attention.linear_proj.bias": { kind: "replicated", hf: "self_attn.o_proj.bias" },
  "self_attention.q_layernorm.weight": { kind: "replicated", hf: "self_attn.q_norm.weight" },
  "self_attention.k_layernorm.weight": { kind: "replicated", hf: "self_attn.k_norm.weight" },
  "mlp.linear_fc1.layer_norm_weight": { kind: "replicated", hf: "post_attention_layernorm.weight" },
  "pre_mlp_layernorm.weight": { kind: "replicated", hf: "post_attention_layernorm.weight" },
  "mlp.linear_fc1.weight": { kind: "glu", suffix: "weight" },
  "mlp.linear_fc1.bias": { kind: "glu", suffix: "bias" },
  "mlp.linear_fc2.weight": { kind: "row", hf: "mlp.down_proj.weight" },
  "mlp.linear_fc2.bias": { kind: "replicated", hf: "mlp.down_proj.bias" },
};

const TOP_RULES: Record<string, Rule> = {
  "embedding.word_embeddings.weight": {
    kind: "column",
    hf: "model.embed_tokens.weight",
    vocab: true,
  },
  "output_layer.weight": { kind: "column", hf: "lm_head.weight", vocab: true },
  "decoder.final_layernorm.weight": { kind: "replicated", hf: "model.norm.weight" },
};

const LAYER_NAME = /^decoder\.layers\.(\d+)\.(.+)$/;

/** One model chunk of one pipeline stage, across its tensor-parallel ranks. */
interface Unit {
  label: string;
  files: string[];
  dicts: Map<unknown, unknown>[];
  layerOffset: number;
}

/** A Megatron tensor across the TP ranks of its unit. */
interface Shards {
  name: string;
  files: string[];
  parts: TorchTensor[];
  dtype: DType;
}

export function megatronToHf(layout: MegatronLayout, dims: ModelDims): Promise<Conversion> {
  return convertTorchFiles(layout.files.flat(), (values) => {
    // [stage][tp][chunk], from the files in stage-major order
    const chunks = layout.files.map((row, p) =>
      row.map((file, t) => modelChunks(values[p * layout.tp + t], file)),
    );
    const { units, layers } = orderUnits(layout, chunks);
    const tensors = planTensors(units, dims);
    if (layers !== dims.layers) {
      throw new InputError(
        `${layout.iterDir}: the checkpoint has ${layers} decoder layers, config.json says num_hidden_layers ${dims.layers}`,
      );
    }
    return tensors;
  });
}

/** The model state dicts of a rank file: `model`, or `model0`, `model1`, ... (virtual pipeline). */
function modelChunks(value: unknown, file: string): Map<unknown, unknown>[] {
  if (!(value instanceof Map))
    throw new InputError(`${file}: expected a dict, found ${describe(value)}`);
  const names = value.has("model")
    ? ["model"]
    : [...value.keys()]
        .filter((k): k is string => typeof k === "string" && /^model\d+$/.test(k))
        .sort((a, b) => Number(a.slice(5)) - Number(b.slice(5)));
  if (names.length === 0) {
    const keys = [...value.keys()].map(String).join(", ");
    throw new InputError(`${file}: no "model" entry (keys: ${keys})`);
  }
  return names.map((n) => {
    const dict = value.get(n);
    if (!(dict instanceof Map)) throw new InputError(`${file}: "${n}" is not a state dict`);
    return dict;
  });
}

/** Units in global layer order (chunk-major, then stage), each given its first global layer. */
function orderUnits(
  layout: MegatronLayout,
  chunks: Map<unknown, unknown>[][][],
): { units: Unit[]; layers: number } {
  const vpp = chunks[0]?.[0]?.length ?? 0;
  const units: Unit[] = [];
  let offset = 0;
  for (let c = 0; c < vpp; c++) {
    for (let p = 0; p < layout.pp; p++) {
      const files = layout.files[p] as string[];
      const dicts = files.map((f, t) => {
        const d = chunks[p]?.[t]?.[c];
        if (!d)
          throw new InputError(
            `${f}: has ${chunks[p]?.[t]?.length} model chunks, rank 0 of stage 0 has ${vpp}`,
          );
        return d;
      });
      const label = vpp > 1 ? `stage ${p} chunk ${c}` : `stage ${p}`;
      const indices = new Set<number>();
      for (const key of (dicts[0] as Map<unknown, unknown>).keys()) {
        const m = LAYER_NAME.exec(String(key));
        if (m) indices.add(Number(m[1]));
      }
      const count = indices.size;
      for (let i = 0; i < count; i++) {
        if (!indices.has(i))
          throw new InputError(`${files[0]}: ${label} has no decoder.layers.${i}.*`);
      }
      units.push({ label, files, dicts, layerOffset: offset });
      offset += count;
    }
  }
  return { units, layers: offset };
}

function planTensors(units: Unit[], dims: ModelDims): SourceTensor[] {
  const out: SourceTensor[] = [];
  const cache = oneEntryCache();
  let embedding: Shards | undefined;
  let output: Shards | undefined;
  for (const unit of units) {
    const first = unit.dicts[0] as Map<unknown, unknown>;
    for (const [t, dict] of unit.dicts.entries()) {
      for (const key of dict.keys()) {
        if (!first.has(key)) {
          throw new InputError(`${unit.files[t]}: ${String(key)} is not on tensor-parallel rank 0`);
        }
      }
    }
    for (const key of first.keys()) {
      const name = String(key);
      if (name.endsWith("._extra_state")) continue; // Transformer Engine's FP8 metadata
      const m = LAYER_NAME.exec(name);
      const rule = m ? LAYER_RULES[m[2] as string] : TOP_RULES[name];
      if (!rule) throw new InputError(`${unit.files[0]}: unknown parameter name ${name}`);
      const shards = collect(unit, name);
      const prefix = m ? `model.layers.${unit.layerOffset + Number(m[1])}.` : "";
      if (name === "embedding.word_embeddings.weight") embedding = shards;
      if (name === "output_layer.weight") {
        output = shards;
        if (dims.tied) continue; // a copy of the embedding kept on the last stage
      }
      out.push(...expand(rule, prefix, shards, dims, cache));
    }
  }
  if (!embedding)
    throw new InputError(`${units[0]?.files[0]}: no embedding.word_embeddings.weight`);
  if (!dims.tied && !output) {
    throw new InputError(
      `${units.at(-1)?.files[0]}: no output_layer.weight, but config.json has tie_word_embeddings false`,
    );
  }
  if (dims.tied && output) {
    // Megatron keeps a copy of a tied embedding on the last stage; a copy that differs
    // means the model was trained untied and the config given does not belong to it.
    const i = out.findIndex((t) => t.name === "model.embed_tokens.weight");
    const embed = out[i] as SourceTensor;
    const [copy] = expand(TOP_RULES["output_layer.weight"] as Rule, "", output, dims, cache);
    const file = output.files[0];
    out[i] = {
      ...embed,
      read: async () => {
        const bytes = await embed.read();
        if (
          !copy ||
          copy.shape.join() !== embed.shape.join() ||
          !(await copy.read()).equals(bytes)
        ) {
          throw new InputError(
            `${file}: output_layer.weight differs from the embedding, but config.json has ` +
              "tie_word_embeddings true: pass the folder of the untied model as --hf-base",
          );
        }
        return bytes;
      },
    };
  }
  return out;
}

/** The tensor on every TP rank of the unit, with dtype and rank checks. */
function collect(unit: Unit, name: string): Shards {
  const parts = unit.dicts.map((d, t) => {
    const v = d.get(name);
    if (!(v instanceof TorchTensor)) {
      throw new InputError(`${unit.files[t]}: ${name} is ${describe(v)}, not a tensor`);
    }
    return v;
  });
  const dtype = (parts[0] as TorchTensor).validate(name);
  parts.forEach((p, t) => {
    if (p.validate(name) !== dtype) {
      throw new InputError(`${unit.files[t]}: ${name} is ${p.dtype}, rank 0 has ${dtype}`);
    }
  });
  return { name, files: unit.files, parts, dtype };
}

function expand(
  rule: Rule,
  prefix: string,
  s: Shards,
  dims: ModelDims,
  cache: Cache,
): SourceTensor[] {
  const size = DTYPE_SIZE[s.dtype];
  const first = s.parts[0] as TorchTensor;
  const rest = first.shape.slice(1);
  const rowBytes = rest.reduce((a, b) => a * b, 1) * size;
  const sameExcept = (dim: number) => {
    s.parts.forEach((p, t) => {
      const ok =
        p.shape.length === first.shape.length &&
        p.shape.every((d, i) => i === dim || d === first.shape[i]);
      if (!ok) {
        throw new InputError(
          `${s.files[t]}: ${s.name} has shape [${p.shape.join(", ")}], rank 0 has [${first.shape.join(", ")}]`,
        );
      }
    });
  };
  const total = (dim: number) => s.parts.reduce((a, p) => a + (p.shape[dim] as number), 0);
  const readParts = () => Promise.all(s.parts.map((p) => p.read(s.name)));
  const merged = (dim: number) =>
    cache(s, async () => {
      const bytes = await readParts();
      return concat(
        bytes.map((b, i) => ({ bytes: b, shape: (s.parts[i] as TorchTensor).shape })),
        dim,
        size,
      ).bytes;
    });
  const tensor = (name: string, shape: number[], read: () => Promise<Buffer>): SourceTensor => ({
    name: prefix + name,
    dtype: s.dtype,
    shape,
    read,
  });

  switch (rule.kind) {
    case "replicated":
      sameExcept(-1);
      return [
        tensor(rule.hf, [...first.shape], async () => {
          const bytes = await readParts();
          bytes.forEach((b, t) => {
            if (!b.equals(bytes[0] as Buffer)) {
              throw new InputError(
                `${s.files[t]}: ${s.name} differs from tensor-parallel rank 0, but it must be replicated`,
              );
            }
          });
          return bytes[0] as Buffer;
        }),
      ];
    case "row":
      sameExcept(1);
      return [
        tensor(rule.hf, [first.shape[0] as number, total(1), ...first.shape.slice(2)], () =>
          merged(1),
        ),
      ];
    case "column": {
      sameExcept(0);
      let rows = total(0);
      if (rule.vocab) {
        if (rows < dims.vocabSize) {
          throw new InputError(
            `${s.files[0]}: ${s.name} has ${rows} rows over all ranks, fewer than vocab_size ${dims.vocabSize}`,
          );
        }
        rows = dims.vocabSize; // Megatron pads the vocabulary; the padding rows are dropped
      }
      const all = total(0);
      return [
        tensor(rule.hf, [rows, ...rest], async () =>
          rows === all
            ? merged(0)
            : takeRows(await merged(0), rowBytes, [{ start: 0, count: rows }]),
        ),
      ];
    }
    case "qkv": {
      sameExcept(0);
      const { heads, kvHeads, headDim } = dims;
      const perGroup = heads / kvHeads;
      const want = kvHeads * (perGroup + 2) * headDim;
      if (total(0) !== want || kvHeads % s.parts.length !== 0) {
        throw new InputError(
          `${s.files[0]}: ${s.name} has ${total(0)} rows over ${s.parts.length} ranks; config.json implies ` +
            `${kvHeads} query groups × (${perGroup} + 2) heads × ${headDim} = ${want}, in whole groups per rank`,
        );
      }
      const ranges = (skip: number, heads: number) =>
        Array.from({ length: kvHeads }, (_, g) => ({
          start: (g * (perGroup + 2) + skip) * headDim,
          count: heads * headDim,
        }));
      const part = (name: string, skip: number, n: number) =>
        tensor(`self_attn.${name}.${rule.suffix}`, [kvHeads * n * headDim, ...rest], async () =>
          takeRows(await merged(0), rowBytes, ranges(skip, n)),
        );
      return [
        part("q_proj", 0, perGroup),
        part("k_proj", perGroup, 1),
        part("v_proj", perGroup + 1, 1),
      ];
    }
    case "glu": {
      sameExcept(0);
      const even = s.parts.every((p) => p.shape[0] === first.shape[0]);
      if (total(0) !== 2 * dims.intermediateSize || !even || (first.shape[0] as number) % 2 !== 0) {
        throw new InputError(
          `${s.files[0]}: ${s.name} has ${total(0)} rows over ${s.parts.length} ranks; ` +
            `config.json implies 2 × intermediate_size ${dims.intermediateSize}, split evenly`,
        );
      }
      // Each rank's slice is [gate rows; up rows] of its share of the intermediate size.
      const half = (first.shape[0] as number) / 2;
      const ranges = (skip: number) =>
        s.parts.map((_, t) => ({ start: (2 * t + skip) * half, count: half }));
      const part = (name: string, skip: number) =>
        tensor(`mlp.${name}.${rule.suffix}`, [dims.intermediateSize, ...rest], async () =>
          takeRows(await merged(0), rowBytes, ranges(skip)),
        );
      return [part("gate_proj", 0), part("up_proj", 1)];
    }
  }
}

type Cache = (key: Shards, make: () => Promise<Buffer>) => Promise<Buffer>;

/** The fused tensors feed 2–3 HF tensors written one after another: keep the last merge. */
function oneEntryCache(): Cache {
  let key: Shards | undefined;
  let value: Promise<Buffer> | undefined;
  return (k, make) => {
    if (k !== key || !value) {
      key = k;
      value = make();
    }
    return value;
  };
}
